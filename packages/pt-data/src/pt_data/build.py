"""``pt-data build``: sources -> transform -> mix -> (template, tokenize, pack) -> shards.

Rows stream through in chunks of ``chunk_rows``: each chunk is shuffled (seeded),
tokenized over ``num_proc`` processes and packed, and written on its own in the build's
work directory (:mod:`pt_data.chunks`); the dataset is then assembled from the chunks in
order, as parquet shards of at most ``shard_rows`` rows. Memory is set by one chunk (and
the tokenizer), not by the number of rows: nothing per row is kept across chunks but
an 8-byte key per kept row for de-duplication.

A build killed mid-way resumes at its last complete chunk; a build split with
``--shard i/N`` builds every N-th chunk in each shard, and the last shard to finish
assembles the dataset: the same bytes either way. The output directory is written under
a temporary name and renamed into place at the end, so a failed build leaves no output
(and an earlier good build at the same path stays untouched until the new one is
complete).

Output::

    <output_dir>/train/part-00000.parquet ...
    <output_dir>/validation/part-00000.parquet     (with validation_split > 0)
    <output_dir>/dataset.json                      format, counts, tokenizer, config_hash
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pt_core.chat import end_of_turn_ids, tokenizer_fingerprint
from pt_core.config import config_hash
from pt_core.errors import ConfigError, DiskFull, InputError, Interrupted, disk_full_as_error
from pt_core.files import atomic_path, atomic_write_json
from pt_core.log import get_logger, progress
from pt_data import __version__
from pt_data.chunks import WorkDir, assemble_split, sources_fingerprint
from pt_data.config import DataConfig
from pt_data.mix import MixedRow, Mixer, SourceStats
from pt_data.pack import pack_tables

log = get_logger(__name__)


# Tokenizer classes that need nothing but the tokenizers backend: loading them directly
# skips AutoTokenizer's import of torch (seconds on every pt-data start).
_PLAIN_FAST_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(
    name_or_path: str, key: str = "data.tokenizer.name_or_path", hint: str | None = None
):
    """A Hugging Face tokenizer from a local directory or a (cached) hub name; ``key`` names
    where the name came from, for the error when it is neither (with ``hint`` as its fix)."""
    from pt_core.hub import require_local_or_hub

    require_local_or_hub(
        name_or_path,
        key,
        hint=hint
        or "give a local tokenizer directory, or a hub name with a network or in the cache",
    )
    config_file = Path(name_or_path) / "tokenizer_config.json"
    try:
        if config_file.is_file():
            tokenizer_class = json.loads(config_file.read_text()).get("tokenizer_class")
            if tokenizer_class in _PLAIN_FAST_CLASSES:
                from transformers import PreTrainedTokenizerFast

                return PreTrainedTokenizerFast.from_pretrained(name_or_path)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"tokenizer {name_or_path!r} cannot be loaded ({exc})",
            hint="give a local tokenizer directory, or a hub name that is in the local cache",
        ) from None


def data_hash(cfg: DataConfig) -> str:
    """Hash of what determines the data (not where it is written or how many processes)."""
    d = cfg.model_dump(mode="json")
    for key in ("output_dir", "output", "num_proc"):
        d.pop(key, None)
    return config_hash(d)


class ShardWriter:
    """Parquet shards of at most ``shard_rows`` rows in ``directory``."""

    def __init__(self, directory: Path, shard_rows: int):
        self.directory = directory
        self.shard_rows = shard_rows
        self.pending: list = []  # pyarrow tables
        self.pending_rows = 0
        self.shards = 0
        self.rows = 0

    def write(self, table) -> None:
        self.pending.append(table)
        self.pending_rows += table.num_rows
        while self.pending_rows >= self.shard_rows:
            self._flush(self.shard_rows)

    def close(self) -> None:
        while self.pending_rows:
            self._flush(min(self.pending_rows, self.shard_rows))

    def _flush(self, n: int) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.concat_tables(self.pending, promote_options="permissive")
        head, rest = table.slice(0, n), table.slice(n)
        self.directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(head, self.directory / f"part-{self.shards:05d}.parquet")
        self.shards += 1
        self.rows += head.num_rows
        self.pending = [rest] if rest.num_rows else []
        self.pending_rows = rest.num_rows


def rows_table(rows: list[dict], where: str, *, token_columns: tuple[str, ...] = ()):
    """Rows as one arrow table; ``token_columns`` (lists of token ids) are stored as int32."""
    import pyarrow as pa

    try:
        if not token_columns:
            return pa.Table.from_pylist(rows)
        table = pa.Table.from_pylist(
            [{k: v for k, v in r.items() if k not in token_columns} for r in rows]
        )
        for name in token_columns:
            values = pa.array([r[name] for r in rows], type=pa.list_(pa.int32()))
            table = table.append_column(name, values)
        return table
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(
            f"{where}: rows do not share one type per column ({exc})",
            hint="make each column hold one type (e.g. map it in a transform), or drop it with "
            "a custom transform",
        ) from None


# Tokenizer keys for one kind of rows only: set for the other kind, they would do nothing.
_KEYS_NOT_FOR = {
    "preferences": ("packing", "train_on"),  # one pair per row; the answers are trained
    "conversations": ("max_prompt_length", "max_completion_length"),
}


def _reject_keys(tcfg, kind: str) -> None:
    given = sorted(set(_KEYS_NOT_FOR[kind]) & tcfg.model_fields_set)
    if given:
        raise ConfigError(
            f"data.tokenizer.{given[0]} does not apply to {kind} (these rows)",
            hint=f"remove data.tokenizer.{given[0]}",
        )


class Builder:
    """One build: holds the mixer, the tokenizer and the running counts."""

    def __init__(self, cfg: DataConfig, *, skip_bad: bool | None = None):
        self.cfg = cfg
        self.mixer = Mixer(cfg, skip_bad=skip_bad)
        self.tokenizer = None
        self.ct = None
        if cfg.tokenizer is not None:
            from pt_data.tokenize import ConversationTokenizer

            self.tokenizer = load_tokenizer(cfg.tokenizer.name_or_path)
            self.ct = ConversationTokenizer(
                self.tokenizer,
                chat_template=cfg.tokenizer.chat_template,
                train_on=cfg.tokenizer.train_on,
            )
        self._reset_counts()
        self.pairs = None  # ParallelPairs, once the rows turn out to be preferences
        self.chunks_built = 0

    def _reset_counts(self) -> None:
        """The counts of one chunk (kept in its marker), or of the whole dataset."""
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.source_tokens: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.token_dropped: dict[str, Counter] = defaultdict(Counter)  # by source, reason

    @property
    def tokenized(self) -> bool:
        return self.ct is not None

    def output_format(self) -> str:
        kind = self.mixer.kind
        tcfg = self.cfg.tokenizer
        if tcfg is not None and kind == "preferences":
            if self.cfg.format not in (None, "preferences"):
                raise ConfigError(
                    f"data.format is {self.cfg.format!r} but the transforms make preferences rows",
                    hint="set format: preferences or leave it unset",
                )
            _reject_keys(tcfg, "preferences")
            return "preferences"
        if tcfg is not None:
            if kind not in (None, "conversations"):
                raise ConfigError(
                    f"a tokenizer is set, but the transforms make {kind} rows; only "
                    "conversations and preferences are tokenized",
                    hint="remove data.tokenizer, or use a conversation transform",
                )
            if self.cfg.format not in (None, "tokenized"):
                raise ConfigError(
                    f"data.format is {self.cfg.format!r} but a tokenizer is set and the "
                    "transforms make conversations",
                    hint="remove data.tokenizer to write conversations, or set format: tokenized",
                )
            _reject_keys(tcfg, "conversations")
            return "tokenized"
        if self.cfg.format not in (None, kind):
            raise ConfigError(
                f"data.format is {self.cfg.format!r} but the transforms make {kind} rows",
                hint=f"set format: {kind} or leave it unset",
            )
        return kind or "conversations"

    def run(self, out_dir: Path, shard: tuple[int, int] = (0, 1)) -> dict[str, Any] | None:
        """Build the chunks of ``shard`` (``(i, N)``: every N-th chunk from the i-th) that
        are not complete yet, then assemble the dataset if no chunk is missing. Returns
        the manifest fields, or None when other shards still have chunks to build."""
        cfg = self.cfg
        work = WorkDir(
            out_dir, {"data_hash": data_hash(cfg), "sources": sources_fingerprint(cfg.datasets)}
        )
        try:
            with disk_full_as_error(out_dir, kept="nothing written there"):
                done = work.open()
                if done:
                    log.info(
                        "resuming the build at %s: %d chunks already complete", work.path, done
                    )
                if work.missing() != []:
                    self._build_chunks(work, shard)
                with work.lock():
                    missing = work.missing()
                    if missing is None:  # another shard assembled it and removed the chunks
                        info = self._assembled_by_another(out_dir)
                        log.info(
                            "shard %d/%d done; the other shards had built the rest by then, "
                            "and one of them assembled %s", *shard, out_dir,
                        )  # fmt: skip
                        return info
                    if missing:
                        total = (work.mixer() or {}).get("chunks", len(missing))
                        log.info(
                            "shard %d/%d done; %d of %d chunks still to build by the other "
                            "shards (the last to finish assembles %s)",
                            *shard, len(missing), total, out_dir,
                        )  # fmt: skip
                        return None
                    info = self._assemble(work, out_dir)
                    work.remove()  # under the lock: a shard waiting for it finds it done
        except (InputError, ConfigError, DiskFull):
            # bad input: no chunk of it is worth resuming from; a full disk: the chunks
            # are what filled it. (Interrupted or killed, the complete chunks stay.)
            work.remove()
            raise
        except KeyboardInterrupt:
            kept = len(list((work.path / "chunks").glob("*.json")))
            raise Interrupted(
                f"interrupted: the complete chunks ({kept}) are kept in {work.path}",
                hint="run the same command again: it resumes from them",
            ) from None
        return info

    def _build_chunks(self, work: WorkDir, shard: tuple[int, int]) -> None:
        """One pass over the sources; the chunks of this shard not complete yet are built."""
        cfg = self.cfg
        index, count = shard
        encoder = None
        if self.ct is not None:
            from pt_data.tokenize import ParallelEncoder

            # each process tokenizes on one core: num_proc is the number of cores used
            os.environ["TOKENIZERS_PARALLELISM"] = "false"
            encoder = ParallelEncoder(self.ct, cfg.num_proc)
            encoder.start()  # forked now, before rows fill this process's memory
        log.info(
            "memory is set by data.chunk_rows=%d (one chunk tokenized while the one before is "
            "packed and written), not by the number of rows; a lower chunk_rows uses less",
            cfg.chunk_rows,
        )
        try:
            with progress() as bar:
                what = "building" if count == 1 else f"building shard {index}/{count}"
                task = bar.add_task(what, total=None)

                def mine(n: int) -> bool:
                    # (the work directory gone: a shard that ended last assembled the
                    # dataset while this one read on past its own last chunk)
                    return n % count == index and not work.is_done(n) and work.exists()

                # a chunk is tokenized by the processes while this one packs and writes
                # the chunk before and reads the rows of the next
                pending, n_chunk = None, 0
                for n, rows, read in self._chunks(mine):
                    if rows is not None:
                        started = self._start_chunk(rows, n, encoder)
                        if pending is not None:
                            self._finish_chunk(pending, work)
                        pending = started
                    bar.advance(task, read)
                    n_chunk = n + 1
                if pending is not None:
                    self._finish_chunk(pending, work)
        except BaseException:  # Ctrl-C included: the processes are stopped, not awaited
            for pool in (encoder, self.pairs):
                if pool is not None:
                    pool.abort()
            raise
        finally:
            for pool in (encoder, self.pairs):
                if pool is not None:
                    pool.close()
        if work.exists():
            work.write_mixer(
                {
                    "chunks": n_chunk,
                    "kind": self.mixer.kind,
                    "sources": {name: st.as_dict() for name, st in self.mixer.stats.items()},
                }
            )

    def _assemble(self, work: WorkDir, out_dir: Path) -> dict[str, Any]:
        """The dataset from the complete chunks, in order, with the counts summed."""
        mixer = work.mixer()
        assert mixer is not None  # every chunk is complete: a pass has ended
        self.mixer.kind = mixer["kind"]
        self.mixer.stats = {
            name: SourceStats.from_dict(name, d) for name, d in mixer["sources"].items()
        }
        self._reset_counts()
        files: dict[str, list[Path]] = defaultdict(list)
        for c in range(mixer["chunks"]):
            record = work.record(c)
            for split, counts in record["counts"].items():
                for key, value in counts.items():
                    self.counts[split][key] += value
                if counts.get("rows"):
                    files[split].append(work.chunk_file(c, split))
            for source, counts in record["source_tokens"].items():
                for key, value in counts.items():
                    self.source_tokens[source][key] += value
            for source, dropped in record["dropped"].items():
                self.mixer.stats[source].dropped.update(dropped)
        if not files:
            read = sum(s.read for s in self.mixer.stats.values())
            raise InputError(
                f"no rows left to write ({read} read; dropped: {self._dropped()})",
                hint="check the filters, weights and transforms; see pt-data inspect",
            )
        with atomic_path(out_dir) as tmp:
            for split in sorted(files):
                assemble_split(files[split], tmp / split, self.cfg.shard_rows)
            info = self._dataset_info(sorted(files))
            atomic_write_json(tmp / "dataset.json", info)
        return info

    def _assembled_by_another(self, out_dir: Path) -> dict[str, Any]:
        """The dataset a shard that ended first assembled from these chunks."""
        try:
            info = json.loads((out_dir / "dataset.json").read_text())
        except (OSError, ValueError):
            info = None
        if info is None or info.get("config_hash") != data_hash(self.cfg):
            raise InputError(
                f"the build's chunks at {out_dir}.build were removed while this shard ran, "
                f"and {out_dir} is not their dataset",
                hint="run the build again (every shard, or once without --shard)",
            )
        return info

    def _dropped(self) -> dict[str, int]:
        total: dict[str, int] = defaultdict(int)
        for s in self.mixer.stats.values():
            for k, v in s.dropped.items():
                total[k] += v
        return dict(total)

    def _chunks(self, keep) -> Iterator[tuple[int, list[MixedRow] | None, int]]:
        """``(index, rows, rows read)`` of each chunk of the mixed rows; ``rows`` is None
        for a chunk ``keep(index)`` (asked when the chunk starts) does not want."""
        chunk: list[MixedRow] = []
        n, read = 0, 0
        wanted = keep(0)
        for item in self.mixer.rows():
            read += 1
            if wanted:
                chunk.append(item)
            if read >= self.cfg.chunk_rows:
                yield n, chunk if wanted else None, read
                chunk, n, read = [], n + 1, 0
                wanted = keep(n)
        if read:
            yield n, chunk if wanted else None, read

    def _start_chunk(self, chunk, n_chunk: int, encoder):
        """Shuffle chunk ``n_chunk``, split it, and start tokenizing its conversations."""
        fmt = self.output_format()  # a config that does not fit these rows fails here, early
        if self.cfg.shuffle:
            random.Random(f"{self.cfg.seed}:chunk:{n_chunk}").shuffle(chunk)
        by_split: dict[str, list[MixedRow]] = defaultdict(list)
        for item in chunk:
            by_split[item.split].append(item)
        started = {}
        if self.tokenized and fmt != "preferences":
            for split, items in by_split.items():
                started[split] = encoder.submit(
                    [i.row["messages"] for i in items],
                    ids=[i.row.get("id") for i in items],
                    tools=[i.row.get("tools") for i in items],
                )
                # what packing needs of a row is its source and id: the text can go
                by_split[split] = [
                    MixedRow(i.split, i.source, {"id": i.row.get("id")}) for i in items
                ]
        return n_chunk, fmt, by_split, started

    def _finish_chunk(self, pending, work: WorkDir) -> None:
        """Pack chunk's rows (tokenized by now) and write them, with its counts."""
        n_chunk, fmt, by_split, started = pending
        first = not self.chunks_built
        self.chunks_built += 1
        self._reset_counts()
        writer = work.chunk_writer(n_chunk)
        for split, items in sorted(by_split.items()):
            if self.tokenized and fmt == "preferences":
                tables = [self._tokenize_pairs(items, split)]
            elif self.tokenized:
                tables = self._tokenize(items, split, started[split]())
            else:
                tables = [rows_table([i.row for i in items], f"{split} rows")]
                self.counts[split]["sequences"] += len(items)
                for i in items:
                    self.source_tokens[i.source]["sequences"] += 1
            for table in tables:
                if table.num_rows:
                    writer.write(split, table)
                self.counts[split]["rows"] += table.num_rows
        record = {
            "counts": {split: dict(c) for split, c in self.counts.items()},
            "source_tokens": {source: dict(c) for source, c in self.source_tokens.items()},
            "dropped": {source: dict(c) for source, c in self.token_dropped.items()},
        }
        work.finish_chunk(n_chunk, writer, record)
        if first:
            import resource

            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB
            log.info("chunk %d built; this process's peak memory so far: %.1f GB", n_chunk, peak)

    def _tokenize(self, items: list[MixedRow], split: str, batch):
        import numpy as np

        tcfg = self.cfg.tokenizer
        assert tcfg is not None  # tokenized: data.tokenizer is set
        max_len = tcfg.max_seq_length
        lengths = batch.lengths
        trained = batch.trained_counts()
        if (trained == 0).any():
            bad = items[int(np.argmax(trained == 0))]
            raise InputError(
                f"row {bad.row.get('id')!r} ({bad.source}) has no trainable tokens: the chat "
                "template renders no assistant content for it",
                hint="use a template that renders assistant turns (data.tokenizer.chat_template: "
                "chatml), or check train_on",
            )
        keep = np.ones(len(items), dtype=bool)
        too_long = lengths > max_len
        if tcfg.truncate:
            batch = batch.select(np.arange(len(items)), max_len)
            trained = batch.trained_counts()
            emptied = trained == 0
            keep &= ~emptied
            reason, dropped = "truncated_to_nothing", emptied
        else:
            keep &= ~too_long
            reason, dropped = "too_long", too_long
        for idx in np.flatnonzero(dropped):
            self.token_dropped[items[idx].source][reason] += 1
        self.counts[split]["truncated" if tcfg.truncate else "too_long"] += int(too_long.sum())
        if not keep.all():
            batch = batch.select(np.flatnonzero(keep))
            items = [i for i, k in zip(items, keep, strict=True) if k]
            trained = trained[keep]
        lengths = batch.lengths
        for item, n, t in zip(items, lengths.tolist(), trained.tolist(), strict=True):
            s = self.source_tokens[item.source]
            s["sequences"] += 1
            s["tokens"] += n
            s["trained_tokens"] += t
        c = self.counts[split]
        c["sequences"] += len(items)
        c["tokens"] += int(lengths.sum())
        c["trained_tokens"] += int(trained.sum())
        if not len(items):
            return []
        return pack_tables(batch.ids, batch.labels, batch.offsets, max_len, packing=tcfg.packing)

    def _tokenize_pairs(self, items: list[MixedRow], split: str):
        from pt_core.contracts import IGNORE_INDEX, TOKENIZED_PREFERENCE_COLUMNS
        from pt_data.preferences import PairLimits, ParallelPairs, get_preference_tokenizer

        tcfg = self.cfg.tokenizer
        assert tcfg is not None  # tokenized: data.tokenizer is set
        if self.pairs is None:
            limits = PairLimits(
                tcfg.max_seq_length,
                tcfg.max_prompt_length,
                tcfg.max_completion_length,
                tcfg.truncate,
            )
            pt = get_preference_tokenizer(self.tokenizer, tcfg.chat_template)
            self.pairs = ParallelPairs(pt, limits, self.cfg.num_proc)
        results = self.pairs([i.row for i in items], ids=[i.row.get("id") for i in items])
        rows = []
        c = self.counts[split]
        for item, result in zip(items, results, strict=True):
            if result.row is None:
                self.token_dropped[item.source][result.reason] += 1
                continue
            row = result.row
            tokens = sum(
                len(row[k]) for k in ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
            )
            trained = sum(
                1 for k in ("chosen_labels", "rejected_labels") for x in row[k] if x != IGNORE_INDEX
            )
            for counts in (c, self.source_tokens[item.source]):
                counts["pairs"] += 1
                counts["tokens"] += tokens
                counts["trained_tokens"] += trained
            c["truncated"] += result.truncated
            c["boundary_merged"] += result.boundary_merged
            rows.append(row)
        return rows_table(rows, f"{split} pairs", token_columns=TOKENIZED_PREFERENCE_COLUMNS)

    def _dataset_info(self, splits_written: list[str]) -> dict[str, Any]:
        cfg = self.cfg
        fmt = self.output_format()
        splits = {s: self.counts[s]["rows"] for s in splits_written}
        info: dict[str, Any] = {
            "format": fmt,
            "tokenized": self.tokenized,
            "splits": splits,
            "counts": {s: dict(self.counts[s]) for s in splits_written},
            "config_hash": data_hash(cfg),
            "created_by": f"pt-data {__version__}",
            "sources": {
                name: {**st.as_dict(), **dict(self.source_tokens.get(name, {}))}
                for name, st in self.mixer.stats.items()
            },
            "bad_lines": sum(s.bad_lines for s in self.mixer.stats.values()),
            "dropped": self._dropped(),
        }
        if cfg.tokenizer is not None:
            t = cfg.tokenizer
            # __init__ loads both whenever data.tokenizer is set
            assert self.ct is not None and self.tokenizer is not None
            train = self.counts.get("train") or next(iter(self.counts.values()))
            # What a trainer checks before it trains these ids (pt_core.chat): which
            # vocabulary made them (fingerprint) and the template they were rendered with
            # (its source: a name or a relative path would not be found again elsewhere).
            local = Path(t.name_or_path)
            info["tokenizer"] = {
                "name_or_path": str(local.resolve()) if local.exists() else t.name_or_path,
                "chat_template": t.chat_template,
                "template": self.ct.renderer.source,
                "end_of_turn": [
                    self.tokenizer.convert_ids_to_tokens(i)
                    for i in end_of_turn_ids(self.tokenizer, self.ct.renderer.source)
                ],
                "fingerprint": tokenizer_fingerprint(self.tokenizer),
                "vocab_size": len(self.tokenizer),
                "train_on": t.train_on,
                "bos_token": self.tokenizer.bos_token,
                "eos_token": self.tokenizer.eos_token,
            }
            info["max_seq_length"] = t.max_seq_length
            info["tokens"] = sum(c["tokens"] for c in self.counts.values())
            if fmt == "preferences":
                del info["tokenizer"]["train_on"]
                info["max_prompt_length"] = t.max_prompt_length
                info["max_completion_length"] = t.max_completion_length
                info["truncate"] = t.truncate
                info["pairs"] = sum(c["pairs"] for c in self.counts.values())
                info["truncated"] = sum(c["truncated"] for c in self.counts.values())
                info["boundary_merged"] = sum(c["boundary_merged"] for c in self.counts.values())
            else:
                info["packing"] = t.packing
                info["packing_efficiency"] = (
                    round(train["tokens"] / (train["rows"] * t.max_seq_length), 4)
                    if train["rows"]
                    else 0.0
                )
        info["config"] = cfg.model_dump(mode="json")
        return info


def build(
    cfg: DataConfig,
    *,
    out_dir: str | Path | None = None,
    skip_bad: bool | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, Any] | None:
    """Build the dataset described by ``cfg``; return the manifest fields.

    Returns ``{"path", "format", "rows", "splits", "tokens", "packing_efficiency",
    "config_hash", ...}``; ``rows`` counts the train split. With ``shard`` ``(i, N)``,
    builds that shard's chunks; returns None when other shards still have chunks to build
    (the last shard to finish assembles the dataset and returns its fields).
    """
    target = out_dir or cfg.out_dir
    if not target:
        raise ConfigError(
            "no output directory: set data.output_dir",
            hint="add output_dir: out/data/<name> under data:, or pass --out DIR",
        )
    out = Path(target)
    builder = Builder(cfg, skip_bad=skip_bad)
    info = builder.run(out, shard)
    if info is None:
        return None
    read = sum(s["read"] for s in info["sources"].values())
    dropped = info["dropped"]
    log.info(
        "wrote %s (%s): %s; %d read, %s",
        out,
        info["format"],
        ", ".join(f"{k} {v} rows" for k, v in info["splits"].items()),
        read,
        dropped_summary(dropped, dedup=cfg.dedup) if dropped else "none dropped",
    )
    return manifest_fields(out, info)


def dropped_summary(
    dropped: dict[str, int], *, dedup: str = "prompt", keep: str = "data.dedup: none keeps them"
) -> str:
    """How many rows were dropped and why, e.g. ``9 dropped: 9 duplicate (a repeat of an
    earlier prompt; data.dedup: none keeps them)``; ``keep`` says how to keep repeats."""
    parts = []
    for reason, count in sorted(dropped.items(), key=lambda item: -item[1]):
        if reason == "duplicate":
            seen = "prompt" if dedup == "prompt" else "row"
            parts.append(f"{count} duplicate (a repeat of an earlier {seen}; {keep})")
        else:
            parts.append(f"{count} {reason}")
    return f"{sum(dropped.values())} dropped: {', '.join(parts)}"


def manifest_fields(out: Path, info: dict[str, Any]) -> dict[str, Any]:
    fields = {
        "path": str(out),
        "format": info["format"],
        "tokenized": info["tokenized"],
        "rows": info["splits"].get("train", sum(info["splits"].values())),
        "splits": info["splits"],
        "config_hash": info["config_hash"],
        "bad_lines": info["bad_lines"],
        "dropped": info["dropped"],
    }
    for key in ("tokens", "packing_efficiency", "max_seq_length", "truncated"):
        if key in info:
            fields[key] = info[key]
    return fields
