"""The wire between a trainer and a generator process: what crosses the socket, and how a
connection is opened and kept.

A client sends messages (dicts of plain Python values: lists, dicts, numbers, strings),
each with a ``key``, and the process answers each with ``{"key": k, "op": op, ...}`` in
the order they came (but for ``load_weights`` under in-flight updates, answered between
two steps of the generation running):

- ``{"op": "generate", "requests": [[prompt_ids, seed], ...], "params": {...}, "score":
  {"top_k": K, "at_student_topk": bool} | None}`` -> ``completions`` (and, with
  ``score``, the teacher's ``scores`` of them), with the weight ``version`` that made
  them, ``generate_s`` and ``score_s``;
- ``{"op": "load_weights", "path": dir, "version": v}`` -> the engine loads the
  checkpoint directory in place and later completions carry ``v``; with ``"files":
  {name: bytes}`` in place of ``path`` (a client on another node), the safetensors
  files themselves;
- vLLM's weight-transfer handshake (:data:`TRANSFER_OPS`): ``init_weight_transfer`` once
  (``init_info``), then per push ``start_weight_update``, ``update_weights``
  (``update_info``) and ``finish_weight_update`` (``version``) -> ``version`` and
  ``seconds``;
- ``{"op": "info"}`` -> the process's ``pid``, ``cuda_visible_devices``, its weight
  ``version``, ``model_config`` (:func:`shape_of` its model's config) and its settings
  (:meth:`pt_rollout.serve.spec.GeneratorSpec.info`);
- ``{"op": "close"}``.

An error is answered as ``{"error": "Type: message"}``; a listening process that serves
another trainer answers ``{"op": "busy", "error": ...}`` and closes the connection. Both
sockets authenticate the client with a shared key (multiprocessing's HMAC challenge)
before any message is read.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import tempfile
from pathlib import Path

from pt_core.errors import PtError
from pt_core.log import get_logger

log = get_logger(__name__)

READY = "PT-SERVE-READY"  # printed on stdout once the process takes connections
DEFAULT_KEY_FILE = "~/.pt/serve.key"
BUSY_WAIT = 10.0  # seconds a listening process waits for its client to go before refusing
TRANSFER_OPS = ("init_weight_transfer", "start_weight_update", "update_weights",
                "finish_weight_update")  # fmt: skip
# the model config's keys that say whether pushed weights fit a model
SHAPE_KEYS = ("model_type", "vocab_size", "hidden_size", "intermediate_size",
              "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "tie_word_embeddings")  # fmt: skip


def parse_address(text: str, *, listen: bool = False) -> tuple[str, int]:
    """``"host:port"`` (a host name or an IPv4 address) as ``(host, port)``; port 0 (any
    free port) only where ``listen``. Raises ValueError saying what is wrong."""
    host, sep, port = str(text).rpartition(":")
    lowest = 0 if listen else 1
    if not sep or not host or ":" in host or not port.isdigit() or not lowest <= int(port) <= 65535:
        raise ValueError(
            f"{text!r} is not an address host:port (a host name or IPv4 address, a port "
            f"{lowest}..65535), e.g. node7:7000"
        )
    return host, int(port)


def shape_of(config: dict) -> dict:
    """A model config's :data:`SHAPE_KEYS` (a multimodal config's from its ``text_config``
    where it has none of its own)."""
    text = config.get("text_config") or {}
    return {key: config.get(key, text.get(key)) for key in SHAPE_KEYS}


def local_path(name: str) -> str:
    """``name`` as an absolute path where it is a path on this machine (a hub name, or a
    path that is not here, as given): what two processes compare."""
    return str(Path(name).resolve()) if Path(name).exists() else name


def keepalive(sock: socket.socket) -> None:
    """TCP keepalive on ``sock``, so that a peer that vanished (a node powered off, a
    network cut) ends the connection in about two minutes instead of never."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 60), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 6)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def key_file_path(path: str | None) -> Path:
    return Path(os.path.expanduser(path or DEFAULT_KEY_FILE))


def read_key(path: str | None, *, create: bool = False) -> bytes:
    """The shared key in ``path`` (:data:`DEFAULT_KEY_FILE` if None); ``create``: written
    first, 32 random bytes as hex, mode 0600, where there is none. A key file that others
    than its owner may read, or that is not one, raises :class:`PtError`."""
    file = key_file_path(path)
    if create and not file.exists():
        file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # written whole under another name, then linked: a server on another node that
        # shares this directory never reads half a key, and the first link wins
        fd, written = tempfile.mkstemp(dir=file.parent, prefix=".serve-key-")
        try:
            with os.fdopen(fd, "w") as fh:  # mkstemp's mode is 0600
                fh.write(secrets.token_hex(32) + "\n")
            with contextlib.suppress(FileExistsError):  # another server wrote it first
                os.link(written, file)
                log.info("wrote a new key to %s: the trainer reads the same file", file)
        finally:
            os.unlink(written)
    if not file.is_file():
        raise PtError(
            f"{file}: no key file, which a trainer needs to talk to generator processes on "
            "other nodes",
            hint="start them first (pt-rollout serve writes the key there), or copy the key "
            "file from a node where one runs (rollout.server_key_file names another)",
        )
    mode = file.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PtError(
            f"{file}: the key file may be read by others (mode {stat.filemode(mode)}), and "
            "whoever has the key can run code in the generator process",
            hint=f"chmod 600 {file}",
        )
    text = file.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise PtError(
            f"{file}: not a key (at least 32 hex digits on one line)",
            hint=f"remove {file} and start pt-rollout serve again, which writes a new one"
            if create
            else "copy the key file from a node where pt-rollout serve runs",
        )
    return key
