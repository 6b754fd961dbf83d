"""The one JSON line a stage prints on stdout, and reading it back from a pipe.

    pt-data build data.yaml | pt-train run train.yaml --data -

The upstream stage prints ``{"kind": "dataset", "path": "...", ...}`` as its
last stdout line; the downstream stage, given ``-``, reads stdin, takes the
last manifest line and uses its ``path``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, Any

from pt_core.errors import InputError

KINDS = ("dataset", "tokenizer", "checkpoint", "rollouts", "scores", "grades", "job")


def make_manifest(kind: str, path: str | Path, **fields: Any) -> dict:
    if kind not in KINDS:
        raise ValueError(f"unknown manifest kind {kind!r}; expected one of {KINDS}")
    return {"kind": kind, "path": str(Path(path).resolve()), **fields}


def emit_manifest(
    kind: str, path: str | Path, *, stream: IO[str] | None = None, **fields: Any
) -> dict:
    """Print the stage's manifest as one JSON line on stdout and return it."""
    manifest = make_manifest(kind, path, **fields)
    out = stream or sys.stdout
    out.write(json.dumps(manifest, ensure_ascii=False, default=str) + "\n")
    out.flush()
    return manifest


def read_manifest(
    stream: IO[str] | None = None, *, expected: tuple[str, ...] | None = None
) -> dict:
    """Read the last manifest line from ``stream`` (stdin by default).

    Lines that are not JSON objects with ``kind`` and ``path`` are ignored, so
    an upstream stage that printed something else first still pipes.
    """
    stream = stream or sys.stdin
    if stream is None:  # the process was started with stdin closed
        raise InputError(
            "'-' means: read the upstream stage's manifest from stdin, but stdin is closed",
            hint="pipe a stage into this one or pass a path instead of '-'",
        )
    if stream.isatty():
        raise InputError(
            "'-' means: read the upstream stage's manifest from stdin, but stdin is a terminal",
            hint="pipe a stage into this one (pt-data build data.yaml | pt-train run train.yaml "
            "--data -) or pass a path instead of '-'",
        )
    manifest = None
    for line in stream.read().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "kind" in obj and "path" in obj:
            manifest = obj
    if manifest is None:
        raise InputError(
            "no manifest on stdin: expected a JSON line with 'kind' and 'path' from the upstream stage",
            hint="check that the upstream stage succeeded (its errors are on stderr), or pass a path",
        )
    if expected and manifest["kind"] not in expected:
        raise InputError(
            f"upstream manifest is of kind {manifest['kind']!r}, this input takes "
            f"{' or '.join(map(repr, expected))}",
            hint="pipe the matching stage into this one",
        )
    return manifest


def resolve_input(
    value: str | os.PathLike[str],
    *,
    expected: tuple[str, ...] | None = None,
    stream: IO[str] | None = None,
) -> tuple[Path, dict | None]:
    """An input argument as a path: ``-`` reads the upstream manifest from stdin.

    Returns the path and the manifest (None when a plain path was given).
    """
    if str(value) == "-":
        manifest = read_manifest(stream, expected=expected)
        return Path(manifest["path"]), manifest
    path = Path(value)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory")
    return path, None
