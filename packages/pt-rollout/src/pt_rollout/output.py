"""Resumable row output keyed by (id, sample).

Rows are appended to ``<out>.partial`` (one fsync per batch), so a crash loses at most the
batch in flight. Rerunning on the same ``--out`` skips every (id, sample) already there,
including those of a finished ``<out>``. Finalising rewrites the rows in input order to
``<out>`` (jsonl or parquet, by suffix) atomically and removes the partial file.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from pt_core.errors import (
    DiskFull,
    InputError,
    Interrupted,
    PtError,
    disk_full_as_error,
    is_disk_full,
)
from pt_core.files import JsonlAppender, iter_rows, write_rows


def row_key(row_id, sample: int) -> tuple[str, int]:
    """A hashable key for (id, sample) that tells 1 and "1" apart."""
    return json.dumps(row_id, sort_keys=True, default=str), int(sample)


def interrupted(out: str | os.PathLike) -> Interrupted:
    """What Ctrl-C left of the output ``out``: the rows in its partial file, which the same
    command resumes after (an interrupted batch's rows were never written)."""
    partial = Path(out).with_name(Path(out).name + ".partial")  # JsonlAppender's
    if not partial.exists():
        return Interrupted(f"interrupted before any row was written to {out}")
    return Interrupted(f"interrupted: {kept_rows(partial)}")


def with_kept_rows(exc: PtError, out: str | os.PathLike) -> PtError:
    """``exc`` (a run that stopped on an error) saying what the partial file of ``out``
    keeps for the same command to resume after, where it keeps rows."""
    partial = Path(out).with_name(Path(out).name + ".partial")  # JsonlAppender's
    if isinstance(exc, DiskFull) or not partial.exists() or not partial.stat().st_size:
        return exc
    kept = type(exc)(f"{exc.message}; {kept_rows(partial)}", hint=exc.hint)
    kept.__cause__ = exc.__cause__
    return kept


def kept_rows(partial: Path) -> str:
    """How many rows the partial file holds, which the same command resumes after: its
    complete lines (a torn last one is dropped on reopening)."""
    with open(partial, "rb") as fh:
        kept = sum(1 for line in fh if line.endswith(b"\n") and line.strip())
    return f"{kept} rows kept in {partial}; the same command resumes after them"


class ResumableOutput:
    def __init__(self, out: str | os.PathLike):
        self.path = Path(out)
        if self.path.suffix not in (".jsonl", ".parquet"):
            raise InputError(
                f"{self.path}: output must be a .jsonl or .parquet file",
                hint="e.g. --out rollouts.jsonl",
            )
        self._appender = JsonlAppender(self.path)
        self.done: set[tuple[str, int]] = set()
        for row in self._appender.existing_rows():
            self.done.add(row_key(row["id"], row["sample"]))
        if not self.done and self.path.exists():
            # A finished output from an earlier run: its rows count as done.
            previous = list(iter_rows(self.path))
            self._appender.write(previous)
            self.done = {row_key(r["id"], r["sample"]) for r in previous}
        self.resumed = len(self.done)

    def rows(self) -> Iterable[dict]:
        """The rows written so far (this run and earlier ones)."""
        return self._appender.existing_rows()

    def write(self, rows: Iterable[dict]) -> None:
        rows = list(rows)
        partial = self._appender.partial
        try:
            self._appender.write(rows)
        except OSError as exc:
            if not is_disk_full(exc, partial):
                raise
            # Some of this batch may be lost (a torn last line is dropped on reopening);
            # closing flushes what is left of it, which meets the full disk again.
            with contextlib.suppress(OSError):
                self._appender.close()
            raise DiskFull(partial, kept=kept_rows(partial)) from exc
        self.done.update(row_key(r["id"], r["sample"]) for r in rows)

    def finalize(self, order: Callable[[dict], tuple]) -> int:
        """Write every row, sorted by ``order``, to the output path; return the row count.

        Duplicates (which only a hand-edited partial file could hold) keep the first row.
        """
        self._appender.close()
        rows, seen = [], set()
        for row in self._appender.existing_rows():
            key = row_key(row["id"], row["sample"])
            if key not in seen:
                seen.add(key)
                rows.append(row)
        rows.sort(key=order)
        with disk_full_as_error(self.path, kept=kept_rows(self._appender.partial)):
            write_rows(self.path, rows)
        self._appender.partial.unlink(missing_ok=True)
        return len(rows)

    def close(self) -> None:
        self._appender.close()

    @contextlib.contextmanager
    def kept_on_error(self) -> Iterator[None]:
        """Around the work that writes rows: an error closes the output, and one pt reports
        says how many rows the partial file keeps for the same command to resume after."""
        try:
            yield
        except PtError as exc:
            self.abandon()
            raise with_kept_rows(exc, self.path) from exc.__cause__
        except BaseException:
            self.close()  # rows written so far stay in the partial file
            raise

    def abandon(self) -> None:
        """Close after an error: the partial file stays where it holds rows (the same
        command resumes after them), and goes where it holds none."""
        self._appender.close()
        partial = self._appender.partial
        if partial.exists() and not partial.stat().st_size:
            partial.unlink()
