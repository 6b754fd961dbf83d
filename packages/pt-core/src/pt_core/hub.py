"""Whether a model or tokenizer name can be loaded from here, answered before loading.

transformers looks up a name that is not a local directory on the Hugging Face hub. With
no route to the hub it retries for about 50 s and then fails with a message about the
network, and a mistyped local path that reads as a hub name (``models/qwen``) takes the
same road. :func:`require_local_or_hub` answers at once instead: a local directory
passes; a hub name passes when the hub is reachable or the local cache holds it; anything
else is one error naming the config key or option that gave the name.

Reachability is one TCP connect to the hub (or to the HTTPS proxy) with a
:data:`CONNECT_TIMEOUT_S` timeout, made once per process and only for a name that is not
local. ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` skip it: offline, only the cache counts.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

from pt_core.errors import InputError, PtError
from pt_core.log import get_logger

log = get_logger(__name__)

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
CONNECT_TIMEOUT_S = 1.5
DEFAULT_ENDPOINT = "https://huggingface.co"
PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")

# A hub repository id: "name" or "namespace/name" of letters, digits, '-', '_' and '.'.
_HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# huggingface_hub's spelling of a true environment variable
_TRUE = ("1", "on", "yes", "true")


def looks_like_hub_name(text: str) -> bool:
    """``name`` or ``namespace/name``, as the hub spells repository ids."""
    return bool(_HUB_NAME.fullmatch(text)) and ".." not in text and "--" not in text


def offline_variable() -> str | None:
    """The variable that turns the hub off (``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE``),
    or None when neither is set to a true value."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().lower() in _TRUE:
            return name
    return None


def _hub_address() -> tuple[str, int]:
    """Where a request to the hub connects first: the HTTPS proxy if one is set, else the
    hub endpoint (``HF_ENDPOINT``)."""
    proxy = next((os.environ[v] for v in PROXY_VARIABLES if os.environ.get(v)), None)
    if proxy:
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    else:
        url = urlsplit(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


@functools.cache
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached from here, or None when a connection to it opens
    within :data:`CONNECT_TIMEOUT_S`. Asked once per process."""
    host, port = _hub_address()
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc) or type(exc).__name__)

    # A thread, because the name lookup before the connect has no timeout of its own.
    attempt = threading.Thread(target=connect, daemon=True)
    attempt.start()
    attempt.join(CONNECT_TIMEOUT_S)
    if not outcome:
        return f"{host}:{port} did not answer within {CONNECT_TIMEOUT_S:g} s"
    return None if outcome[0] is None else f"{host}:{port}: {outcome[0]}"


def in_hub_cache(name: str) -> bool:
    """Whether the local Hugging Face cache holds ``name`` (its config or tokenizer config).
    Needs huggingface_hub, which every stage that loads models has (through transformers)."""
    from huggingface_hub import try_to_load_from_cache

    return any(
        isinstance(try_to_load_from_cache(name, filename), str)
        for filename in ("config.json", "tokenizer_config.json")
    )


def require_local_or_hub(
    name_or_path: str, key: str, *, error: type[PtError] = InputError, hint: str | None = None
) -> None:
    """Raise ``error`` at once unless ``name_or_path`` (given by the config key or option
    ``key``) is a local directory, or a hub name that the hub or the local cache can serve.

    ``hint`` replaces the default fix for errors about a name that may be a hub name."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return
    what = f"{key} {name_or_path!r}"
    if path.exists():
        raise error(
            f"{what} is a file, not a directory",
            hint="give the directory that holds config.json (or the tokenizer files)",
        )
    if not looks_like_hub_name(name_or_path):
        raise error(
            f"{what} is not a directory (no such path)",
            hint="check the path; relative paths start from the current directory",
        )
    offline = offline_variable()
    unreachable = None if offline else hub_unreachable()
    if offline is None and unreachable is None:
        return
    if in_hub_cache(name_or_path):
        if unreachable is not None:
            log.warning(
                "%s: the Hugging Face hub cannot be reached (%s); transformers retries before "
                "it reads the cached copy (set HF_HUB_OFFLINE=1 to skip the wait)",
                what,
                unreachable,
            )
        return
    why = (
        f"{offline} is set"
        if offline
        else f"the Hugging Face hub cannot be reached ({unreachable})"
    )
    raise error(
        f"{what} is not a directory and {why}, and it is not in the Hugging Face cache",
        hint=hint
        or "check the path, or give a local model directory; a hub name needs a network "
        "(or a copy downloaded once into the cache)",
    )
