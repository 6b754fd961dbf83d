"""The trainer's side of vLLM's weight-transfer API with one generator process: the
pushes of a :class:`~pt_rollout.serve.client.RemoteGenerator` whose process takes its
weights that way (``--weight-transfer``, :mod:`pt_rollout.weight_transfer`).

A push runs in a thread of its own: it starts when the process has answered what was sent
before it, and what the caller sends after it is held and sent once the push is in, so
that the process takes messages in the order they were given, as after a
``load_weights``.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any, Protocol

from pt_core.errors import PtError


class Channel(Protocol):
    """What a push needs of its :class:`~pt_rollout.serve.client.RemoteGenerator`: the
    connection, to send the handshake's messages ahead of what is held, to wait for their
    answers, and to release what was held once the push is in."""

    address: str | None
    conn: Any

    def describe(self) -> str: ...

    def send(self, message: dict, *, now: bool = False) -> int: ...

    def wait(self, key: int) -> dict: ...

    def release(self, reply: dict) -> None: ...


class TransferSender:
    """Pushes to one process over ``backend`` (``gloo``, ``ipc``, ``nccl``); the group
    with its workers is formed at the first push."""

    def __init__(self, generator: Channel, backend: str):
        self.generator = generator
        self.backend = backend
        self._engine = None  # vLLM's trainer-side engine, met with the process's workers
        self._thread: threading.Thread | None = None

    def submit(self, key: int, weights: list, version: int) -> None:
        """Push the ``(name, tensor)`` pairs ``weights`` (checkpoint names) as version
        ``version``, answered under ``key`` like a ``load_weights``. ``weights`` must not
        change until it is answered (the caller's copy). One push at a time: a second
        waits for the first to be sent."""
        self.join()
        self._thread = threading.Thread(target=self._push, args=(key, weights, version),
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            if not thread.is_alive():
                self._thread = None

    def _push(self, key: int, weights: list, version: int) -> None:
        reply: dict = {"key": key, "op": "push"}
        try:
            first = weights[0][1] if weights else None
            if first is not None and first.is_cuda:
                # CUDA IPC names the current device in its handles, and NCCL's group is
                # opened on it: this thread's is 0
                import torch

                torch.cuda.set_device(first.device)
            if self._engine is None:
                self._engine = self._open()
            source, client = self._engine.source, self._engine.client
            source.pairs, client.version = weights, version
            try:
                self._engine.send_weights()
            finally:
                source.pairs = []
            reply.update(client.finished)
        except PtError as exc:  # raised by wait(key), in the caller's thread, as it is
            reply["pt_error"] = (exc.message, exc.hint)
        except Exception as exc:
            reply["error"] = f"weight transfer: {type(exc).__name__}: {exc}"
        finally:
            self.generator.release(reply)

    def _open(self):
        """The trainer's engine for this process's backend, met with its workers."""
        from vllm.distributed.weight_transfer.factory import (  # pyright: ignore[reportMissingImports]
            WeightTransferTrainerFactory,
        )

        from pt_rollout.weight_transfer import (
            PairsSource,
            open_port,
            register,
            trainer_init_info,
        )

        register()
        generator = self.generator
        host = "127.0.0.1"  # the process runs on this machine
        if generator.address is not None:  # this machine's address on the way to the process
            assert generator.conn is not None
            with socket.socket(fileno=os.dup(generator.conn.fileno())) as own:
                host = own.getsockname()[0]
        port = open_port(host)
        info = trainer_init_info(self.backend, host=host, port=port, world_size=2)
        try:
            return WeightTransferTrainerFactory.trainer_init(
                info, client=_HandshakeClient(generator), source=PairsSource()
            )
        except Exception as exc:  # the rendezvous of the two sides
            why = str(exc.message if isinstance(exc, PtError) else exc).removeprefix(
                "the generator failed: "
            )
            raise PtError(
                f"the {self.backend} weight-transfer group with {generator.describe()} did "
                f"not form: {why}",
                hint=f"the generator must reach this machine at {host} (port {port} and the "
                "ports its backend opens), and this machine it; or use "
                "rollout.weight_transfer=files",
            ) from None


class _HandshakeClient:
    """vLLM's weight-sync client (``VLLMWeightSyncClient``: the four calls of its
    handshake) over a :class:`RemoteGenerator`'s socket, each call answered before it
    returns. Used from a push's thread only: ``version`` is the push's, and ``finished``
    the process's answer to its end (the version and the seconds the push took there)."""

    def __init__(self, generator: Channel):
        self.generator = generator
        self.version = 0
        self.finished: dict = {}

    def _call(self, message: dict) -> dict:
        generator = self.generator
        return generator.wait(generator.send(message, now=True))

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self._call({"op": "init_weight_transfer", "init_info": init_info})

    def start_weight_update(self) -> None:
        self._call({"op": "start_weight_update"})

    def update_weights(self, update_info) -> None:
        self._call({"op": "update_weights", "update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        reply = self._call({"op": "finish_weight_update", "version": self.version})
        self.finished = {"version": reply["version"], "seconds": reply["seconds"]}
