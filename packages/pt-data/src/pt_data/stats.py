"""Token statistics of a config's data (before writing) or of a built dataset.

Counts per source and overall: sequences, tokens (total, mean, min, max,
percentiles), trained tokens, and a histogram of sequence lengths, printed in the
terminal and optionally drawn to a PNG. For preference pairs: the same figures for
the prompt, the chosen and the rejected answers, and for the longer side of each pair
(prompt + longer answer, what ``max_seq_length`` limits), whose lengths the histogram shows.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_core.files import row_files, split_path

if TYPE_CHECKING:
    from pt_data.config import DataConfig, TokenizerSpec

PERCENTILES = (50, 90, 95, 99)


def summarize(lengths, trained=None) -> dict[str, Any]:
    import numpy as np

    arr = np.asarray(lengths, dtype=np.int64)
    if arr.size == 0:
        return {"sequences": 0, "tokens": 0}
    out: dict[str, Any] = {
        "sequences": int(arr.size),
        "tokens": int(arr.sum()),
        "mean": round(float(arr.mean()), 1),
        "min": int(arr.min()),
        "max": int(arr.max()),
    }
    for p in PERCENTILES:
        out[f"p{p}"] = int(np.percentile(arr, p))
    if trained is not None:
        out["trained_tokens"] = int(np.asarray(trained, dtype=np.int64).sum())
    return out


PAIR_PARTS = ("prompt", "chosen", "rejected")


class PairLengths:
    """Token lengths of pairs: per part, and the trained tokens of each answer."""

    def __init__(self) -> None:
        self.lengths: dict[str, list[int]] = {k: [] for k in PAIR_PARTS}
        self.trained: dict[str, list[int]] = {k: [] for k in ("chosen", "rejected")}

    def add(self, row: dict) -> None:
        for part in PAIR_PARTS:
            self.lengths[part].append(len(row[f"{part}_input_ids"]))
        for side in ("chosen", "rejected"):
            self.trained[side].append(sum(1 for x in row[f"{side}_labels"] if x != -100))

    @property
    def longer_side(self) -> list[int]:
        return [p + max(c, r) for p, c, r in zip(*self.lengths.values(), strict=True)]

    def result(self, max_len: int | None) -> dict[str, Any]:
        longer = self.longer_side
        out: dict[str, Any] = {
            "format": "preferences",
            "pairs": len(longer),
            "parts": {
                part: summarize(self.lengths[part], self.trained.get(part)) for part in PAIR_PARTS
            },
            "overall": summarize(longer),
            "histogram": histogram(longer),
        }
        if max_len:
            out["max_seq_length"] = max_len
            out["over_max_seq_length"] = sum(1 for n in longer if n > max_len)
        out["_lengths"] = longer
        return out


def _config_rows(cfg, limit: int | None, skip_bad: bool | None):
    from pt_data.mix import Mixer

    mixer = Mixer(cfg, skip_bad=skip_bad)
    items = []
    for n, item in enumerate(mixer.rows()):
        if limit is not None and n >= limit:
            break
        items.append(item)
    if not items:
        raise InputError("the config's datasets give no rows", hint="see pt-data inspect")
    return mixer, items


def pair_stats_from_config(cfg, mixer, items) -> dict[str, Any]:
    """Tokenize a config's preference rows without writing; the pair figures and the drops
    (of the mixer, then of the tokenizer's length policy)."""
    from pt_data.build import load_tokenizer
    from pt_data.preferences import PairCounts, PairLimits, ParallelPairs, PreferenceTokenizer

    t = cfg.tokenizer
    pt = PreferenceTokenizer(load_tokenizer(t.name_or_path), chat_template=t.chat_template)
    limits = PairLimits(t.max_seq_length, t.max_prompt_length, t.max_completion_length, t.truncate)
    with ParallelPairs(pt, limits, cfg.num_proc) as tokenize:
        results = tokenize([i.row for i in items], ids=[i.row.get("id") for i in items])
    lengths, counts = PairLengths(), PairCounts()
    for source in mixer.stats.values():
        counts.dropped.update(source.dropped)
    for result in results:
        counts.add(result)
        if result.row is not None:
            lengths.add(result.row)
    out = lengths.result(t.max_seq_length)
    out["dropped"] = counts.as_dict()["dropped"]
    out["truncated"] = counts.truncated
    return out


def _need_tokenizer(cfg: DataConfig) -> TokenizerSpec:
    if cfg.tokenizer is None:
        raise InputError(
            "stats needs token counts, and this config has no data.tokenizer",
            hint="add data.tokenizer.name_or_path, or pass data.tokenizer.name_or_path=DIR",
        )
    return cfg.tokenizer


def lengths_from_config(
    cfg, *, limit: int | None = None, skip_bad: bool | None = None, items=None
) -> dict[str, dict[str, list[int]]]:
    """Tokenize a config's mixed conversations without writing (``items``: rows already
    mixed): ``{source: {lengths, trained}}``."""
    from pt_data.build import load_tokenizer
    from pt_data.tokenize import ConversationTokenizer, ParallelEncoder

    _need_tokenizer(cfg)
    if items is None:
        mixer, items = _config_rows(cfg, limit, skip_bad)
        if mixer.kind not in (None, "conversations"):
            raise InputError(f"these rows are {mixer.kind}; conversations were expected")
    tok = load_tokenizer(cfg.tokenizer.name_or_path)
    ct = ConversationTokenizer(
        tok, chat_template=cfg.tokenizer.chat_template, train_on=cfg.tokenizer.train_on
    )
    out: dict[str, dict[str, list[int]]] = defaultdict(lambda: {"lengths": [], "trained": []})
    with ParallelEncoder(ct, cfg.num_proc) as encode:
        batch = encode(
            [i.row["messages"] for i in items],
            ids=[i.row.get("id") for i in items],
            tools=[i.row.get("tools") for i in items],
        )
    for item, n, t in zip(
        items, batch.lengths.tolist(), batch.trained_counts().tolist(), strict=True
    ):
        out[item.source]["lengths"].append(n)
        out[item.source]["trained"].append(t)
    return dict(out)


def pair_lengths_from_dataset(
    path: str | Path, split: str = "train", skip_bad: bool = False
) -> PairLengths:
    """Prompt, chosen and rejected lengths of a built tokenized preference dataset."""
    from pt_core.contracts import TOKENIZED_PREFERENCE_COLUMNS
    from pt_core.files import iter_rows, require_columns

    lengths = PairLengths()
    source = split_path(path, split)
    for row in iter_rows(source, skip_bad=skip_bad):
        require_columns(row, TOKENIZED_PREFERENCE_COLUMNS, str(source))
        lengths.add(row)
    return lengths


def is_pair_dataset(path: str | Path, split: str = "train", skip_bad: bool = False) -> bool:
    """Whether the rows of ``path`` are tokenized preference pairs (from the first file)."""
    import pyarrow.parquet as pq

    from pt_core.files import iter_rows

    first = row_files(split_path(path, split))[0]
    if first.suffix == ".parquet":
        return "prompt_input_ids" in pq.ParquetFile(first).schema_arrow.names
    return "prompt_input_ids" in next(iter_rows(first, skip_bad=skip_bad), {})


def lengths_from_dataset(
    path: str | Path, split: str = "train", skip_bad: bool = False
) -> dict[str, dict[str, list[int]]]:
    """Sequence lengths of a built tokenized dataset (or a tokenized parquet/jsonl file)."""
    import pyarrow.parquet as pq

    from pt_core.files import iter_rows

    lengths: list[int] = []
    trained: list[int] = []
    rows = 0
    for f in row_files(split_path(path, split)):
        if f.suffix == ".parquet":
            names = pq.ParquetFile(f).schema_arrow.names
            if "input_ids" not in names:
                raise InputError(
                    f"{f}: not a tokenized dataset (columns: {', '.join(names)})",
                    hint="run stats on the config instead, which tokenizes the rows",
                )
            n, seq, per_row = _parquet_lengths(f, names)
            rows += n
            lengths += seq
            trained += per_row
        else:
            for row in iter_rows(f, skip_bad=skip_bad):
                if "input_ids" not in row:
                    raise InputError(f"{f}: not a tokenized dataset (no 'input_ids')")
                rows += 1
                lengths += row.get("seq_lens") or [len(row["input_ids"])]
                trained.append(sum(1 for x in row["labels"] if x != -100))
    return {split: {"lengths": lengths, "trained": trained, "rows": [rows]}}


def _parquet_lengths(f: Path, names: list[str]) -> tuple[int, list[int], list[int]]:
    """Rows, sequence lengths and trained tokens per row of a tokenized parquet file, a
    batch of rows at a time in Arrow's columns (no Python loop over rows or tokens)."""
    import numpy as np
    import pyarrow.parquet as pq

    cols = ["seq_lens", "labels"] if "seq_lens" in names else ["input_ids", "labels"]
    rows, lengths, trained = 0, [], []
    for batch in pq.ParquetFile(f).iter_batches(batch_size=8192, columns=cols):
        labels = batch.column("labels")
        rows += batch.num_rows
        if "seq_lens" in cols:
            lengths.append(batch.column("seq_lens").flatten().to_numpy())
        else:
            lengths.append(batch.column("input_ids").value_lengths().to_numpy())
        parents = labels.value_parent_indices().to_numpy()
        kept = labels.flatten().to_numpy() != IGNORE_INDEX
        trained.append(np.bincount(parents[kept], minlength=batch.num_rows))

    def flat(parts: list) -> list[int]:
        return np.concatenate(parts).tolist() if parts else []

    return rows, flat(lengths), flat(trained)


def compute_stats(
    target: str,
    overrides: list[str] | None = None,
    *,
    split: str = "train",
    limit: int | None = None,
    skip_bad: bool = False,
) -> dict[str, Any]:
    """Stats of a config file (YAML) or a built dataset (directory / file)."""
    p = Path(target)
    built_sources = None
    if p.suffix in (".yaml", ".yml"):
        from pt_data.config import load_data_config

        cfg = load_data_config(p, overrides)
        tcfg = _need_tokenizer(cfg)
        mixer, items = _config_rows(cfg, limit, skip_bad or None)
        if mixer.kind == "preferences":
            return pair_stats_from_config(cfg, mixer, items)
        if mixer.kind not in (None, "conversations"):
            raise InputError(
                f"stats counts the tokens of conversations and preference pairs; the rows of "
                f"{p} are {mixer.kind}",
                hint="run stats on a config whose transforms make conversations or pairs",
            )
        per_source = lengths_from_config(cfg, items=items)
        max_len = tcfg.max_seq_length
    else:
        if overrides:
            raise InputError(f"overrides ({' '.join(overrides)}) apply to a config, not {p}")
        info_path = (p / "dataset.json") if p.is_dir() else None
        info = json.loads(info_path.read_text()) if info_path and info_path.exists() else {}
        if is_pair_dataset(p, split, skip_bad):
            lengths = pair_lengths_from_dataset(p, split, skip_bad)
            if not lengths.longer_side:
                raise InputError(f"{p}: no pairs in split {split!r}")
            return lengths.result(info.get("max_seq_length"))
        per_source = lengths_from_dataset(p, split, skip_bad)
        if not sum(s["rows"][0] for s in per_source.values()):
            raise InputError(f"{p}: no rows in split {split!r}")
        max_len = None
        if info:
            max_len = info.get("max_seq_length")
            built_sources = {
                name: {k: s[k] for k in ("sequences", "tokens", "trained_tokens") if k in s}
                for name, s in info.get("sources", {}).items()
            }
    all_lengths = [n for s in per_source.values() for n in s["lengths"]]
    all_trained = [n for s in per_source.values() for n in s["trained"]]
    result: dict[str, Any] = {
        "overall": summarize(all_lengths, all_trained),
        "sources": {k: summarize(v["lengths"], v["trained"]) for k, v in per_source.items()},
        "histogram": histogram(all_lengths),
    }
    if built_sources:  # packing mixes sources in a row: their totals come from the build
        result["built_sources"] = built_sources
    if max_len:
        result["max_seq_length"] = max_len
        result["over_max_seq_length"] = sum(1 for n in all_lengths if n > max_len)
    if "rows" in next(iter(per_source.values()), {}):
        result["rows"] = per_source[split]["rows"][0]
        if max_len and result["rows"]:
            result["packing_efficiency"] = round(sum(all_lengths) / (result["rows"] * max_len), 4)
    result["_lengths"] = all_lengths
    return result


def histogram(lengths, bins: int = 12) -> list[dict[str, int]]:
    import numpy as np

    if not lengths:
        return []
    arr = np.asarray(lengths)
    lo, hi = int(arr.min()), int(arr.max()) + 1
    width = max(1, -(-(hi - lo) // bins))  # whole-token bins
    counts, edges = np.histogram(arr, bins=np.arange(lo, hi + width, width))
    return [
        {"from": int(edges[i]), "to": int(edges[i + 1]) - 1, "count": int(c)}
        for i, c in enumerate(counts)
    ]


def render_stats(result: dict[str, Any]) -> None:
    from rich.table import Table

    from pt_core.log import console

    pairs = "parts" in result
    title = "token counts per pair" if pairs else "token counts per sequence"
    table = Table(title=title, title_justify="left")
    cols = [
        "sequences",
        "tokens",
        "trained_tokens",
        "mean",
        "min",
        "max",
        *(f"p{p}" for p in PERCENTILES),
    ]
    table.add_column("part" if pairs else "source")
    for c in cols:
        table.add_column(c, justify="right")
    if pairs:
        rows = [*result["parts"].items(), ("longer side", result["overall"])]
    else:
        rows = list(result["sources"].items())
        if len(rows) > 1:
            rows.append(("all", result["overall"]))
    for name, s in rows:
        table.add_row(name, *(str(s.get(c, "")) for c in cols))
    console.print(table)
    if result.get("built_sources"):
        built = Table(title="per source, all splits (recorded at build)", title_justify="left")
        for c in ("source", "sequences", "tokens", "trained_tokens"):
            built.add_column(c, justify="left" if c == "source" else "right")
        for name, s in result["built_sources"].items():
            built.add_row(
                name, *(str(s.get(c, "")) for c in ("sequences", "tokens", "trained_tokens"))
            )
        console.print(built)
    hist = result["histogram"]
    if hist:
        top = max(h["count"] for h in hist) or 1
        console.print("length histogram")
        for h in hist:
            bar = "█" * round(40 * h["count"] / top)
            console.print(f"  {h['from']:>7}-{h['to']:<7} {bar} {h['count']}", highlight=False)
    keys = ("pairs", "rows", "packing_efficiency", "max_seq_length", "over_max_seq_length")
    for key in (*keys, "truncated", "dropped"):
        if key in result:
            console.print(f"{key}: {result[key]}", highlight=False)


def plot_lengths(lengths, path: str | Path, max_seq_length: int | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pt_core.files import atomic_path

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(lengths, bins=50, color="#4477aa")
    if max_seq_length:
        ax.axvline(max_seq_length, color="#cc3311", linestyle="--", label="max_seq_length")
        ax.legend()
    ax.set_xlabel("tokens per sequence")
    ax.set_ylabel("sequences")
    fig.tight_layout()
    target = Path(path)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return target
