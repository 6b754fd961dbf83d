"""Raw rows from wherever they are: local files and globs, saved datasets, the hub.

Every source is streamed: jsonl line by line, parquet batch by batch, csv in
blocks, and ``datasets`` tables through their memory-mapped Arrow files. Nothing
is loaded whole into memory.

Resolution order for ``source``:

1. a glob pattern (``data/*.jsonl``) -> the matching files, sorted;
2. an existing file -> read by suffix (.jsonl, .json, .parquet, .csv);
3. an existing directory -> written by ``Dataset.save_to_disk`` (``load_from_disk``),
   a directory of row files, or a hub-style dataset folder (``load_dataset(path)``);
4. anything else -> a Hugging Face dataset name, loaded with ``load_dataset``. Offline
   (``HF_DATASETS_OFFLINE=1``) this uses the local ``datasets`` cache.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import ROW_SUFFIXES, iter_rows
from pt_data.config import DatasetSpec

LOCAL_SUFFIXES = ROW_SUFFIXES
GLOB_CHARS = set("*?[")


class BadRows:
    """How many malformed lines were skipped (only with ``skip_bad``)."""

    def __init__(self) -> None:
        self.counter = [0]

    @property
    def count(self) -> int:
        return self.counter[0]


def iter_source(
    spec: DatasetSpec, *, skip_bad: bool = False, bad: BadRows | None = None
) -> Iterator[dict]:
    """The raw rows of one dataset entry, renamed by ``spec.columns``, at most ``max_rows``."""
    rows = _iter_raw(spec, skip_bad=skip_bad, bad=bad or BadRows())
    limit = spec.max_rows
    renames = spec.columns
    for n, row in enumerate(rows):
        if limit is not None and n >= limit:
            return
        if renames:
            row = {renames.get(k, k): v for k, v in row.items()}
        yield row


def _iter_raw(spec: DatasetSpec, *, skip_bad: bool, bad: BadRows) -> Iterator[dict]:
    source = os.path.expanduser(spec.source)
    if GLOB_CHARS & set(source):
        files = sorted(glob.glob(source, recursive=True))
        files = [f for f in files if Path(f).suffix in LOCAL_SUFFIXES]
        if not files:
            raise InputError(
                f"{spec.source}: the pattern matches no .jsonl/.json/.parquet/.csv file",
                hint="check the path; patterns are relative to the current directory",
            )
        for f in files:
            yield from _iter_file(Path(f), skip_bad, bad)
        return
    path = Path(source)
    if path.is_file():
        yield from _iter_file(path, skip_bad, bad)
        return
    if path.is_dir():
        yield from _iter_dir(path, spec, skip_bad, bad)
        return
    if _looks_like_path(spec.source):
        raise InputError(
            f"{spec.source}: no such file or directory",
            hint="give an existing file, directory or glob, or a Hugging Face dataset name",
        )
    yield from _iter_hub(spec)


def _looks_like_path(source: str) -> bool:
    return (
        source.startswith((".", "/", "~"))
        or Path(source).suffix in LOCAL_SUFFIXES
        or source.count("/") > 1
    )


def _iter_file(path: Path, skip_bad: bool, bad: BadRows) -> Iterator[dict]:
    if path.suffix in ROW_SUFFIXES:
        yield from iter_rows(path, skip_bad=skip_bad, bad_counter=bad.counter)
    else:
        raise InputError(
            f"{path}: unknown data file type '{path.suffix}'",
            hint="use .jsonl, .json, .parquet or .csv",
        )


def _iter_dir(path: Path, spec: DatasetSpec, skip_bad: bool, bad: BadRows) -> Iterator[dict]:
    if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
        from datasets import DatasetDict, load_from_disk

        ds = load_from_disk(str(path))
        if isinstance(ds, DatasetDict):
            if spec.split not in ds:
                splits = ", ".join(map(str, ds))
                raise InputError(
                    f"{path}: no split {spec.split!r}; it has {splits}",
                    hint=f"set split: to one of {splits}",
                )
            ds = ds[spec.split]
        yield from _iter_dataset(ds)
        return
    files = sorted(f for f in path.iterdir() if f.suffix in LOCAL_SUFFIXES and f.is_file())
    if files and not (path / "README.md").exists():
        for f in files:
            yield from _iter_file(f, skip_bad, bad)
        return
    yield from _iter_hub(spec, path=str(path))


def _iter_hub(spec: DatasetSpec, path: str | None = None) -> Iterator[dict]:
    import datasets

    name = path or spec.source
    try:
        ds = datasets.load_dataset(
            name,
            spec.subset,
            split=spec.split,
            revision=spec.revision,
            data_files=spec.data_files,
        )
    except (ConnectionError, FileNotFoundError, ValueError) as exc:
        offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get(
            "HF_HUB_OFFLINE"
        ) in ("1", "true")
        raise InputError(
            f"{name}: cannot load this dataset ({type(exc).__name__}: {exc})",
            hint=(
                "offline, a hub dataset must be in the local datasets cache "
                "(HF_DATASETS_CACHE) or given as files / a save_to_disk directory"
                if offline
                else "check the name, subset and split, or give local files"
            ),
        ) from None
    yield from _iter_dataset(ds)


def _iter_dataset(ds, batch_size: int = 1000) -> Iterator[dict]:
    for batch in ds.iter(batch_size=batch_size):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys), strict=True):
            yield dict(zip(keys, values, strict=True))
