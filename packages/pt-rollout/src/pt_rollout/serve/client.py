"""The client of a generator process: :class:`RemoteGenerator` starts one (``python -m
pt_rollout.serve``, in the interpreter given: its own environment's, such as
``.venv-vllm``) or connects to one listening on another node, sends without waiting, and
collects each answer by its key.

Only plain Python values cross the socket, so the two sides need not share a torch
version (but for weight transfer over ``ipc``, whose CUDA IPC handles name torch's types).
Because messages are answered in order, a ``load_weights`` sent after a ``generate`` does
not change that generation: the client decides which weights each round is sampled with
by the order it sends them in.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pt_core.errors import PtError
from pt_rollout.serve.protocol import READY, keepalive, key_file_path, parse_address, read_key
from pt_rollout.serve.spec import GeneratorSpec
from pt_rollout.serve.transfer import TransferSender


def visible_device(index: int, visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child process that is to see device ``index`` of
    this process's own: with ``visible`` (this process's ``CUDA_VISIBLE_DEVICES``) set,
    its ``index``-th entry (``"4,5,6"`` and 1: ``"5"``), else ``index`` itself."""
    from pt_rollout.parallel import visible_entries

    entries = visible_entries(visible)
    if entries is None:
        return str(index)
    if index >= len(entries):
        raise PtError(
            f"device {index} is not among the {len(entries)} this process sees "
            f"(CUDA_VISIBLE_DEVICES={visible})"
        )
    return entries[index]


class RemoteGenerator:
    """One generator process: :meth:`start` one with a spec, or :meth:`connect` to one
    listening at an address (its weights are whatever it holds: push before generating)."""

    def __init__(self, conn, *, proc: subprocess.Popen | None = None, address: str | None = None,
                 weight_transfer: str | None = None, directory: Path | None = None):  # fmt: skip
        self.conn = conn
        self.proc = proc
        self.address = address
        self.weight_transfer = weight_transfer
        self._dir = directory
        self._transfer = TransferSender(self, weight_transfer) if weight_transfer else None
        self._held: list[dict] | None = None  # messages queued while a push is on its way
        self._lock = threading.Lock()  # one sender on the socket at a time
        self._replies: dict = {}
        self._cond = threading.Condition()
        self._next_key = 0
        self._refused: str | None = None  # a listening process's answer that it is busy
        self._reader = threading.Thread(target=self._read, args=(conn,), daemon=True)
        self._reader.start()

    @classmethod
    def start(cls, spec: GeneratorSpec, *, python: str | None = None, version: int = 0,
              device: int | None = None, start_timeout: float = 900.0) -> RemoteGenerator:  # fmt: skip
        """Start ``python -m pt_rollout.serve`` with ``spec`` at weight version ``version``.
        ``device``: the process sees that GPU only, an index among this process's own
        (:func:`visible_device`); None: the GPUs this process sees."""
        from multiprocessing.connection import Client

        directory = Path(tempfile.mkdtemp(prefix="pt-serve-"))
        sock = str(directory / "socket")
        authkey = secrets.token_bytes(16)
        cmd = [python or sys.executable, "-m", "pt_rollout.serve", "--socket", sock,
               "--start-version", str(version), *spec.argv()]  # fmt: skip
        env = {**os.environ, "PT_SERVE_AUTHKEY": authkey.hex()}
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_device(
                device, os.environ.get("CUDA_VISIBLE_DEVICES")
            )
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=sys.stderr.fileno(), env=env, text=True
        )
        deadline = time.monotonic() + start_timeout
        assert proc.stdout is not None  # stdout=PIPE
        for line in proc.stdout:
            if line.strip() == READY or time.monotonic() > deadline:
                break
        if proc.poll() is not None or not Path(sock).exists():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            shutil.rmtree(directory, ignore_errors=True)
            raise PtError(
                f"the generator process ({spec.engine} engine, {python or sys.executable}) did "
                "not start; its errors are above",
                hint="check rollout.engine and rollout.python (e.g. .venv-vllm/bin/python)",
            )
        conn = Client(sock, family="AF_UNIX", authkey=authkey)
        return cls(conn, proc=proc, weight_transfer=spec.weight_transfer, directory=directory)

    @classmethod
    def connect(cls, address: str, key_file: str | None = None,
                weight_transfer: str | None = None) -> RemoteGenerator:  # fmt: skip
        """A connection to the process listening at ``address``, authenticated with the key
        in ``key_file`` (:func:`read_key`); ``weight_transfer``: how it takes weights."""
        from multiprocessing import AuthenticationError
        from multiprocessing.connection import Client

        try:
            host, port = parse_address(address)
        except ValueError as exc:
            raise PtError(str(exc)) from None
        key = read_key(key_file)
        try:
            conn = Client((host, port), family="AF_INET", authkey=key)
        except AuthenticationError:
            raise PtError(
                f"the generator at {address} refused the key in {key_file_path(key_file)}",
                hint="give the trainer the key file the generator process read (its log "
                "names it): rollout.server_key_file",
            ) from None
        except socket.gaierror as exc:
            raise PtError(
                f"rollout.servers: the host of {address} is not known here: {exc.strerror or exc}",
                hint="check the host name (or use the node's IPv4 address)",
            ) from None
        except OSError as exc:
            raise PtError(
                f"no generator answers at {address}: {exc.strerror or exc}",
                hint=f"start one there: pt-rollout serve --listen {host}:{port} --model DIR "
                "(or correct rollout.servers)",
            ) from None
        with socket.socket(fileno=os.dup(conn.fileno())) as own:  # the same socket
            keepalive(own)
        return cls(conn, address=address, weight_transfer=weight_transfer)

    @property
    def pid(self) -> int | None:
        """The process's id, where this started it."""
        return self.proc.pid if self.proc is not None else None

    def describe(self) -> str:
        """Which generator this is, for messages: its address, or its process's pid."""
        if self.address is not None:
            return f"the generator at {self.address}"
        return f"the generator process (pid {self.proc.pid if self.proc else '?'})"

    # ------------------------------------------------------------------ sending

    def send(self, message: dict, *, now: bool = False) -> int:
        """Send ``message`` with a new key, or, while a push is on its way, queue it to
        follow the push (``now``: the push's own messages)."""
        if self.conn is None:
            raise PtError("the generator process was closed")
        with self._lock:
            key = self._next_key
            self._next_key += 1
            if self._held is not None and not now:
                self._held.append({**message, "key": key})
            else:
                self.conn.send({**message, "key": key})
        return key

    def submit_generate(self, requests, params: dict, score: dict | None = None) -> int:
        """Queue a generation; returns the key to :meth:`wait` on."""
        return self.send(
            {"op": "generate", "requests": [[list(r.prompt_token_ids), r.seed] for r in requests],
             "params": params, "score": score}
        )  # fmt: skip

    def submit_score(self, items: list, score: dict) -> int:
        """Queue the teacher's scores of given completions: ``items`` are ``(prompt ids,
        completion ids, ids to score at each position or None)``."""
        return self.send({"op": "score", "items": [[list(p), list(c), a] for p, c, a in items],
                          "score": score})  # fmt: skip

    def submit_load_weights(self, path: str, version: int) -> int:
        """Queue the checkpoint directory ``path``'s weights, as version ``version``; to a
        process on another node (``address``), its safetensors files themselves."""
        if self.address is None:
            return self.send({"op": "load_weights", "path": str(path), "version": version})
        files = {f.name: f.read_bytes() for f in sorted(Path(path).glob("*.safetensors"))}
        index = Path(path) / "model.safetensors.index.json"
        if index.exists():
            files[index.name] = index.read_bytes()
        return self.send({"op": "load_weights", "files": files, "version": version})

    def submit_push(self, weights: list, version: int) -> int:
        """Send the ``(name, tensor)`` pairs ``weights`` with vLLM's weight-transfer API as
        version ``version`` (:class:`TransferSender`); returns the key to :meth:`wait` on,
        answered like a ``load_weights``."""
        if self._transfer is None:
            raise PtError("this generator process was started without a weight-transfer backend")
        self._transfer.join()
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._held = []
        self._transfer.submit(key, weights, version)
        return key

    def release(self, reply: dict) -> None:
        """A push is over (``reply``, its answer): send what was held behind it."""
        with self._lock:
            held, self._held = self._held or [], None
            with contextlib.suppress(OSError):  # the process ended: the caller sees it
                for message in held:
                    if self.conn is not None:
                        self.conn.send(message)
        with self._cond:
            self._replies[reply["key"]] = reply
            self._cond.notify_all()

    def info(self) -> dict:
        """What the process says of itself (:meth:`GeneratorServer.info`), in order with
        what was sent before."""
        return self.wait(self.send({"op": "info"}))

    # ------------------------------------------------------------------ answers

    def _read(self, conn) -> None:
        while True:
            try:
                reply = conn.recv()
            except Exception:  # EOF, a reset, or the connection closed under it by close()
                with self._cond:
                    self._replies["_closed"] = True
                    self._cond.notify_all()
                return
            with self._cond:
                if reply.get("op") == "busy":  # a listening process that serves another
                    self._refused = reply.get("error")
                    continue
                self._replies[reply["key"]] = reply
                self._cond.notify_all()

    def done(self, key: int) -> bool:
        with self._cond:
            return key in self._replies

    def alive(self) -> bool:
        """Whether the process still runs (one this started) and its socket is open."""
        with self._cond:
            closed = self._replies.get("_closed", False)
        return not closed and (self.proc is None or self.proc.poll() is None)

    def exit_code(self) -> int | None:
        """The process's exit code once it ended (waiting briefly for one that closed its
        socket as it ended); None for one this did not start."""
        if self.proc is None:
            return None
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return self.proc.poll()

    def wait(self, key: int) -> dict:
        with self._cond:
            while key not in self._replies:
                self._raise_if_gone()
                self._cond.wait(timeout=1.0)
            reply = self._replies.pop(key)
        if "pt_error" in reply:  # this side's own (a push's)
            message, hint = reply["pt_error"]
            raise PtError(message, hint=hint)
        if "error" in reply:
            raise PtError(f"the generator failed: {reply['error']}")
        return reply

    def refusal(self) -> PtError | None:
        """The error to stop with when a listening process refused this trainer because it
        serves another (None when it did not)."""
        if not self._refused:
            return None
        return PtError(
            self._refused,
            hint="a generator serves one trainer at a time: wait for the other run to end, "
            "or start one more generator for this run",
        )

    def _raise_if_gone(self) -> None:
        refused = self.refusal()
        if refused is not None:
            raise refused
        if self.proc is None and self._replies.get("_closed"):
            raise PtError(f"{self.describe()} closed the connection; its errors are in its own log")
        if self.proc is not None and (self._replies.get("_closed") or self.proc.poll() is not None):
            raise PtError(
                f"the generator process ended (exit {self.proc.poll()}); its errors are above"
            )

    def close(self, *, announce: bool = True) -> None:
        """Say goodbye (``announce=False``: the connection just ends, as a trainer's that
        died does), end the connection and the thread that reads it, and wait for a process
        this started."""
        if self._transfer is not None and (self.proc is None or self.proc.poll() is None):
            self._transfer.join(timeout=60)
        conn = self.conn
        if conn is not None:
            if announce:
                with contextlib.suppress(OSError):  # the process may have ended already
                    conn.send({"op": "close"})
            # The reader may be blocked in a read of this socket. Closing the descriptor
            # under it would let its next read take the bytes of whatever socket is opened
            # next under the same number (a pool's next connection: its handshake or its
            # replies). Shut the socket down instead, so the reader sees the end and stops,
            # and close the descriptor once it has.
            with contextlib.suppress(OSError):
                shut = socket.socket(fileno=os.dup(conn.fileno()))
                with shut:
                    shut.shutdown(socket.SHUT_RDWR)
            self._reader.join(timeout=30)
            conn.close()
            self.conn = None
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
