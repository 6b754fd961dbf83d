"""The math benchmarks of the shared data directory, each row with its gold answer.

    rows = load_benchmark("math500")     # or a path to a jsonl/json/parquet file
    rows[0]["id"], rows[0]["problem"], rows[0]["answer"]

Every row keeps its original columns and gains ``id``, ``problem`` and
``answer`` (the gold answer as a string). Where the gold sits inside a
solution (Minerva's last ``\\boxed{}``, GSM8K's ``#### N``), it is taken out,
and the original text stays under ``solution``.

The shared directory is ``$PT_SHARED_DIR``, else ``shared/`` beside (or
inside) the repository checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import iter_rows
from pt_eval.extract import gold_answer, last_boxed

BENCHMARKS = {
    "math500": "math_oai/test.jsonl",
    "minerva_math": "minerva_math/test.jsonl",
    "olympiadbench": "olympiadbench/test.json",
    "aime24": "aime24/test.jsonl",
    "amc23": "amc23/test.jsonl",
    "gsm8k": "gsm8k/test.jsonl",
}
ALIASES = {"math_oai": "math500", "math-500": "math500", "minerva": "minerva_math"}


def shared_dir() -> Path:
    """The shared data directory (benchmarks/, predictions/)."""
    env = os.environ.get("PT_SHARED_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[4]
    for candidate in (repo.parent / "shared", repo / "shared"):
        if (candidate / "benchmarks").is_dir():
            return candidate
    raise InputError(
        f"no shared data directory beside or inside {repo}",
        hint="set PT_SHARED_DIR to the directory that holds benchmarks/",
    )


def benchmark_path(name: str) -> Path:
    key = ALIASES.get(name, name)
    if key not in BENCHMARKS:
        raise InputError(
            f"unknown benchmark {name!r}",
            hint=f"use one of {', '.join(BENCHMARKS)} or a path to a jsonl/json/parquet file",
        )
    return shared_dir() / "benchmarks" / BENCHMARKS[key]


def load_benchmark(name_or_path: str | os.PathLike) -> list[dict]:
    """Rows of a benchmark with ``id``, ``problem`` and ``answer`` (a string) filled in."""
    path = Path(name_or_path)
    if not path.exists() and str(name_or_path) in {*BENCHMARKS, *ALIASES}:
        path = benchmark_path(str(name_or_path))
    elif not path.exists():
        benchmark_path(str(name_or_path))  # raises the unknown-benchmark error
    rows = []
    for index, row in enumerate(iter_rows(path)):
        rows.append(normalize_row(row, index, source=f"{path}:{index + 1}"))
    return rows


def normalize_row(row: dict, index: int, *, source: str) -> dict:
    """One benchmark row in the common shape; the recognised layouts are those of the
    DFT / Qwen2.5-Math evaluation data."""
    out = dict(row)
    problem = row.get("problem", row.get("question"))
    if problem is None:
        raise InputError(f"{source}: no 'problem' or 'question' column")
    out["problem"] = problem
    out["id"] = next((row[k] for k in ("id", "unique_id", "idx") if row.get(k) is not None), index)
    answer = _gold(row)
    if answer is None:
        raise InputError(
            f"{source}: no gold answer (looked at answer, final_answer, and \\boxed{{}} in solution)"
        )
    if "answer" in row and isinstance(row["answer"], str) and "####" in row["answer"]:
        out.setdefault("solution", row["answer"])  # GSM8K keeps its worked answer
    out["answer"] = answer
    return out


def _gold(row: dict) -> str | None:
    if row.get("final_answer") is not None:  # OlympiadBench: a list of strings
        return gold_answer(row["final_answer"])
    if row.get("answer") is not None:
        return gold_answer(row["answer"])
    solution = row.get("solution")
    if isinstance(solution, list):
        solution = solution[-1] if solution else None
    if isinstance(solution, str):
        return last_boxed(solution)
    return None
