"""Generated datasets for offline runs: problems a tiny model can learn on a CPU.

``arithmetic``: 2-digit additions and subtractions and small multiplications, as
MATH-like rows ``{id, problem, solution, answer}`` whose solution is a one-line
worked answer ending in ``\\boxed{answer}``. Train and test problems are disjoint.
Feed them to ``pt-data build`` with transform ``math`` (SFT conversations) or
``math_prompts`` (prompts with gold answers for rollout and evaluation).
"""

from __future__ import annotations

import random
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import atomic_path, write_rows

GENERATORS = ("arithmetic",)


def arithmetic_problems() -> list[tuple[int, str, int]]:
    """Every distinct problem: (a, op, b) with a 2-digit +/- (no negative results) or a
    small product (2..12 times 2..19)."""
    problems = []
    for a in range(10, 100):
        for b in range(10, 100):
            problems.append((a, "+", b))
            if a >= b:
                problems.append((a, "-", b))
    for a in range(2, 13):
        for b in range(2, 20):
            problems.append((a, "*", b))
    return problems


def arithmetic_row(a: int, op: str, b: int, row_id: str) -> dict:
    value = a + b if op == "+" else a - b if op == "-" else a * b
    problem = f"What is {a} {op} {b}?"
    solution = f"{a} {op} {b} = {value}. The final answer is \\boxed{{{value}}}."
    return {"id": row_id, "problem": problem, "solution": solution, "answer": str(value)}


def synth_arithmetic(n: int, *, n_test: int | None = None, seed: int = 0) -> dict[str, list[dict]]:
    """``n`` train rows and ``n_test`` (default ``min(500, max(50, n // 10))``) test rows,
    no problem in both."""
    if n_test is None:
        n_test = min(500, max(50, n // 10))
    space = arithmetic_problems()
    if n < 1 or n_test < 0 or n + n_test > len(space):
        raise InputError(
            f"asked for {n} train + {n_test} test problems; there are {len(space)} distinct "
            "arithmetic problems",
            hint=f"use --n between 1 and {len(space) - n_test}",
        )
    rng = random.Random(seed)
    chosen = rng.sample(space, n + n_test)
    test = [arithmetic_row(*p, f"arith-test-{i}") for i, p in enumerate(chosen[:n_test])]
    train = [arithmetic_row(*p, f"arith-train-{i}") for i, p in enumerate(chosen[n_test:])]
    return {"train": train, "test": test}


def write_synth(kind: str, n: int, out: str | Path, *, seed: int = 0, n_test: int | None = None):
    """Write ``out/train.jsonl`` and ``out/test.jsonl``; return ``{split: rows}``."""
    if kind not in GENERATORS:
        raise InputError(f"unknown generator {kind!r}; known: {', '.join(GENERATORS)}")
    splits = synth_arithmetic(n, n_test=n_test, seed=seed)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for split, rows in splits.items():
            write_rows(tmp / f"{split}.jsonl", rows)
    return {split: len(rows) for split, rows in splits.items()}
