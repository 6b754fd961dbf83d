"""A build's work directory: the chunks built so far, each there whole or not at all.

``pt-data build`` cuts the mixed rows into chunks of ``chunk_rows`` and builds each
(shuffle, tokenize, pack) into its own files here, then assembles the dataset from the
chunks in order. So:

* a build killed at any point (``kill -9`` included) resumes at its last complete chunk
  when run again, and ends with the same bytes as one never stopped;
* a build split into shards (``--shard i/N``: processes, nodes, SLURM tasks) builds the
  chunks ``c`` with ``c % N == i`` in each shard; the last shard to finish assembles
  the dataset, the same bytes as a build in one process;
* nothing per row is kept in memory across chunks.

Layout::

    <output_dir>.build/
      plan.json               what these chunks were built from: the data hash and the
                              sources' sizes and times (another plan: the chunks go)
      mixer.json              the mixer's counts after a whole pass over the sources
      chunks/00003/train.parquet   chunk 3's rows of each split
      chunks/00003.json       chunk 3 is complete: its counts
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pt_core.errors import ConfigError
from pt_core.files import atomic_write_json
from pt_core.log import get_logger

log = get_logger(__name__)

# rows read back per batch when the dataset is assembled (memory: one batch)
ASSEMBLE_BATCH_ROWS = 4096


def parse_shard(text: str | None) -> tuple[int, int]:
    """``"i/N"`` -> ``(i, N)``; None -> ``(0, 1)`` (the whole build)."""
    if text is None:
        return 0, 1
    i, _, n = text.partition("/")
    try:
        index, count = int(i), int(n)
    except ValueError:
        index, count = -1, 0
    if count < 1 or not 0 <= index < count:
        raise ConfigError(
            f"--shard {text!r} is not i/N with 0 <= i < N",
            hint="give this process's shard as i/N, e.g. --shard 0/4 ... --shard 3/4",
        )
    return index, count


def sources_fingerprint(datasets: list) -> list:
    """What the chunks were read from: each local source file's path, size and time (a
    file changed since makes the chunks stale); hub names as given."""
    out = []
    for spec in datasets:
        source = os.path.expanduser(spec.source)
        paths = sorted(glob.glob(source, recursive=True)) if set("*?[") & set(source) else [source]
        files = []
        for path in paths:
            p = Path(path)
            found = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
            for f in found:
                if f.is_file():
                    st = f.stat()
                    files.append([str(f.resolve()), st.st_size, st.st_mtime_ns])
        out.append({"source": spec.source, "files": files})
    return out


class WorkDir:
    """``<output_dir>.build``: the plan, the mixer's counts, the complete chunks."""

    def __init__(self, out_dir: Path, plan: dict[str, Any]):
        self.path = out_dir.parent / f"{out_dir.name}.build"
        self.plan = plan

    def open(self) -> int:
        """Make the directory, or keep the chunks of the same plan there (returns how many
        are complete); chunks of another plan are discarded, and said so."""
        plan_file = self.path / "plan.json"
        if plan_file.is_file():
            try:
                old = json.loads(plan_file.read_text())
            except (OSError, ValueError):
                old = None
            if old != self.plan:
                log.warning(
                    "discarding the unfinished build at %s: it was made from another config "
                    "or other source files",
                    self.path,
                )
                shutil.rmtree(self.path, ignore_errors=True)
        (self.path / "chunks").mkdir(parents=True, exist_ok=True)
        if not plan_file.is_file():
            atomic_write_json(plan_file, self.plan)
        return len(list((self.path / "chunks").glob("*.json")))

    def exists(self) -> bool:
        return (self.path / "plan.json").is_file()

    def marker(self, chunk: int) -> Path:
        return self.path / "chunks" / f"{chunk:05d}.json"

    def is_done(self, chunk: int) -> bool:
        return self.marker(chunk).is_file()

    def chunk_writer(self, chunk: int) -> ChunkWriter:
        """Where chunk ``chunk``'s tables go, split by split, before :meth:`finish_chunk`."""
        tmp = self.path / "chunks" / f".{chunk:05d}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        return ChunkWriter(tmp)

    def finish_chunk(self, chunk: int, writer: ChunkWriter, record: dict[str, Any]) -> None:
        """Chunk ``chunk``'s files into place, then its marker: complete, or not there."""
        writer.close()
        final = self.path / "chunks" / f"{chunk:05d}"
        shutil.rmtree(final, ignore_errors=True)  # a copy a killed build left without marker
        os.replace(writer.directory, final)
        atomic_write_json(self.marker(chunk), record)

    def record(self, chunk: int) -> dict[str, Any]:
        return json.loads(self.marker(chunk).read_text())

    def chunk_file(self, chunk: int, split: str) -> Path:
        return self.path / "chunks" / f"{chunk:05d}" / f"{split}.parquet"

    def write_mixer(self, info: dict[str, Any]) -> None:
        # (the directory gone: removed by the shard that assembled the dataset)
        with contextlib.suppress(FileNotFoundError):
            atomic_write_json(self.path / "mixer.json", info)

    def mixer(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.path / "mixer.json").read_text())
        except (OSError, ValueError):
            return None

    def missing(self) -> list[int] | None:
        """The chunks not complete yet; None before any pass over the sources has ended
        (the number of chunks is not known)."""
        mixer = self.mixer()
        if mixer is None:
            return None
        return [c for c in range(mixer["chunks"]) if not self.is_done(c)]

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One process at a time assembles (the last shards may end together); the one
        that assembles removes the directory before it lets go. Gone already: another
        shard assembled the dataset, and there is nothing to hold."""
        try:
            fh = open(self.path / "lock", "a")  # noqa: SIM115  (closed below)
        except FileNotFoundError:
            yield
            return
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class ChunkWriter:
    """A chunk's parquet file per split, written a table at a time (each a row group)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.writers: dict[str, Any] = {}

    def write(self, split: str, table) -> None:
        import pyarrow.parquet as pq

        if split not in self.writers:
            self.writers[split] = pq.ParquetWriter(
                self.directory / f"{split}.parquet", table.schema
            )
        self.writers[split].write_table(table)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        self.writers = {}


def assemble_split(files: list[Path], directory: Path, shard_rows: int) -> int:
    """The rows of ``files`` in order, as ``part-NNNNN.parquet`` of ``shard_rows`` rows,
    read and written a batch at a time; returns the number of rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schemas = [pq.read_schema(f) for f in files]
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    directory.mkdir(parents=True, exist_ok=True)
    writer, part, in_part, rows = None, 0, 0, 0
    try:
        for f in files:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=ASSEMBLE_BATCH_ROWS):
                table = _as_schema(pa.Table.from_batches([batch]), schema)
                while table.num_rows:
                    if writer is None:
                        writer = pq.ParquetWriter(directory / f"part-{part:05d}.parquet", schema)
                    take = min(table.num_rows, shard_rows - in_part)
                    writer.write_table(table.slice(0, take))
                    in_part, rows, table = in_part + take, rows + take, table.slice(take)
                    if in_part == shard_rows:
                        writer.close()
                        writer, part, in_part = None, part + 1, 0
    finally:
        if writer is not None:
            writer.close()
    return rows


def _as_schema(table, schema):
    """``table`` in the unified schema (a column all null in one chunk, say)."""
    import pyarrow as pa

    if table.schema == schema:
        return table
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError):
        return pa.Table.from_pylist(table.to_pylist(), schema=schema)
