"""Mixing datasets: transform, filter, de-duplicate, weight and split, as one stream.

Semantics, all deterministic under ``seed``:

* **weight** is a per-dataset sampling factor applied to the rows that survive
  transform, filters and de-duplication: each row is emitted ``floor(w)`` times, and
  once more with probability ``w - floor(w)``. So ``weight: 0.5`` keeps about half of a
  dataset, ``weight: 2`` repeats it twice, ``weight: 0`` drops it. The share of
  dataset ``i`` in the output is ``w_i * n_i / sum_j(w_j * n_j)`` (``n`` = its kept rows),
  exact for whole weights and within sampling noise for fractional ones. Streaming
  needs no row counts up front.
* **dedup** (``prompt`` by default) drops a row whose prompt (every message before the
  last assistant turn, or the ``prompt`` of prompts/preferences rows) was already
  seen, in config order, across all datasets; ``row`` compares whole rows; ``none`` keeps all.
* **validation_split** sends a row to ``validation`` when a hash of ``(seed, prompt)``
  falls below the fraction, so every copy of a row (weights > 1) lands in the same split
  and no prompt is both trained on and validated on.
* Filters drop rows with a malformed message (no role, non-text content), an empty
  turn (an assistant turn of tool calls is not empty), no assistant content, or more
  than ``filters.max_chars`` characters; every drop is counted per dataset and reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pt_core.errors import ConfigError, InputError
from pt_data.config import DataConfig, DatasetSpec
from pt_data.sources import BadRows, iter_source
from pt_data.transforms import SkipRow, Transform, get_transform, infer_kind


@dataclass
class SourceStats:
    name: str
    read: int = 0
    kept: int = 0
    emitted: int = 0
    dropped: Counter = field(default_factory=Counter)
    bad_lines: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "kept": self.kept,
            "rows": self.emitted,
            "dropped": dict(self.dropped),
            "bad_lines": self.bad_lines,
        }

    @classmethod
    def from_dict(cls, name: str, d: dict[str, Any]) -> SourceStats:
        """The counts :meth:`as_dict` wrote."""
        return cls(name, d["read"], d["kept"], d["rows"], Counter(d["dropped"]), d["bad_lines"])


@dataclass
class MixedRow:
    split: str
    source: str
    row: dict


def prompt_key(row: dict, kind: str) -> Any:
    """What de-duplication and the split compare: the prompt part of a row."""
    if kind == "conversations":
        msgs = row["messages"]
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=len(msgs))
        return msgs[:last]
    return row.get("prompt")


def stable_hash(obj: Any) -> bytes:
    text = json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def unit_interval(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts``."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def filter_reason(row: dict, kind: str, cfg: DataConfig) -> str | None:
    """Why a transformed row is dropped, or None to keep it."""
    f = cfg.filters
    if kind == "conversations":
        msgs = row["messages"]
        if not isinstance(msgs, list) or any(
            not isinstance(m, dict) or not isinstance(m.get("content"), str) or not m.get("role")
            for m in msgs
        ):
            return "malformed_message"  # no role, or content that is not text
        # an assistant turn of tool calls has no text and is not empty: the calls are its reply
        if f.drop_empty_turns and any(
            not m["content"].strip() and not m.get("tool_calls") for m in msgs
        ):
            return "empty_turn"
        assistant = [m for m in msgs if m.get("role") == "assistant"]
        calls = any(m.get("tool_calls") for m in assistant)
        if not assistant or (
            not calls and sum(len(m["content"]) for m in assistant) <= f.min_assistant_chars
        ):
            return "no_assistant"
        text_len = sum(len(m["content"]) for m in msgs if isinstance(m.get("content"), str))
    elif kind == "preferences":
        texts = [
            str(m.get("content") or "") if isinstance(m, dict) else str(m)
            for key in ("prompt", "chosen", "rejected")
            for m in (row[key] if isinstance(row[key], list) else [row[key]])
        ]
        if f.drop_empty_turns and any(not t.strip() for t in texts):
            return "empty_turn"
        text_len = sum(len(t) for t in texts)
    else:
        prompt = row.get("prompt")
        if f.drop_empty_turns and (
            not prompt
            or (isinstance(prompt, str) and not prompt.strip())
            or (
                isinstance(prompt, list)
                and any(not str(m.get("content", "")).strip() for m in prompt)
            )
        ):
            return "empty_turn"
        text_len = len(json.dumps(prompt, ensure_ascii=False))
    if f.max_chars is not None and text_len > f.max_chars:
        return "too_long_chars"
    return None


class SeenKeys:
    """The 64-bit keys seen so far, in 8 bytes each: a sorted array, and the newest keys in
    a set of at most ``recent`` that is merged into it when full. (A set of digests would
    take about 100 bytes a row; at 10M rows, 1 GB.)"""

    def __init__(self, recent: int = 1 << 18):
        import numpy as np

        self.old = np.zeros(0, dtype=np.uint64)
        self.new: set[int] = set()
        self.recent = recent

    def add(self, key: int) -> bool:
        """Add ``key``; False when it was there already."""
        import numpy as np

        if key in self.new:
            return False
        old = self.old
        if old.size:
            at = int(np.searchsorted(old, np.uint64(key)))
            if at < old.size and int(old[at]) == key:
                return False
        self.new.add(key)
        if len(self.new) >= self.recent:
            merged = np.fromiter(self.new, dtype=np.uint64, count=len(self.new))
            self.old = np.union1d(old, merged)
            self.new = set()
        return True

    def __len__(self) -> int:
        return int(self.old.size) + len(self.new)


class Mixer:
    """Streams the mixed rows of a ``data:`` config and keeps per-dataset counts."""

    def __init__(self, cfg: DataConfig, *, skip_bad: bool | None = None):
        self.cfg = cfg
        self.skip_bad = cfg.skip_bad if skip_bad is None else skip_bad
        self.transforms: list[Transform] = []
        names = []
        for spec in cfg.datasets:
            t = get_transform(spec.transform_name)
            t.check_options(spec.transform_options)
            self.transforms.append(t)
            name = spec.display_name
            while name in names:  # two entries from one file get distinct names
                name += "'"
            names.append(name)
        self.names = names
        self.stats = {n: SourceStats(n) for n in names}
        self.kind: str | None = None
        self._seen = SeenKeys()

    def transformed(
        self, index: int, limit: int | None = None
    ) -> Iterator[tuple[dict, dict | None, str | None]]:
        """``(raw, transformed, None)`` of one dataset's rows, before filters (for inspect); a
        row the transform drops comes as ``(raw, None, reason)``."""
        spec, t = self.cfg.datasets[index], self.transforms[index]
        bad = BadRows()
        for n, raw in enumerate(iter_source(spec, skip_bad=self.skip_bad, bad=bad)):
            if limit is not None and n >= limit:
                break
            try:
                out = self._apply(spec, t, raw, n)
            except SkipRow as skip:
                yield raw, None, skip.reason
            else:
                yield raw, out, None if out is not None else "transform"

    def _apply(self, spec: DatasetSpec, t: Transform, raw: dict, n: int) -> dict | None:
        try:
            out = t.fn(raw, **spec.transform_options)
        except InputError as exc:
            raise InputError(
                f"{spec.source} row {n + 1} ({t.name} transform): {exc.message}", hint=exc.hint
            ) from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputError(
                f"{spec.source} row {n + 1}: transform {t.name!r} failed "
                f"({type(exc).__name__}: {exc}); the row has columns {', '.join(map(repr, raw))}",
                hint="pick the transform that matches these columns, or rename columns with "
                "'columns: {old: new}'",
            ) from None
        if out is None:
            return None
        if not isinstance(out, dict):
            raise InputError(
                f"transform {t.name!r} returned {type(out).__name__}; expected a dict or None"
            )
        kind = t.kind or infer_kind(out)
        if self.kind is None:
            self.kind = kind
        elif kind != self.kind:
            raise ConfigError(
                f"dataset {spec.source!r} (transform {t.name!r}) makes {kind} rows, but earlier "
                f"datasets make {self.kind} rows; one output holds one kind",
                hint="build each kind into its own output_dir",
            )
        return out

    def rows(self) -> Iterator[MixedRow]:
        cfg = self.cfg
        for index, spec in enumerate(cfg.datasets):
            stats = self.stats[self.names[index]]
            t = self.transforms[index]
            rng = random.Random(f"{cfg.seed}:{index}:{spec.source}")
            whole, frac = math.floor(spec.weight), spec.weight - math.floor(spec.weight)
            bad = BadRows()
            for n, raw in enumerate(iter_source(spec, skip_bad=self.skip_bad, bad=bad)):
                stats.read += 1
                try:
                    out = self._apply(spec, t, raw, n)
                except SkipRow as skip:
                    stats.dropped[skip.reason] += 1
                    continue
                if out is None:
                    stats.dropped["transform"] += 1
                    continue
                assert self.kind is not None  # _apply set it from the first row's transform
                reason = filter_reason(out, self.kind, cfg)
                if reason is not None:
                    stats.dropped[reason] += 1
                    continue
                key = prompt_key(out, self.kind)
                if cfg.dedup != "none":
                    digest = stable_hash(key if cfg.dedup == "prompt" else out)
                    if not self._seen.add(int.from_bytes(digest[:8], "big")):
                        stats.dropped["duplicate"] += 1
                        continue
                stats.kept += 1
                copies = whole + (1 if frac and rng.random() < frac else 0)
                if not copies:
                    continue
                split = "train"
                if cfg.validation_split and unit_interval(cfg.seed, stable_hash(key)) < (
                    cfg.validation_split
                ):
                    split = "validation"
                out.setdefault("source", self.names[index])
                if "id" not in out:
                    out["id"] = f"{self.names[index]}-{n}"
                for _ in range(copies):
                    stats.emitted += 1
                    yield MixedRow(split, self.names[index], out)
            stats.bad_lines = bad.count
