"""User Python named in a config or on a command line: ``package.module:name`` (importable
from where the tool runs) or ``path/to/file.py:name`` (a file, loaded by its path)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from pt_core.errors import ConfigError


def load_object(spec: str, *, key: str, what: str = "function") -> Any:
    """The object ``spec`` names; ``key`` (the config key or option that gave it) and
    ``what`` (a function, a class) word the error when it cannot be loaded."""
    module_name, sep, name = str(spec).rpartition(":")
    if not sep or not module_name or not name.isidentifier():
        raise ConfigError(
            f"{key}={spec!r} does not name a {what}",
            hint=f"give module:{'Class' if what == 'class' else 'function'} or "
            f"path/to/file.py:{'Class' if what == 'class' else 'function'}",
        )
    try:
        if module_name.endswith(".py"):
            module = _module_from_file(Path(module_name), key)
        else:
            module = importlib.import_module(module_name)
    except ConfigError:
        raise
    except Exception as exc:  # the user's module failed to import: say so, with its error
        raise ConfigError(
            f"{key}={spec!r}: importing {module_name} failed ({type(exc).__name__}: {exc})",
            hint="give a module importable from where pt runs (or a path to a .py file)",
        ) from None
    obj = getattr(module, name, None)
    if obj is None:
        raise ConfigError(
            f"{key}={spec!r}: {module_name} has no {name}",
            hint=f"name a {what} defined in {module_name}",
        )
    if what == "class" and not isinstance(obj, type):
        raise ConfigError(f"{key}={spec!r} is not a class", hint="name a class")
    if what == "function" and not callable(obj):
        raise ConfigError(f"{key}={spec!r} is not a function", hint="name a function")
    return obj


def _module_from_file(path: Path, key: str):
    if not path.is_file():
        raise ConfigError(f"{key}: {path}: no such file", hint="give the path of a .py file")
    name = f"pt_user_{path.stem}_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file that exists
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # half run: a second load must run it again, not return it
        raise
    return module
