"""Grade a prediction file: any jsonl/json/parquet with a response and a gold answer per row.

    summary = grade_file("rollouts.jsonl", "rollouts.grades.jsonl", group_keys=["level"])

A row's prediction may be one string or a list of strings (k samples of one
problem); rows that share an id are samples of the same problem too. The
grades file is every input row plus ``extracted``, ``correct`` and
``grade_status`` (lists when the prediction is a list).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import iter_rows, split_path, write_rows
from pt_core.log import get_logger, progress
from pt_eval.extract import gold_answer
from pt_eval.metrics import Problem, summarize, summarize_groups
from pt_eval.worker import DEFAULT_TIMEOUT, GradingPool

log = get_logger(__name__)

PRED_KEYS = ("completion", "prediction", "response", "code")
GOLD_KEYS = ("answer", "gold", "gt", "final_answer")
ID_KEYS = ("id", "idx", "unique_id", "problem_id", "question_id")


@dataclass
class GradeOptions:
    pred_key: str | None = None
    gold_key: str | None = None
    id_key: str | None = None
    group_keys: list[str] = field(default_factory=list)
    workers: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    last_number: bool = True


def pick_key(
    row: dict, given: str | None, candidates: tuple[str, ...], what: str, option: str, source: str
) -> str:
    """The column to read ``what`` from: the one given, or the first default present."""
    if given is not None:
        if given not in row:
            raise InputError(
                f"{source}: no column {given!r} for the {what}; the rows have: "
                f"{', '.join(map(repr, row))}",
                hint=f"pass {option} with one of those columns",
            )
        return given
    for key in candidates:
        if key in row:
            return key
    raise InputError(
        f"{source}: no {what} column; looked for {', '.join(map(repr, candidates))}, "
        f"the rows have: {', '.join(map(repr, row))}",
        hint=f"name the column with {option}",
    )


def grade_rows(
    rows: list[dict],
    options: GradeOptions,
    *,
    source: str = "<rows>",
    pool: GradingPool | None = None,
) -> tuple[list[dict], dict]:
    """Grade rows in memory; return the graded rows and the summary."""
    if not rows:
        raise InputError(f"{source}: no rows to grade")
    first = rows[0]
    pred_key = pick_key(first, options.pred_key, PRED_KEYS, "prediction", "--pred-key", source)
    gold_key = pick_key(first, options.gold_key, GOLD_KEYS, "gold answer", "--gold-key", source)
    id_key = options.id_key
    if id_key is not None:
        pick_key(first, id_key, (), "problem id", "--id-key", source)
    else:
        id_key = next((k for k in ID_KEYS if k in first), None)
    for key in options.group_keys:
        pick_key(first, key, (), "group", "--group-key", source)

    items: list[tuple[object, str | None]] = []
    spans: list[tuple[int, int, bool]] = []  # per row: first item, item count, was a list
    for number, row in enumerate(rows, start=1):
        for key in (pred_key, gold_key):
            if key not in row:
                raise InputError(f"{source}: row {number} has no column {key!r}")
        samples, is_list = prediction_samples(row[pred_key])
        gold = gold_answer(row[gold_key])
        spans.append((len(items), len(samples), is_list))
        items.extend((sample, gold) for sample in samples)

    own_pool = pool is None
    pool = pool or GradingPool(options.workers, options.timeout, last_number=options.last_number)
    try:
        with progress() as bar:
            task = bar.add_task("grading", total=len(items))
            results = pool.grade(items, progress=lambda n: bar.advance(task, n))
    finally:
        if own_pool:
            pool.close()

    graded: list[dict] = []
    problems: dict[object, Problem] = {}
    for index, (row, (start, count, is_list)) in enumerate(zip(rows, spans, strict=True)):
        mine = results[start : start + count]
        out = dict(row)
        if is_list:
            out["extracted"] = [r["extracted"] for r in mine]
            out["correct"] = [bool(r["correct"]) for r in mine]
            out["grade_status"] = [r["status"] for r in mine]
        else:
            out["extracted"], out["correct"], out["grade_status"] = (
                mine[0]["extracted"], bool(mine[0]["correct"]), mine[0]["status"],
            )  # fmt: skip
        graded.append(out)
        problem_id = _hashable(row.get(id_key)) if id_key else index
        problem = problems.get(problem_id)
        if problem is None:
            problem = problems[problem_id] = Problem(
                problem_id, {k: row.get(k) for k in options.group_keys}
            )
        for r in mine:
            problem.correct.append(bool(r["correct"]))
            problem.keys.append(r["key"] if r["status"] == "ok" else None)
            problem.statuses.append(r["status"])
    _log_problems(results)

    summary = summarize(list(problems.values()))
    summary.update(pred_key=pred_key, gold_key=gold_key, id_key=id_key)
    if options.group_keys:
        summary["groups"] = {
            key: summarize_groups(list(problems.values()), key) for key in options.group_keys
        }
    return graded, summary


def prediction_samples(value) -> tuple[list, bool]:
    """The responses in one prediction cell, and whether the cell holds several samples.

    A string is one response; a list of strings is k samples; a chat message
    (``{"role", "content"}``) or a whole conversation counts as its last message.
    """
    if isinstance(value, dict):
        return [value.get("content")], False
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, dict) and "role" in v for v in value):
            return [value[-1].get("content")], False
        return [v.get("content") if isinstance(v, dict) else v for v in value], True
    return [value], False


def _hashable(value):
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


def _log_problems(results: list[dict]) -> None:
    bad = [r for r in results if r["status"] in ("timeout", "error")]
    if bad:
        shown = "; ".join(sorted({r["message"] or r["status"] for r in bad})[:5])
        log.warning("%d sample(s) could not be graded (%s)", len(bad), shown)


def read_input_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a jsonl/json/parquet file, a directory of shards, or a dataset's split."""
    return list(iter_rows(split_path(path)))


def default_output(path: Path) -> Path:
    base = path.parent / path.name if path.is_dir() else path.with_suffix("")
    return base.with_name(base.name + ".grades.jsonl")


def grade_file(
    path: str | os.PathLike,
    out: str | os.PathLike | None = None,
    options: GradeOptions | None = None,
) -> tuple[Path, dict]:
    """Grade the rows in ``path`` and write the grades file; return its path and the summary."""
    options = options or GradeOptions()
    path = Path(path)
    out_path = Path(out) if out is not None else default_output(path)
    if not os.access(out_path.parent if out_path.parent.exists() else Path.cwd(), os.W_OK):
        raise InputError(
            f"{out_path.parent}: cannot write the grades file there",
            hint="pass --out with a writable path",
        )
    pool = GradingPool(options.workers, options.timeout, last_number=options.last_number)
    try:
        pool.start()  # the workers warm up while the rows are read
        rows = read_input_rows(path)
        graded, summary = grade_rows(rows, options, source=str(path), pool=pool)
    finally:
        pool.close()
    write_rows(out_path, graded)
    summary["input"] = str(path.resolve())
    return out_path, summary


def summary_table_rows(summary: dict) -> Iterable[tuple[str, str]]:
    yield "problems", str(summary["problems"])
    yield "samples", str(summary["samples"])
    yield "accuracy", f"{summary['accuracy']:.4f}"
    for k, value in summary.get("pass@k", {}).items():
        yield f"pass@{k}", f"{value:.4f}"
    if "maj@n" in summary:
        yield f"maj@{summary['n']}", f"{summary['maj@n']:.4f}"
    yield "no answer", str(summary["no_answer"])
    yield "timeouts", str(summary["timeouts"])
    yield "errors", str(summary["errors"])
