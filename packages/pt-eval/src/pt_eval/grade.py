"""Grade a prediction file: any jsonl/json/parquet/csv with a response and a gold answer per row.

    path, summary = grade_file("rollouts.jsonl", "rollouts.grades.jsonl",
                               GradeOptions(group_keys=["level"]))

A row's prediction may be one string or a list of strings (k samples of one problem;
lm-evaluation-harness's ``resps``, a list of lists, is flattened); rows that share an id
are samples of the same problem too. Column names may be dotted paths into nested
objects (``doc.answer``). The grades file is every input row plus ``extracted``,
``correct`` and ``grade_status`` (lists when the prediction is a list).
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pt_core.errors import InputError, disk_full_as_error
from pt_core.files import (
    atomic_path,
    read_rows,
    split_path,
    write_rows,
)
from pt_core.log import get_logger, progress
from pt_eval.extract import gold_answer
from pt_eval.item import CORRECT_KEY
from pt_eval.metrics import Problem, summarize, summarize_groups
from pt_eval.policy import Policy
from pt_eval.worker import DEFAULT_TIMEOUT, GradingPool

log = get_logger(__name__)

PRED_KEYS = ("completion", "prediction", "response", "code", "filtered_resps", "resps")
GOLD_KEYS = ("answer", "gold", "gt", "final_answer", "target")
ID_KEYS = ("id", "idx", "unique_id", "problem_id", "question_id", "doc_id")
FINISH_KEY = "finish_reason"
# the other spelling (Anthropic, TGI, some vLLM dumps): "max_tokens"/"length" is cut off
STOP_KEY = "stop_reason"
# lm-evaluation-harness writes one row per (document, filter); a filter that finds nothing
# leaves this in filtered_resps
HARNESS_FILTER_KEY = "filter"
HARNESS_NO_ANSWER = "[invalid]"
TRUNCATED_REASONS = {"length", "max_tokens", "max_length", "model_length", "MAX_TOKENS"}
OUTPUT_SUFFIXES = (".jsonl", ".parquet", ".csv")


@dataclass
class GradeOptions:
    pred_key: str | None = None
    gold_key: str | None = None
    id_key: str | None = None
    group_keys: list[str] = field(default_factory=list)
    workers: int | None = None
    timeout: float = DEFAULT_TIMEOUT
    numeric_tolerance: float | None = None
    last_number: bool | None = None  # None: only for responses that finished
    filter: str | None = None  # lm-evaluation-harness files: grade only this filter's rows

    @property
    def policy(self) -> Policy:
        return Policy(numeric_tolerance=self.numeric_tolerance, last_number=self.last_number)


# --------------------------------------------------------------------------- columns


def lookup(row: dict, key: str):
    """``row[key]``, or for a dotted key the value at that path in nested objects."""
    if key in row:
        return row[key]
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def has_key(row: dict, key: str) -> bool:
    try:
        lookup(row, key)
    except KeyError:
        return False
    return True


def pick_key(
    row: dict, given: str | None, candidates: tuple[str, ...], what: str, option: str, source: str
) -> str:
    """The column to read ``what`` from: the one given, or the first default present."""
    if given is not None:
        if not has_key(row, given):
            raise InputError(
                f"{source}: no column {given!r} for the {what}; the rows have: "
                f"{', '.join(map(repr, row))}",
                hint=f"pass {option} with one of those columns (a.b reads a nested key)",
            )
        return given
    for key in candidates:
        if key in row:
            return key
    raise InputError(
        f"{source}: no {what} column; looked for {', '.join(map(repr, candidates))}, "
        f"the rows have: {', '.join(map(repr, row))}",
        hint=f"name the column with {option} (a.b reads a nested key)",
    )


def prediction_samples(value, *, where: str = "") -> tuple[list, bool]:
    """The responses in one prediction cell, and whether the cell holds several samples.

    A string is one response; a list of strings is k samples; a list of lists of strings
    (lm-evaluation-harness ``resps``) is flattened; a chat message (``{"role",
    "content"}``) or a whole conversation counts as its last message; null is no response.
    Anything else is an input error: it is never graded as its printed form.
    """
    if value is None or isinstance(value, str):
        return [value], False
    if isinstance(value, dict):
        return [_message_content(value, where)], False
    if isinstance(value, list | tuple):
        if value and all(isinstance(v, dict) and "role" in v for v in value):
            return [_message_content(value[-1], where)], False
        samples = []
        for v in value:
            if isinstance(v, list | tuple):
                samples.extend(_sample(x, where) for x in v)
            else:
                samples.append(_sample(v, where))
        return samples, True
    raise InputError(
        f"{where}the prediction is a {type(value).__name__} ({_shown(value)}); "
        "expected a string or a list of strings",
        hint="point --pred-key at the column that holds the responses",
    )


def _sample(value, where: str):
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        return _message_content(value, where)
    raise InputError(
        f"{where}a prediction sample is a {type(value).__name__} ({_shown(value)}); "
        "expected a string",
        hint="point --pred-key at the column that holds the responses",
    )


def _message_content(message: dict, where: str):
    if "content" not in message:
        raise InputError(
            f"{where}the prediction is an object without 'content' ({_shown(message)})",
            hint="point --pred-key at the text, e.g. --pred-key response.text",
        )
    content = message["content"]
    if content is None or isinstance(content, str):
        return content
    raise InputError(f"{where}a message's content is a {type(content).__name__}, not text")


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _gold(value, where: str) -> str | None:
    if value is None or isinstance(value, str | int | float | bool):
        return gold_answer(value)
    if isinstance(value, list | tuple) and all(
        v is None or isinstance(v, str | int | float) for v in value
    ):
        return gold_answer(value)
    raise InputError(
        f"{where}the gold answer is a {type(value).__name__} ({_shown(value)}); "
        "expected a string, a number or a list of them",
        hint="point --gold-key at the column that holds the gold answer (a.b for nested keys)",
    )


def is_harness_samples(row: dict) -> bool:
    """An lm-evaluation-harness samples row: one (document, filter) pair."""
    return isinstance(row.get(HARNESS_FILTER_KEY), str) and (
        "filtered_resps" in row or "resps" in row
    )


def select_filter(rows: list[dict], name: str, source: str) -> list[dict]:
    """The rows of one harness filter (``--filter``)."""
    if not is_harness_samples(rows[0]):
        raise InputError(
            f"{source}: --filter {name!r} needs an lm-evaluation-harness samples file, and the "
            f"rows have no {HARNESS_FILTER_KEY!r} column",
            hint="leave out --filter",
        )
    chosen = [row for row in rows if row.get(HARNESS_FILTER_KEY) == name]
    if not chosen:
        present = dict.fromkeys(str(row.get(HARNESS_FILTER_KEY)) for row in rows)
        raise InputError(
            f"{source}: no rows with filter {name!r}; the file has: "
            f"{', '.join(map(repr, present))}",
            hint="pass --filter with one of those names",
        )
    return chosen


def _truncation(row: dict, count: int, where: str) -> list[bool | None]:
    """Per sample: True when the row's finish_reason (or stop_reason) says the response
    was cut off, False when it says the response finished, None when the row does not say
    (the response's text is then judged by how it ends)."""
    key = FINISH_KEY if row.get(FINISH_KEY) is not None else STOP_KEY
    reason = row.get(key)
    if reason is None:
        return [None] * count
    if isinstance(reason, list) and len(reason) == count:
        return [_cut_off(r) for r in reason]
    if not isinstance(reason, list):
        return [_cut_off(reason)] * count
    raise InputError(f"{where}{key!r} does not give one reason per sample")


def _cut_off(reason) -> bool | None:
    """A reason a generation ended: "length"/"max_tokens" cut it off; any other reason
    (``stop``, ``end_turn``, vLLM's matched stop string or token id) finished it."""
    if isinstance(reason, str):
        return reason in TRUNCATED_REASONS
    if isinstance(reason, int) and not isinstance(reason, bool):
        return False
    return None


# --------------------------------------------------------------------------- grading


def grade_rows(
    rows: list[dict],
    options: GradeOptions,
    *,
    source: str = "<rows>",
    pool: GradingPool | None = None,
    show_progress: bool = True,
) -> tuple[list[dict], dict]:
    """Grade rows in memory; return the graded rows and the summary. ``show_progress``
    False: no bar (a caller grading many small batches shows its own)."""
    if not rows:
        raise InputError(f"{source}: no rows to grade")
    if options.filter is not None:
        rows = select_filter(rows, options.filter, source)
    first = rows[0]
    harness = is_harness_samples(first)
    pred_key = pick_key(first, options.pred_key, PRED_KEYS, "prediction", "--pred-key", source)
    gold_key = pick_key(first, options.gold_key, GOLD_KEYS, "gold answer", "--gold-key", source)
    id_key = options.id_key
    if id_key is not None:
        pick_key(first, id_key, (), "problem id", "--id-key", source)
    else:
        id_key = next((k for k in ID_KEYS if k in first), None)
    for key in options.group_keys:
        pick_key(first, key, (), "group", "--group-key", source)

    items: list[tuple] = []
    spans: list[tuple[int, int, bool]] = []  # per row: first item, item count, was a list
    for number, row in enumerate(rows, start=1):
        where = f"{source}: row {number}: "
        for key in (pred_key, gold_key):
            if not has_key(row, key):
                raise InputError(f"{source}: row {number} has no column {key!r}")
        samples, is_list = prediction_samples(lookup(row, pred_key), where=where)
        if harness:
            samples = [None if s == HARNESS_NO_ANSWER else s for s in samples]
        gold = _gold(lookup(row, gold_key), where)
        truncated = _truncation(row, len(samples), where)
        spans.append((len(items), len(samples), is_list))
        items.extend((sample, gold, cut) for sample, cut in zip(samples, truncated, strict=True))

    own_pool = pool is None
    pool = pool or GradingPool(options.workers, options.timeout, policy=options.policy)
    try:
        with progress(disable=not show_progress) as bar:
            task = bar.add_task("grading", total=len(items))
            results = pool.grade(items, progress=lambda n: bar.advance(task, n))
    finally:
        if own_pool:
            pool.close()

    graded: list[dict] = []
    row_samples: list[_RowSamples] = []
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
        row_samples.append(
            _RowSamples(
                problem_id=_hashable(_id_of(row, id_key)) if id_key else index,
                groups={k: _group_of(row, k) for k in options.group_keys},
                filter=row.get(HARNESS_FILTER_KEY) if harness else None,
                results=mine,
            )
        )

    filters = list(dict.fromkeys(r.filter for r in row_samples))
    # rows of two filters are two readings of one document, never two samples of it
    summary = _summarize_rows(row_samples, options.group_keys)
    _log_problems(results, summary["problems"] - summary["no_samples"], summary["problems"])
    summary.update(pred_key=pred_key, gold_key=gold_key, id_key=id_key)
    if harness:
        summary["filters"] = {
            name: _summarize_rows([r for r in row_samples if r.filter == name], options.group_keys)
            for name in filters
        }
    if options.filter is not None:
        summary["filter"] = options.filter
    if options.numeric_tolerance is not None:
        summary["numeric_tolerance"] = options.numeric_tolerance
    return graded, summary


@dataclass
class _RowSamples:
    """One graded row: the problem it samples, its groups and filter, its samples' results."""

    problem_id: object
    groups: dict
    filter: str | None
    results: list[dict]


def _pool(row_samples: list[_RowSamples], key_of) -> list[Problem]:
    """Problems made of the rows that share ``key_of(row)``; each row's samples join its
    problem."""
    problems: dict[object, Problem] = {}
    for row in row_samples:
        key = key_of(row)
        problem = problems.get(key)
        if problem is None:
            problem = problems[key] = Problem(row.problem_id, row.groups)
        for r in row.results:
            problem.correct.append(bool(r["correct"]))
            # answers equal to the gold are equal to each other: one vote for the gold
            vote = CORRECT_KEY if r["correct"] else r["key"]
            problem.keys.append(vote if r["status"] == "ok" else None)
            problem.statuses.append(r["status"])
    return list(problems.values())


def _summarize_rows(row_samples: list[_RowSamples], group_keys: list[str]) -> dict:
    """The summary of rows, with one per group value of each group key.

    A problem is a (filter, id) pair; within a group it is a (filter, group value, id)
    triple, so an id whose rows sit in several groups counts in each with only that group's
    samples."""
    summary = summarize(_pool(row_samples, lambda r: (r.filter, r.problem_id)))
    if group_keys:
        summary["groups"] = {
            key: summarize_groups(_pool(row_samples, _group_problem_key(key)), key)
            for key in group_keys
        }
    return summary


def _group_problem_key(group_key: str):
    return lambda row: (row.filter, _hashable(row.groups[group_key]), row.problem_id)


def _id_of(row: dict, key: str):
    try:
        return lookup(row, key)
    except KeyError:
        return None


def _group_of(row: dict, key: str):
    try:
        return lookup(row, key)
    except KeyError:
        return None


def _hashable(value):
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


def _log_problems(results: list[dict], sampled: int, problems: int) -> None:
    bad = [r for r in results if r["status"] in ("timeout", "error")]
    if bad:
        shown = "; ".join(sorted({r["message"] or r["status"] for r in bad})[:5])
        log.warning("%d sample(s) could not be graded (%s)", len(bad), shown)
    empty = problems - sampled
    if empty:
        log.warning("%d problem(s) have no samples; they count as wrong", empty)


# --------------------------------------------------------------------------- files


def read_input_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a jsonl/json/parquet/csv file, a directory of shards, or a dataset's split,
    read by :func:`pt_core.files.read_rows` (UTF-8 text; an undecodable byte or a lone
    surrogate is an input error naming the file and line)."""
    return read_rows(split_path(path))


def write_output(path: Path, rows: list[dict]) -> Path:
    """The grades file: jsonl, parquet, or csv (lists and objects written as JSON)."""
    if path.suffix != ".csv":
        return write_rows(path, rows)
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns:
                columns.append(key)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_cell(v) for k, v in row.items()})
    return path


def _csv_cell(value):
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value


def default_output(path: Path) -> Path:
    base = path.parent / path.name if path.is_dir() else path.with_suffix("")
    return base.with_name(base.name + ".grades.jsonl")


def check_output(out_path: Path) -> None:
    """Refuse an output that cannot be written, before any grading is done."""
    if out_path.is_dir():
        raise InputError(f"{out_path} is a directory", hint="pass --out with a file name")
    if out_path.suffix not in OUTPUT_SUFFIXES:
        raise InputError(
            f"{out_path}: cannot write grades as '{out_path.suffix or 'no suffix'}'",
            hint="name the output .jsonl, .parquet or .csv",
        )
    existing = out_path.absolute().parent
    while not existing.exists():
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{existing} is not a directory")
        # a real file, not os.access: that says yes to root on a read-only file system
        fd, probe = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".probe", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InputError(
            f"{out_path}: cannot write the grades file there ({exc.strerror or exc})",
            hint="pass --out with a writable path",
        ) from None


def grade_file(
    path: str | os.PathLike,
    out: str | os.PathLike | None = None,
    options: GradeOptions | None = None,
) -> tuple[Path, dict]:
    """Grade the rows in ``path`` and write the grades file; return its path and the summary."""
    options = options or GradeOptions()
    path = Path(path)
    out_path = Path(out) if out is not None else default_output(path)
    check_output(out_path)
    rows = read_input_rows(path)
    with GradingPool(options.workers, options.timeout, policy=options.policy) as pool:
        graded, summary = grade_rows(rows, options, source=str(path), pool=pool)
    try:
        with disk_full_as_error(out_path, kept="no grades written"):
            write_output(out_path, graded)
    except OSError as exc:
        raise InputError(f"{out_path}: could not write the grades ({exc})") from None
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
