"""A pool of grading processes with a hard time limit per item.

sympy can spend minutes inside a single big-number operation, where neither a
thread nor ``signal.alarm`` can interrupt it. So every item is graded in a
worker process; when an item runs past ``timeout`` seconds its worker is killed
(SIGKILL), the item is marked ``timeout``, and a fresh worker takes over the
rest of the queue.

Most answers are plain numbers: those, and responses with no answer, are graded in the
calling process without sympy (:func:`pt_eval.item.prepare`), and the pool only starts
when an item needs the full parser. Starting a Python process that imports sympy takes one
to several seconds, so workers are not started from scratch: one *fork server*
(``python -P -m pt_eval.worker``: -P, so that nothing in the current directory is
imported) imports and warms up sympy once, then forks a worker on request, in
milliseconds. Workers connect back to the pool over a Unix socket and exchange JSON
lines. The fork server is single-threaded, so forking it is
safe; the pool itself only uses ``subprocess`` and ``selectors`` (no signals,
no fork of the caller, no re-import of the caller's ``__main__``), so it works
from any thread and never hangs on a stuck item.

    with GradingPool(workers=2, timeout=5) as pool:
        results = pool.grade([(response, gold), ...])   # or (response, gold, truncated)
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, cast

from pt_core.errors import RunFailure
from pt_core.log import get_logger
from pt_eval.item import prepare
from pt_eval.policy import DEFAULT_POLICY, Policy

log = get_logger(__name__)

DEFAULT_TIMEOUT = 5.0
DEFAULT_MEMORY_MB = 4096
STARTUP_TIMEOUT = 120.0  # seconds the fork server may take to import sympy
CONNECT_TIMEOUT = 30.0  # seconds a forked worker may take to connect back
ITEMS_IN_FLIGHT = 16  # items queued on one worker at a time
MAX_FAILED_STARTS = 5


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    """The fork server's stdin or stdout: always a pipe (see :meth:`GradingPool.start`)."""
    assert stream is not None
    return stream


def default_workers() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 4))


class WorkerStartError(RunFailure):
    """Grading workers could not start (a broken installation, not a bad item)."""


class _Worker:
    """The pool's end of one worker's socket."""

    def __init__(self, conn: socket.socket):
        conn.setblocking(False)
        self.conn = conn
        self.fd = conn.fileno()
        self.pid: int | None = None  # known once the worker says hello
        self.inflight: deque[int] = deque()
        self.head_started: float | None = None  # when the item at the head of inflight began
        self.outbuf = bytearray()
        self.inbuf = bytearray()
        self.alive = True


# the pools whose fork server runs, for abandon_open_pools
_OPEN_POOLS: weakref.WeakSet[GradingPool] = weakref.WeakSet()


def abandon_open_pools() -> None:
    """Kill every open pool's fork server and workers and remove its socket directory,
    without waiting or taking a lock: for a process that must end now (see pt_eval.cli's
    SIGTERM handling)."""
    for pool in list(_OPEN_POOLS):
        pids = [w.pid for w in pool.workers if w.pid is not None]
        if pool._server is not None:
            pids.append(pool._server.pid)
        for pid in pids:
            with contextlib.suppress(OSError):  # already gone
                os.kill(pid, signal.SIGKILL)
        if pool._tmpdir is not None:
            shutil.rmtree(pool._tmpdir, ignore_errors=True)


class GradingPool:
    """Grade (prediction, gold) pairs in worker processes, ``timeout`` seconds per item."""

    def __init__(
        self,
        workers: int | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        policy: Policy = DEFAULT_POLICY,
        memory_mb: int | None = DEFAULT_MEMORY_MB,
    ):
        if workers is not None and workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.size = workers or default_workers()
        self.timeout = float(timeout)
        self.policy = policy
        self._policy_message = policy.to_dict()
        self.memory_mb = memory_mb
        self.workers: list[_Worker] = []
        self.restarts = 0  # workers replaced after a timeout or a crash
        self._server: subprocess.Popen[bytes] | None = None
        self._server_ready = False
        self._server_started = 0.0
        self._server_buf = bytearray()
        self._spawns: deque[float] = deque()  # request times of workers not yet connected
        self._failed_starts = 0
        self._tmpdir: str | None = None
        self._listener: socket.socket | None = None
        self._work: Sequence[tuple] = ()  # the (extracted, gold) items of the current run

    def __enter__(self) -> GradingPool:
        return self  # the fork server starts with the first item that needs it

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        if self._server is not None and self._server.poll() is None:
            return
        if self._listener is None:
            self._tmpdir = tempfile.mkdtemp(prefix="pt-eval-")
            path = os.path.join(self._tmpdir, "pool.sock")
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(path)
            self._listener.listen(64)
            self._listener.setblocking(False)
        assert self._tmpdir is not None  # made with the listener, removed with it
        src_dir = str(Path(__file__).resolve().parent.parent)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src_dir, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        # -P: `-m` would otherwise put the current directory first on sys.path, and a
        # timeit.py or sympy.py in the folder where the user grades would run in the worker
        args = [sys.executable, "-P", "-m", "pt_eval.worker", "--socket",
                os.path.join(self._tmpdir, "pool.sock")]  # fmt: skip
        if self.memory_mb:
            args += ["--memory-mb", str(self.memory_mb)]
        self._server = subprocess.Popen(
            args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True
        )
        os.set_blocking(_pipe(self._server.stdout).fileno(), False)
        self._server_ready = False
        self._server_started = time.monotonic()
        self._server_buf = bytearray()
        self._spawns.clear()
        _OPEN_POOLS.add(self)

    def wait_ready(self) -> None:
        """Block until every worker is connected (useful before timing a run)."""
        self.start()
        self._loop(
            [], [], deque(), None,
            lambda: len(self.workers) >= self.size and all(w.pid for w in self.workers),
        )  # fmt: skip

    def close(self) -> None:
        for worker in self.workers:
            self._kill(worker)
        self.workers = []
        if self._server is not None:
            if self._server.poll() is None and not self._server_ready:
                self._server.kill()  # still importing: it has no workers to clean up
                self._server.wait()
            elif self._server.poll() is None:
                try:
                    _pipe(self._server.stdin).close()  # the server kills its workers and exits
                    self._server.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    self._server.kill()
                    self._server.wait()
            _pipe(self._server.stdout).close()
            self._server = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
        _OPEN_POOLS.discard(self)

    # ------------------------------------------------------------------ grading
    def grade(
        self,
        items: Sequence[tuple],
        progress: Callable[[int], None] | None = None,
    ) -> list[dict]:
        """One result dict per ``(prediction, gold)`` or ``(prediction, gold, truncated)``
        item, in order (see ``pt_eval.item``). Items that need no sympy are graded here;
        the others go to the workers, which start with the first of them."""
        results: list[dict | None] = [None] * len(items)
        slow: dict[tuple[str, str], list[int]] = {}  # one worker item per distinct pair
        for index, item in enumerate(items):
            prediction, gold = item[0], item[1]
            truncated = item[2] if len(item) > 2 else None
            done_here, extracted = prepare(prediction, gold, self.policy, truncated=truncated)
            if done_here is not None:
                results[index] = done_here
                if progress is not None:
                    progress(1)
                continue
            assert extracted is not None  # prepare grades a missing answer itself
            if not slow:
                self.start()  # the fork server imports sympy while the rest is extracted
            slow.setdefault((extracted, gold), []).append(index)
        if slow:
            work = list(slow)
            work_results: list[dict | None] = [None] * len(work)
            pending = deque(range(len(work)))
            remaining = [len(work)]

            def done(index: int) -> None:
                remaining[0] -= 1
                if progress is not None:
                    progress(len(slow[work[index]]))

            self._loop(work, work_results, pending, done, lambda: remaining[0] == 0)
            for pair, outcome in zip(work, work_results, strict=True):
                for index in slow[pair]:
                    results[index] = outcome
        return cast(list[dict], results)  # every item has its result now

    def _loop(self, items, results, pending: deque, done, finished) -> None:
        self._work = items
        selector = selectors.DefaultSelector()
        try:
            while not finished():
                self._top_up()
                self._assign(items, pending)
                self._register(selector)
                for key, events in selector.select(timeout=self._next_deadline()):
                    target = key.data
                    if target == "server":
                        self._read_server()
                    elif target == "listener":
                        self._accept()
                    elif target.alive:
                        if events & selectors.EVENT_WRITE:
                            self._write(target, pending, results, done)
                        if events & selectors.EVENT_READ and target.alive:
                            self._read(target, pending, results, done)
                self._enforce_deadlines(pending, results, done)
        finally:
            selector.close()

    def _top_up(self) -> None:
        """Ask the fork server for workers until the pool is full."""
        if self._server is None or self._server.poll() is not None:
            self._server_failed("the fork server exited")
            return
        if not self._server_ready:
            return
        while len(self.workers) + len(self._spawns) < self.size:
            self._command("spawn")
            self._spawns.append(time.monotonic())

    def _command(self, line: str) -> None:
        assert self._server is not None  # only said to a running server
        stdin = _pipe(self._server.stdin)
        try:
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except OSError:
            self._server_failed("the fork server exited")

    def _assign(self, items, pending: deque) -> None:
        for worker in self.workers:
            while pending and len(worker.inflight) < ITEMS_IN_FLIGHT:
                index = pending.popleft()
                extracted, gold = items[index]
                message = {"i": index, "x": extracted, "g": gold, "o": self._policy_message}
                worker.outbuf += json.dumps(message).encode() + b"\n"
                if not worker.inflight:
                    worker.head_started = time.monotonic()
                worker.inflight.append(index)

    def _register(self, selector: selectors.BaseSelector) -> None:
        wanted: dict[int, tuple[int, object]] = {}
        if self._server is not None and self._server.poll() is None:
            wanted[_pipe(self._server.stdout).fileno()] = (selectors.EVENT_READ, "server")
        if self._listener is not None:
            wanted[self._listener.fileno()] = (selectors.EVENT_READ, "listener")
        for worker in self.workers:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if worker.outbuf else 0)
            wanted[worker.fd] = (events, worker)
        current = selector.get_map()
        for fd in list(current):
            if fd not in wanted or current[fd].data is not wanted[fd][1]:
                selector.unregister(fd)
        current = selector.get_map()
        for fd, (events, data) in wanted.items():
            if fd not in current:
                selector.register(fd, events, data)
            elif current[fd].events != events:
                selector.modify(fd, events, data)

    def _next_deadline(self) -> float:
        now = time.monotonic()
        deadlines = [1.0]
        if not self._server_ready:
            deadlines.append(self._server_started + STARTUP_TIMEOUT - now)
        deadlines.extend(t + CONNECT_TIMEOUT - now for t in self._spawns)
        deadlines.extend(
            w.head_started + self.timeout - now for w in self.workers if w.head_started
        )
        return max(0.0, min(deadlines))

    # ------------------------------------------------------------------ events
    def _read_server(self) -> None:
        assert self._server is not None  # selected only while the server runs
        try:
            chunk = os.read(_pipe(self._server.stdout).fileno(), 4096)
        except BlockingIOError:
            return
        if not chunk:
            self._server_failed(f"the fork server exited with code {self._server.wait()}")
            return
        self._server_buf += chunk
        if b"ready" in self._server_buf:
            self._server_ready = True
            self._failed_starts = 0

    def _accept(self) -> None:
        assert self._listener is not None  # selected only while the listener is open
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._spawns:
            self._spawns.popleft()
        self.workers.append(_Worker(conn))

    def _write(self, worker: _Worker, pending, results, done) -> None:
        try:
            written = os.write(worker.fd, worker.outbuf[: 1 << 20])
        except BlockingIOError:
            return
        except OSError:
            self._replace(worker, pending, results, done, "error", "the worker exited")
            return
        del worker.outbuf[:written]

    def _read(self, worker: _Worker, pending, results, done) -> None:
        try:
            chunk = os.read(worker.fd, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._replace(worker, pending, results, done, "error", "the worker exited")
            return
        worker.inbuf += chunk
        while (newline := worker.inbuf.find(b"\n")) >= 0:
            message = json.loads(bytes(worker.inbuf[:newline]))
            del worker.inbuf[: newline + 1]
            if "hello" in message:
                worker.pid = message["hello"]
                continue
            index = message.pop("i")
            head = worker.inflight.popleft()
            assert head == index, f"worker answered item {index}, expected {head}"
            results[index] = message
            worker.head_started = time.monotonic() if worker.inflight else None
            done(index)

    def _enforce_deadlines(self, pending, results, done) -> None:
        now = time.monotonic()
        if not self._server_ready and now - self._server_started > STARTUP_TIMEOUT:
            self._server_failed(f"the fork server did not start within {STARTUP_TIMEOUT:.0f}s")
        while self._spawns and now - self._spawns[0] > CONNECT_TIMEOUT:
            self._spawns.popleft()
            self._failed_starts += 1
            self._check_failures(f"a worker did not connect within {CONNECT_TIMEOUT:.0f}s")
        for worker in list(self.workers):
            if worker.head_started is not None and now - worker.head_started > self.timeout:
                log.debug(
                    "item %d ran past %.1fs; replacing its worker", worker.inflight[0], self.timeout
                )
                self._replace(worker, pending, results, done, "timeout",
                              f"grading took longer than {self.timeout:g}s")  # fmt: skip

    def _replace(
        self, worker: _Worker, pending: deque, results, done, status: str, message: str
    ) -> None:
        """Kill ``worker``, give its current item ``status``, requeue the rest."""
        self._kill(worker)
        self.workers.remove(worker)
        if worker.inflight:
            index = worker.inflight.popleft()
            extracted = self._work[index][0] if index < len(self._work) else None
            results[index] = {"extracted": extracted, "correct": False, "status": status,
                              "key": None, "message": message}  # fmt: skip
            done(index)
            pending.extendleft(reversed(worker.inflight))
        self.restarts += 1  # _top_up asks for a new worker on the next turn

    def _kill(self, worker: _Worker) -> None:
        worker.alive = False
        if worker.pid is not None and self._server is not None and self._server.poll() is None:
            # the server reaps its own children, so the pid cannot have been reused
            self._command(f"kill {worker.pid}")
        worker.conn.close()

    def _server_failed(self, why: str) -> None:
        self._failed_starts += 1
        self._check_failures(why)
        log.warning("%s; restarting it", why)
        if self._server is not None:
            if self._server.poll() is None:
                self._server.kill()
            self._server.wait()
            _pipe(self._server.stdout).close()
            self._server = None
        self.start()

    def _check_failures(self, why: str) -> None:
        if self._failed_starts >= MAX_FAILED_STARTS:
            self.close()
            raise WorkerStartError(
                f"grading workers fail to start ({why}); run `{sys.executable} -P -m "
                "pt_eval.worker --check` to see the error"
            )


# --------------------------------------------------------------------------- worker side


def fork_server(socket_path: str, memory_mb: int | None) -> None:
    """Import and warm up once; fork a worker for every ``spawn`` line on stdin, kill one for
    every ``kill PID`` line; on end of input, kill every worker and exit."""
    from pt_eval.item import warm_up

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the pool's to handle: it closes us
    warm_up()  # sympy imports parts of itself lazily on first use; pay that once, here
    children: set[int] = set()
    try:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the pool closed before we were ready
        return
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        _reap(children)
        if command == "spawn":
            pid = os.fork()
            if pid == 0:
                _become_worker(socket_path, memory_mb)  # never returns
            children.add(pid)
        elif command == "kill":
            pid = int(arg)
            if pid in children:  # not yet reaped, so the pid cannot belong to anyone else
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                children.discard(pid)
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass  # it had already exited and been reaped
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown of sympy's module graph: the pool waits for this


def _reap(children: set[int]) -> None:
    for pid in list(children):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)


def _become_worker(socket_path: str, memory_mb: int | None) -> None:
    code = 0
    try:
        sys.stdin.close()  # the fork server's command pipe is not the worker's business
        os.dup2(2, 1)  # nothing a library prints may reach the fork server's stdout
        if memory_mb:
            import resource

            limit = memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(socket_path)
        serve(conn)
    except (BrokenPipeError, ConnectionError, FileNotFoundError):
        pass  # the pool has gone away (closed, or its process ended): nothing to report
    except BaseException:  # a worker must never return into the fork server's loop
        code = 1
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def serve(conn: socket.socket) -> None:
    """Read JSON items from the pool, write one JSON result per line."""
    from pt_eval.item import grade_extracted

    reader = conn.makefile("r", encoding="utf-8", errors="surrogatepass")
    writer = conn.makefile("w", encoding="utf-8", errors="surrogatepass")
    writer.write(json.dumps({"hello": os.getpid()}) + "\n")
    writer.flush()
    policies: dict[str, Policy] = {}
    for line in reader:
        item = json.loads(line)
        marker = json.dumps(item["o"], sort_keys=True)
        policy = policies.get(marker) or policies.setdefault(marker, Policy.from_dict(item["o"]))
        try:
            result = grade_extracted(item["x"], item["g"], policy)
        except Exception as exc:  # reported as this item's error; the run goes on
            result = {"extracted": None, "correct": False, "status": "error", "key": None,
                      "message": f"{type(exc).__name__}: {exc}"}  # fmt: skip
        result["i"] = item["i"]
        writer.write(json.dumps(result) + "\n")
        writer.flush()


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="pt-eval fork server (started by GradingPool)")
    parser.add_argument("--socket", help="Unix socket the pool listens on")
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument("--check", action="store_true", help="import and warm up, then exit")
    args = parser.parse_args(argv)
    sys.set_int_max_str_digits(0)  # pt_eval.parse has its own size limits
    if args.check:
        from pt_eval.item import grade_item, warm_up

        warm_up()
        print(grade_item("\\boxed{\\sqrt{4}/4}", "0.5"))
        return
    if not args.socket:
        parser.error("--socket is required")
    fork_server(args.socket, args.memory_mb)


if __name__ == "__main__":
    main()
