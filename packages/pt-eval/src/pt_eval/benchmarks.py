"""The math benchmarks, each row with its prompt and gold answer.

    rows = load_benchmark("math500")     # or a path to a jsonl/json/parquet/csv file
    rows[0]["id"], rows[0]["problem"], rows[0]["answer"]

Every row keeps its original columns and gains ``id``, ``problem`` (the prompt: the
``prompt``, ``problem``, ``question`` or ``messages`` column, or the one named) and
``answer`` (the gold answer as a string). Where the gold sits inside a solution
(Minerva's last ``\\boxed{}``, GSM8K's ``#### N``), it is taken out, and the original
text stays under ``solution``.

A benchmark name is looked up in the first of these that is set:

1. the ``benchmarks_dir`` argument (``pt-eval run --benchmarks-dir DIR``);
2. the ``PT_BENCHMARKS`` environment variable (a directory holding ``math_oai/``, ...);
3. ``$PT_SHARED_DIR/benchmarks``;
4. ``shared/benchmarks`` beside (or inside) the repository checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

from pt_core.errors import InputError
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
PROMPT_KEYS = ("prompt", "problem", "question", "messages")  # as pt-rollout reads them


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


def benchmarks_dir(explicit: str | os.PathLike | None = None) -> Path:
    """The directory benchmark names are read from (the order is in the module docstring)."""
    for given, what in ((explicit, "--benchmarks-dir"), (os.environ.get("PT_BENCHMARKS"),
                                                          "PT_BENCHMARKS")):  # fmt: skip
        if given:
            path = Path(given)
            if not path.is_dir():
                raise InputError(
                    f"{what}: {path} is not a directory",
                    hint="point it at the directory that holds math_oai/, gsm8k/, ...",
                )
            return path
    try:
        return shared_dir() / "benchmarks"
    except InputError:
        raise InputError(
            "no benchmark directory: none was given and no shared/benchmarks was found",
            hint="pass --benchmarks-dir DIR or set PT_BENCHMARKS=DIR (the directory that "
            "holds math_oai/, gsm8k/, ...), or give the benchmark as a file",
        ) from None


def benchmark_path(name: str, directory: str | os.PathLike | None = None) -> Path:
    key = ALIASES.get(name, name)
    if key not in BENCHMARKS:
        raise InputError(
            f"unknown benchmark {name!r}",
            hint=f"use one of {', '.join(BENCHMARKS)} or a path to a jsonl/json/parquet file",
        )
    path = benchmarks_dir(directory) / BENCHMARKS[key]
    if not path.exists():
        raise InputError(
            f"benchmark {name!r}: {path} does not exist",
            hint="check --benchmarks-dir / PT_BENCHMARKS: it must hold " + BENCHMARKS[key],
        )
    return path


def load_benchmark(
    name_or_path: str | os.PathLike,
    *,
    benchmarks_dir: str | os.PathLike | None = None,
    prompt_key: str | None = None,
) -> list[dict]:
    """Rows of a benchmark with ``id``, ``problem`` and ``answer`` (a string) filled in."""
    from pt_eval.grade import read_input_rows

    path = Path(name_or_path)
    if not path.exists():
        path = benchmark_path(str(name_or_path), benchmarks_dir)
    raw = read_input_rows(path)
    if not raw:
        raise InputError(f"{path}: the benchmark file has no rows")
    return [
        normalize_row(row, index, source=f"{path}: row {index + 1}", prompt_key=prompt_key)
        for index, row in enumerate(raw)
    ]


def normalize_row(row: dict, index: int, *, source: str, prompt_key: str | None = None) -> dict:
    """One benchmark row in the common shape; the recognised layouts are those of the
    DFT / Qwen2.5-Math evaluation data."""
    out = dict(row)
    if prompt_key is not None:
        if prompt_key not in row:
            raise InputError(
                f"{source}: no column {prompt_key!r}; the row has: {', '.join(map(repr, row))}",
                hint="pass --prompt-key with the column that holds the problem",
            )
        key = prompt_key
    else:
        key = next((k for k in PROMPT_KEYS if row.get(k) is not None), None)
        if key is None:
            raise InputError(
                f"{source}: no prompt column ({', '.join(PROMPT_KEYS)}); "
                f"the row has: {', '.join(map(repr, row))}",
                hint="name the column with --prompt-key",
            )
    problem = row[key]
    if not isinstance(problem, str | list):
        raise InputError(
            f"{source}: {key!r} is a {type(problem).__name__}; expected a string or messages"
        )
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
