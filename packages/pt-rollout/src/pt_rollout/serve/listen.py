"""A generator process listening on a TCP address for trainers on other nodes, one at a
time: ``pt-rollout serve --listen HOST:PORT``.

Each connection is authenticated in a thread of its own (so one that says nothing holds
up no other) with the key in ``--key-file``; the first is served, and one that comes while
a trainer is served is told the process is busy and closed. When a trainer leaves, the
next is served with the weights the last one left.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading

from pt_core.errors import PtError
from pt_core.log import get_logger
from pt_rollout.serve.addresses import how_trainers_name
from pt_rollout.serve.protocol import (
    BUSY_WAIT,
    READY,
    keepalive,
    key_file_path,
    parse_address,
    read_key,
)
from pt_rollout.serve.server import ClientGone, GeneratorServer

log = get_logger(__name__)


class TrainerListener:
    """The bound socket (bound, and its key read, before the engine loads: a port in use
    is one error at once) and the trainers that come to it."""

    def __init__(self, address: str, key_file: str | None):
        host, port = parse_address(address, listen=True)
        self.address = address
        self.key_file = key_file
        self.authkey = read_key(key_file, create=True)
        try:
            self.socket = socket.create_server((host, port), backlog=16)
        except OSError as exc:
            raise PtError(
                f"cannot listen on {address}: {exc.strerror or exc}",
                hint="choose another port (0: any free one), or stop what listens there",
            ) from None
        self._clients: queue.Queue = queue.Queue()
        self._idle = threading.Event()
        self._idle.set()
        self._handoff = threading.Lock()  # one connection at a time decides whether it is served

    def serve_forever(self, server: GeneratorServer) -> None:
        """Serve trainers one after another until the process is stopped."""
        with self.socket:
            bound = self.socket.getsockname()
            print(f"{READY} {bound[0]}:{bound[1]}", flush=True)
            named = f" ({how_trainers_name(bound[1])})" if bound[0] == "0.0.0.0" else ""
            log.info(
                "listening on %s:%d%s for a trainer (key %s); Ctrl-C stops", bound[0], bound[1],
                named, key_file_path(self.key_file),
            )  # fmt: skip
            threading.Thread(target=self._accept, daemon=True).start()
            while True:
                conn, peer = self._clients.get()
                log.info("a trainer connected from %s", peer)
                gone = "the trainer has gone"
                try:
                    server.session(conn)
                except ClientGone:
                    gone = "the trainer went while it was answered"
                finally:
                    conn.close()
                    server.end_session()
                    self._idle.set()
                log.info("%s; weight version %d; waiting for the next", gone, server.version)

    def _accept(self) -> None:
        while True:
            try:
                sock, peer = self.socket.accept()
            except OSError:  # the socket was closed: the process ends
                return
            threading.Thread(target=self._handshake, args=(sock, peer), daemon=True).start()

    def _handshake(self, sock: socket.socket, peer) -> None:
        """Authenticate one connection, then hand it to the main thread if none is served,
        or, once one is and still is a few seconds later (the time a trainer that has just
        left takes to be gone), tell it the process is busy and close it."""
        from multiprocessing import AuthenticationError
        from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

        keepalive(sock)
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
        except Exception as exc:  # a wrong key, a port scanner, a client gone at once
            why = (
                "it did not have the key"
                if isinstance(exc, AuthenticationError)
                else f"not a trainer ({type(exc).__name__}: {exc})"
            )
            log.warning("a connection from %s was refused: %s", peer[0], why)
            conn.close()
            return
        with self._handoff:
            if not self._idle.wait(timeout=BUSY_WAIT):
                log.warning("a trainer from %s was turned away: another is being served", peer[0])
                with contextlib.suppress(OSError):
                    conn.send({"key": None, "op": "busy", "error": (
                        f"the generator at {self.address} serves another trainer"
                    )})  # fmt: skip
                conn.close()
                return
            self._idle.clear()
        self._clients.put((conn, peer[0]))
