"""A package's installed version, written once in its pyproject.toml.

``importlib.metadata.version`` imports the ``email`` and ``zipfile`` machinery to read
one line: 0.1-0.6 s of every command's start on a small machine. The installed
distribution's ``NAME-VERSION.dist-info`` folder already says it, so that is read first;
importlib.metadata is the fallback (an egg, a zip import).
"""

from __future__ import annotations

import os
import sys


def distribution_version(name: str) -> str:
    prefix = name.replace("-", "_") + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            if folder.startswith(prefix) and folder.endswith(".dist-info"):
                return folder[len(prefix) : -len(".dist-info")]
    from importlib.metadata import version

    return version(name)
