"""Reading and writing row files (jsonl, json, parquet, csv) and atomic outputs.

Every stage reads rows through :func:`iter_rows`, with one strictness: text is UTF-8
(a byte that is not, or a lone surrogate escape, is an input error naming the file and
line), a jsonl line is one JSON object, a csv row has no more cells than its header.

Every output is first written under a temporary name in the destination's
directory and renamed into place only when complete, so a crash never leaves a
half-written file that looks finished.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pt_core.errors import InputError

ROW_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


# --------------------------------------------------------------------------- atomic


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``.

    Works for files and directories. On an exception the temporary path is
    removed and ``path`` is left as it was. The output gets the modes of the process
    umask (see :func:`apply_umask`), whatever the writer used.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    target = tmp / final.name
    try:
        yield target
        if not target.exists():
            raise RuntimeError(f"atomic_path: nothing was written to {target}")
        apply_umask(target)
        _replace(target, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def process_umask() -> int:
    """The process umask, read without changing it (os.umask can only read by setting)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc (macOS): set and restore at once
    os.umask(mask)
    return mask


def apply_umask(path: str | os.PathLike) -> None:
    """Give ``path``, and everything under it when it is a directory, the mode that a plain
    ``open()`` or ``mkdir()`` gives under the process umask (0644 / 0755 under umask 022).

    Writers that go through a private temporary file of their own leave 0600 behind
    (safetensors' ``save_file`` does, so ``model.safetensors`` of a checkpoint would be
    unreadable to the rest of a group sharing a run directory). Executable files keep
    their execute bits, within the umask; symbolic links are left alone.
    """
    umask = process_umask()
    root = Path(path)
    entries = [root]
    if root.is_dir() and not root.is_symlink():
        for parent, dirs, files in os.walk(root):
            entries.extend(Path(parent, name) for name in (*dirs, *files))
    for entry in entries:
        st = os.lstat(entry)
        if stat.S_ISLNK(st.st_mode):
            continue
        executable = stat.S_ISDIR(st.st_mode) or st.st_mode & 0o111
        mode = (0o777 if executable else 0o666) & ~umask
        if stat.S_IMODE(st.st_mode) != mode:
            os.chmod(entry, mode)


def _replace(src: Path, dst: Path) -> None:
    if src.is_dir():
        if dst.exists():
            # Move the old one aside first: os.replace cannot swap over a non-empty dir.
            old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
            os.replace(dst, old)
            os.replace(src, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(src, dst)
    else:
        if dst.is_dir():
            raise InputError(f"{dst} is a directory; expected a file path")
        with open(src, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(src, dst)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------- reading


def row_files(path: str | os.PathLike) -> list[Path]:
    """The row files behind ``path``: the file itself, or a directory's shards in order."""
    p = Path(path)
    if p.is_dir():
        shards = sorted(
            f for f in p.iterdir() if f.suffix in ROW_SUFFIXES and not f.name.startswith(".")
        )
        if not shards:
            raise InputError(
                f"{p}: directory holds no .jsonl, .json, .parquet or .csv files",
                hint="point at a data file or at a directory of shards",
            )
        return shards
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    if p.suffix not in ROW_SUFFIXES:
        raise InputError(
            f"{p}: unknown row file type '{p.suffix}'",
            hint="use .jsonl, .json (an array of objects), .parquet or .csv",
        )
    return [p]


def iter_rows(
    path: str | os.PathLike, *, skip_bad: bool = False, bad_counter: list[int] | None = None
) -> Iterator[dict]:
    """Stream rows from a jsonl/json/parquet/csv file or a directory of shards.

    A malformed jsonl line raises :class:`InputError` naming file and line, or,
    with ``skip_bad``, is skipped and counted in ``bad_counter[0]``.
    """
    for f in row_files(path):
        if f.suffix == ".jsonl":
            yield from _iter_jsonl(f, skip_bad, bad_counter)
        elif f.suffix == ".json":
            yield from _iter_json_array(f)
        elif f.suffix == ".csv":
            yield from _iter_csv(f)
        else:
            yield from _iter_parquet(f)


def read_rows(path: str | os.PathLike, *, skip_bad: bool = False) -> list[dict]:
    return list(iter_rows(path, skip_bad=skip_bad))


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{where}: byte 0x{data[exc.start]:02x} at column {exc.start + 1} is not UTF-8",
            hint="re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)",
        ) from None


def _check_text(obj, where: str) -> None:
    """Raise when a string holds a lone surrogate (JSON's \\ud800 with no partner)."""
    if isinstance(obj, str):
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputError(
                f"{where}: a lone surrogate \\u{ord(obj[exc.start]):04x} is not text",
                hint="fix the escape in the file: surrogates come in pairs",
            ) from None
    elif isinstance(obj, dict):
        for value in obj.values():
            _check_text(value, where)
    elif isinstance(obj, list):
        for value in obj:
            _check_text(value, where)


def _iter_jsonl(f: Path, skip_bad: bool, bad_counter: list[int] | None) -> Iterator[dict]:
    with open(f, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            line = _decode(raw, f"{f}:{lineno}")
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"expected a JSON object, got {type(row).__name__}")
                if _SURROGATE_ESCAPE.search(line):
                    _check_text(row, f"{f}:{lineno}")
            except ValueError as exc:
                if skip_bad:
                    if bad_counter is not None:
                        bad_counter[0] += 1
                    continue
                raise InputError(
                    f"{f}:{lineno}: malformed JSON line ({exc})", hint=_malformed_line_hint()
                ) from None
            yield row


def _malformed_line_hint() -> str:
    """Offer --skip-bad only where the running command has that flag."""
    cli = sys.modules.get("pt_core.cli")  # not loaded: called from Python, not a command
    if cli is not None and cli.command_has_option("--skip-bad"):
        return "fix or remove that line, or pass --skip-bad to skip and count bad lines"
    return "fix or remove that line"


def json_array_rows(text: str, f: Path) -> list[dict]:
    """The rows of a JSON file's text: an array of objects, or one object; anything else is
    an input error naming ``f`` (and the line, for malformed JSON)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"{f}:{getattr(exc, 'lineno', '?')}: malformed JSON ({exc})") from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise InputError(f"{f}: expected a JSON array of objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise InputError(f"{f}: element {i} is {type(row).__name__}, expected an object")
    return data


def _iter_json_array(f: Path) -> Iterator[dict]:
    data = f.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{f}:{lineno}: byte 0x{data[exc.start]:02x} is not UTF-8",
            hint="re-encode the file as UTF-8",
        ) from None
    rows = json_array_rows(text, f)
    if _SURROGATE_ESCAPE.search(text):
        for index, row in enumerate(rows):
            _check_text(row, f"{f}: element {index}")
    yield from rows


def _iter_csv(f: Path) -> Iterator[dict]:
    """A csv file with a header row (a UTF-8 byte-order mark is skipped); every cell is a
    string."""
    data = f.read_bytes().removeprefix(b"\xef\xbb\xbf")
    text = "".join(
        _decode(line, f"{f}:{n}") for n, line in enumerate(data.splitlines(keepends=True), 1)
    )
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            if None in row:
                raise InputError(
                    f"{f}:{reader.line_num}: more cells than the header has columns",
                    hint="quote cells that contain commas",
                )
            yield dict(row)
    except csv.Error as exc:
        raise InputError(f"{f}: malformed CSV ({exc})") from None


def _iter_parquet(f: Path, batch_size: int = 1024) -> Iterator[dict]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except Exception as exc:  # pyarrow raises several unrelated types for a bad file
        raise InputError(f"{f}: not a readable parquet file ({exc})") from None
    for batch in pf.iter_batches(batch_size=batch_size):
        yield from batch.to_pylist()


def count_rows(path: str | os.PathLike) -> int:
    total = 0
    for f in row_files(path):
        if f.suffix == ".parquet":
            import pyarrow.parquet as pq

            total += pq.ParquetFile(f).metadata.num_rows
        else:
            total += sum(1 for _ in iter_rows(f))
    return total


def require_columns(row: dict, columns: Iterable[str], source: str) -> None:
    """Raise one clear error naming the missing columns and the ones that exist."""
    missing = [c for c in columns if c not in row]
    if missing:
        raise InputError(
            f"{source}: missing column(s) {', '.join(map(repr, missing))}; "
            f"the rows have: {', '.join(map(repr, row))}",
            hint="rename the column in the data, or point the key option at an existing one",
        )


# --------------------------------------------------------------------------- writing


def write_rows(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Write rows to ``path`` atomically; the format follows the suffix (.jsonl or .parquet)."""
    p = Path(path)
    if p.suffix == ".jsonl":
        with atomic_path(p) as tmp, open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
    elif p.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = list(rows)
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputError(
                f"{p}: rows do not share one type per column ({exc})",
                hint="write .jsonl instead, or make each column hold one type",
            ) from None
        with atomic_path(p) as tmp:
            pq.write_table(table, tmp)
    else:
        raise InputError(f"{p}: cannot write '{p.suffix}' rows", hint="use .jsonl or .parquet")
    return p


def _json_default(obj: Any):
    # numpy scalars and arrays, which pyarrow and torch code hand back
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__} to JSON")


class JsonlAppender:
    """Append rows to ``<path>.partial`` durably, then finalise by renaming onto ``path``.

    Used by stages that resume: rows already in the partial file survive a
    crash, and only the line in flight can be lost (a torn last line is dropped
    on reopen).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        self._fh = open(self.partial, "a", encoding="utf-8")  # noqa: SIM115 (held until finalize)

    def existing_rows(self) -> Iterator[dict]:
        if self.partial.exists():
            yield from _iter_jsonl(self.partial, skip_bad=False, bad_counter=None)

    def write(self, rows: Iterable[dict]) -> None:
        for row in rows:
            self._fh.write(json.dumps(row, ensure_ascii=False, default=_json_default) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def finalize(self) -> Path:
        self._fh.close()
        os.replace(self.partial, self.path)
        return self.path

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()

    def _repair_torn_tail(self) -> None:
        if not self.partial.exists():
            return
        data = self.partial.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data[: data.rfind(b"\n") + 1]
            with open(self.partial, "wb") as fh:
                fh.write(keep)


def read_dataset_info(directory: str | os.PathLike) -> dict | None:
    """``dataset.json`` of the pt-data dataset ``directory`` (None when it has none); a
    file that is not JSON is an InputError naming it."""
    info_path = Path(directory) / "dataset.json"
    if not info_path.is_file():
        return None
    try:
        return json.loads(info_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InputError(f"{info_path}: not valid JSON ({exc})") from None


def split_path(path: str | os.PathLike, split: str = "train") -> Path:
    """The rows of one split of a dataset.

    A pt-data output directory holds one subdirectory of shards per split
    (``train/``, ``validation/``, ``test/``); given such a directory this returns
    the split's subdirectory. A plain file, or a directory of shards, is returned as is.
    """
    p = Path(path)
    if p.is_dir() and (p / split).is_dir():
        return p / split
    splits = (
        sorted(c.name for c in p.iterdir() if c.is_dir() and not c.name.startswith("."))
        if p.is_dir()
        else []
    )
    if splits and not any(f.suffix in ROW_SUFFIXES for f in p.iterdir()):
        raise InputError(f"{p}: no split {split!r}; the dataset has: {', '.join(splits)}")
    return p
