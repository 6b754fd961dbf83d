"""Generated datasets for offline runs: problems a tiny model can learn on a CPU.

``arithmetic``: additions and subtractions of two 2-digit numbers, as MATH-like
rows ``{id, problem, solution, answer}``. The solution works column by column,
the way the problem is done by hand, and ends in ``\\boxed{answer}``:

    What is 87 + 45?
    Ones: 7+5=12, carry 1. Tens: 8+4+1=13. The final answer is \\boxed{132}.

Each step is a one-digit fact next to the digits it uses, which a small model
learns in minutes; asked for the whole sum in one token run, it would need far
longer. Train and test problems are disjoint. Feed them to ``pt-data build`` with
transform ``math`` (SFT conversations) or ``math_prompts`` (prompts with gold
answers for rollout and evaluation).
"""

from __future__ import annotations

import random
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import atomic_path, write_rows

GENERATORS = ("arithmetic",)


def arithmetic_problems() -> list[tuple[int, str, int]]:
    """Every distinct problem: (a, op, b) with 2-digit a and b; subtraction only when a >= b."""
    problems = []
    for a in range(10, 100):
        for b in range(10, 100):
            problems.append((a, "+", b))
            if a >= b:
                problems.append((a, "-", b))
    return problems


def column_solution(a: int, op: str, b: int) -> tuple[str, int]:
    """The worked, column-by-column solution of ``a op b`` and its value."""
    (a_tens, a_ones), (b_tens, b_ones) = divmod(a, 10), divmod(b, 10)
    if op == "+":
        ones = a_ones + b_ones
        carry = ones // 10
        tens = a_tens + b_tens + carry
        value = a + b
        steps = f"Ones: {a_ones}+{b_ones}={ones}, carry {carry}. Tens: {a_tens}+{b_tens}+{carry}={tens}."
    elif op == "-":
        borrow = int(a_ones < b_ones)
        top = a_ones + 10 * borrow
        tens = a_tens - b_tens - borrow
        value = a - b
        steps = f"Ones: {top}-{b_ones}={top - b_ones}, borrow {borrow}. Tens: {a_tens}-{b_tens}-{borrow}={tens}."
    else:
        raise ValueError(f"unknown operator {op!r}")
    return f"{steps} The final answer is \\boxed{{{value}}}.", value


def arithmetic_row(a: int, op: str, b: int, row_id: str) -> dict:
    solution, value = column_solution(a, op, b)
    return {
        "id": row_id,
        "problem": f"What is {a} {op} {b}?",
        "solution": solution,
        "answer": str(value),
    }


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
