"""A generator in its own process, for a trainer's online loop.

    python -m pt_rollout.serve --socket /tmp/x.sock --model ckpt/ [--teacher big/] ...
    pt-rollout serve --listen 0.0.0.0:7000 --model ckpt/ [--teacher big/] ...

- :mod:`.spec`: every setting of a generator process (:class:`GeneratorSpec`), once;
- :mod:`.protocol`: what crosses the socket, the addresses and the shared key;
- :mod:`.server`: the process (:class:`GeneratorServer`), on a Unix socket for the
  trainer that started it; :mod:`.listen`: on a TCP address for trainers on other nodes;
- :mod:`.client`: :class:`RemoteGenerator`, which starts a process or connects to one;
  :mod:`.transfer`: its pushes through vLLM's weight-transfer API;
- :mod:`.pool`: :class:`GeneratorPool`, several processes behind one interface.
"""

from __future__ import annotations

import os

from pt_rollout.serve.client import RemoteGenerator, visible_device
from pt_rollout.serve.pool import GeneratorPool
from pt_rollout.serve.protocol import READY, parse_address, read_key, shape_of
from pt_rollout.serve.spec import GeneratorSpec

__all__ = [
    "READY",
    "GeneratorPool",
    "GeneratorSpec",
    "RemoteGenerator",
    "parse_address",
    "read_key",
    "serve",
    "shape_of",
    "visible_device",
]


def serve(spec: GeneratorSpec, *, socket: str | None = None, listen: str | None = None,
          key_file: str | None = None, version: int = 0) -> None:  # fmt: skip
    """Run a generator process with ``spec``: for the trainer that started it, on the Unix
    socket ``socket`` (its key in ``PT_SERVE_AUTHKEY``), or for trainers on other nodes,
    listening at ``listen`` (``host:port``) with the key in ``key_file``."""
    from pt_rollout.serve.listen import TrainerListener
    from pt_rollout.serve.server import GeneratorServer, serve_socket

    # bound before the engine loads: a port in use is one error at once
    listener = TrainerListener(listen, key_file) if listen is not None else None
    server = GeneratorServer(spec, version=version)
    if listener is not None:
        listener.serve_forever(server)
        return
    assert socket is not None  # one of the two (the command's check)
    serve_socket(server, socket, bytes.fromhex(os.environ.pop("PT_SERVE_AUTHKEY")))
