"""A fingerprint of the data a run trains on, stored in the run and checked on resume.

A resumed run is the same run only if it reads the same rows. The frozen config checks
``data.path``; the fingerprint checks what is at that path, so a dataset rebuilt or edited
in place between the interruption and the rerun is refused, not silently mixed in:

    fingerprint = data_fingerprint(cfg.data.path, cfg.data.split)
    check_data_fingerprint(run_dir, fingerprint, force_resume=force_resume)   # on resume
    write_data_fingerprint(run_dir, fingerprint)                             # rank 0

It covers exactly the files the trainer reads (``split_path`` then ``row_files``, as
``pt_train.data`` does), and is cheap: per file, its size and a hash of its first and last
``EDGE_BYTES`` (a parquet file's footer, at its end, holds its schema and row-group
statistics); for a pt-data dataset directory also ``dataset.json``'s ``config_hash`` and
the split's row count. Modification times are left out, so a copied or moved dataset keeps
its fingerprint. An edit in the middle of a file larger than twice ``EDGE_BYTES`` that
keeps its size is not seen.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pt_core.errors import ConfigError
from pt_core.files import atomic_write_json, read_dataset_info, row_files, split_path
from pt_core.log import get_logger

log = get_logger(__name__)

FINGERPRINT_FILE = "data_fingerprint.json"
EDGE_BYTES = 1 << 20


def data_fingerprint(path: str | os.PathLike, split: str = "train") -> dict:
    """The fingerprint of the rows the trainer reads from ``path`` (its ``split`` when it is
    a dataset directory): ``{"digest", "path", "split", "files", ...}``. ``digest`` covers
    everything but ``path``."""
    root = Path(path)
    source = split_path(root, split)
    files = row_files(source)
    base = source if source.is_dir() else source.parent
    content: dict = {
        "files": {f.relative_to(base).as_posix(): _file_signature(f) for f in files},
    }
    info = read_dataset_info(root) if root.is_dir() else None
    if info is not None:
        content["config_hash"] = info.get("config_hash")
        content["rows"] = (info.get("splits") or {}).get(split)
    digest = hashlib.blake2b(
        json.dumps(content, sort_keys=True).encode(), digest_size=8
    ).hexdigest()
    return {"digest": digest, "path": str(root.resolve()), "split": split, **content}


def _file_signature(path: Path) -> dict:
    size = path.stat().st_size
    edges = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as fh:
        edges.update(fh.read(EDGE_BYTES))
        if size > EDGE_BYTES:
            fh.seek(max(EDGE_BYTES, size - EDGE_BYTES))
            edges.update(fh.read(EDGE_BYTES))
    return {"size": size, "edges": edges.hexdigest()}


def write_data_fingerprint(run_dir: str | os.PathLike, fingerprint: dict) -> Path:
    """Store ``fingerprint`` as ``<run_dir>/data_fingerprint.json`` (atomically)."""
    return atomic_write_json(Path(run_dir) / FINGERPRINT_FILE, fingerprint)


def read_data_fingerprint(run_dir: str | os.PathLike) -> dict | None:
    path = Path(run_dir) / FINGERPRINT_FILE
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def check_data_fingerprint(
    run_dir: str | os.PathLike, fingerprint: dict, *, force_resume: bool = False
) -> None:
    """Refuse to resume ``run_dir`` on data whose fingerprint differs from the stored one
    (a run that stored none, from before fingerprints, is not checked). With
    ``force_resume`` the difference is logged and the run goes on."""
    stored = read_data_fingerprint(run_dir)
    if stored is None or stored.get("digest") == fingerprint["digest"]:
        return
    what = (
        f"{run_dir} was started on different data: {fingerprint['path']} "
        f"({fingerprint['split']}) has fingerprint {fingerprint['digest']} now, "
        f"{stored.get('digest')} when the run started ({_differences(stored, fingerprint)})"
    )
    if force_resume:
        log.warning("resuming on changed data (forced): %s", what)
        return
    raise ConfigError(
        what,
        hint="resume with the data the run started with, use a new run_name, or pass "
        "--force-resume to continue anyway with this data",
    )


def _differences(old: dict, new: dict) -> str:
    """What changed, in words: config hash, row count, files added, removed or changed."""
    notes = []
    for key in ("config_hash", "rows"):
        if old.get(key) != new.get(key):
            notes.append(f"{key} {old.get(key)} -> {new.get(key)}")
    old_files, new_files = old.get("files", {}), new.get("files", {})
    added = sorted(set(new_files) - set(old_files))
    removed = sorted(set(old_files) - set(new_files))
    changed = sorted(n for n in set(old_files) & set(new_files) if old_files[n] != new_files[n])
    for label, names in (("added", added), ("removed", removed), ("changed", changed)):
        if names:
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            notes.append(f"{label}: {shown}")
    return "; ".join(notes) or "contents differ"
