"""``run_python``: run a program a model wrote, in a sandbox, and say what it printed and
what stopped it.

    result = run_python("print(2 ** 100)")
    result.stdout        # '1267650600228229401496703205376\\n'
    result.report()      # the text a model reads back

The program runs in a process of its own, in new namespaces (no network; it sees no
process of the host; its own view of the file system: :mod:`.backends`), as an
unprivileged user, with no variable of the parent's environment, under
:class:`SandboxLimits`. Its scratch space is a tmpfs at /tmp (its working directory)
and /dev/shm, gone when it ends. When the program ends, or a limit stops it, every
process it started ends with it: they are all in its pid namespace, whose first process
is killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from pt_core.errors import ConfigError, RunFailure
from pt_rollout.sandbox.backends import (
    BACKENDS,
    SCRATCH,
    WRAPPER_ENV,
    SandboxUnavailable,
    bwrap_command,
    fallback_view,
    interpreter_dirs,
    placement,
    sandbox_user,
    shown_path,
    unavailable_reason,
    unshare_command,
)

INSIDE = (Path(__file__).parent / "inside.py").read_text()
_SIGNALS = {int(s) for s in signal.Signals}
KILL_WAIT_SECONDS = 5.0  # for the kernel to end a namespace's processes once its first is killed


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. Memory and file size are per process and per file; the
    processes count threads too (Linux counts both against one limit)."""

    cpu_seconds: int = 10  # CPU time of each process: SIGXCPU, then SIGKILL a second later
    wall_seconds: float = 20.0  # from start to end, all processes
    memory_bytes: int = 1 << 30  # address space of each process
    processes: int = 32  # processes and threads at once
    output_bytes: int = 64 << 10  # of stdout, and of stderr; more stops the program
    file_bytes: int = 16 << 20  # the largest file it may write
    scratch_bytes: int = 64 << 20  # the size of each tmpfs it may write in (/tmp, /dev/shm)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kind = int | float if isinstance(field.default, float) else int  # the rlimits: whole
            if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
                what = "number" if kind is not int else "whole number"
                raise ConfigError(
                    f"sandbox limit {field.name}={value!r}: expected a positive {what}",
                    hint=f"give {field.name} a {what} above 0 (default {field.default})",
                )


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What a run printed and how it ended.

    ``returncode`` is the program's exit status, or ``-N`` when signal N ended it (a
    status of 128 + N reads as that, as a shell reads it). ``limit`` names the limit that
    stopped it: ``wall_time``, ``cpu_time`` or ``output`` (enforced from outside, so
    certain), or ``memory``, ``processes``, ``file_size``, ``scratch_space`` (the
    program failed on the error that limit raises: the last error its stderr names);
    None when none did."""

    stdout: str
    stderr: str
    returncode: int
    limit: str | None
    stdout_truncated: bool
    stderr_truncated: bool
    seconds: float
    backend: str
    limits: SandboxLimits

    def report(self) -> str:
        """The text a model reads back: stdout, then stderr, then how it ended when not
        plainly (cut output, a non-zero status, a limit)."""
        parts = [self.stdout] if self.stdout else []
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr}")
        notes = []
        if self.stdout_truncated or self.stderr_truncated:
            notes.append(f"output cut at {self.limits.output_bytes} bytes")
        if self.limit is not None:
            notes.append(f"stopped by the {LIMIT_WORDS[self.limit](self.limits)}")
        elif self.returncode < 0:
            notes.append(f"killed by {signal.Signals(-self.returncode).name}")
        elif self.returncode:
            notes.append(f"exit status {self.returncode}")
        if notes:
            parts.append(f"[{'; '.join(notes)}]")
        if not parts:
            return "[no output]"
        return "\n".join(part.rstrip("\n") for part in parts)


LIMIT_WORDS = {
    "wall_time": lambda lim: f"time limit ({lim.wall_seconds:g} s)",
    "cpu_time": lambda lim: f"CPU time limit ({lim.cpu_seconds} s)",
    "output": lambda lim: f"output limit ({lim.output_bytes} bytes)",
    "memory": lambda lim: f"memory limit ({lim.memory_bytes >> 20} MiB a process)",
    "processes": lambda lim: f"process limit ({lim.processes} processes and threads)",
    "file_size": lambda lim: f"file size limit ({lim.file_bytes >> 20} MiB)",
    "scratch_space": lambda lim: f"scratch space limit ({lim.scratch_bytes >> 20} MiB)",
}
# What stderr says of the error each limit raises, and the line of any other exception.
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception)\b")
FAILED_ON = {
    "memory": ("MemoryError",),
    "processes": ("[Errno 11] Resource temporarily unavailable", "can't start new thread"),
    "file_size": ("[Errno 27] File too large",),
    "scratch_space": ("[Errno 28] No space left on device",),
}


def run_python(
    code: str,
    *,
    limits: SandboxLimits = SandboxLimits(),
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    backend: str | None = None,
) -> SandboxResult:
    """Run the Python program ``code`` in the sandbox, with ``python`` (default: the
    interpreter running pt, with its environment's packages) and only the variables
    ``env`` (the parent's environment is never passed), and wait for it to end.
    ``backend``: ``bwrap``, ``unshare`` or None (the first that works here: see
    :func:`choose_backend`). Raises :class:`SandboxUnavailable` where no sandbox can be
    made; anything the program does is in the result."""
    python = os.path.abspath(python or sys.executable)
    backend = backend or choose_backend(python)
    return _run(code, limits, dict(env or {}), python, backend)


@functools.cache
def choose_backend(python: str | None = None) -> str:
    """:func:`find_backend`, asked once for the process's life."""
    return find_backend(os.path.abspath(python or sys.executable))


def find_backend(python: str) -> str:
    """The first backend that runs a program with ``python`` here, bwrap before unshare,
    each tried on a program that does nothing."""
    reasons = []
    for backend in BACKENDS:
        reason = backend_problem(backend, python)
        if reason is None:
            return backend
        reasons.append(f"{backend}: {reason}")
    raise SandboxUnavailable(
        "no sandbox for model-written code on this machine (" + "; ".join(reasons) + ")",
        hint="install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf "
        "install bubblewrap) and allow unprivileged user namespaces, or run as root",
    )


def backend_problem(backend: str, python: str) -> str | None:
    """Why ``backend`` cannot run a program here, or None when it can."""
    reason = unavailable_reason(backend)
    if reason is not None:
        return reason
    try:
        result = _run("pass", SandboxLimits(wall_seconds=60), {}, python, backend)
    except RunFailure as exc:
        return exc.message
    if result.returncode != 0:
        return f"a program that does nothing ended with status {result.returncode}"
    return None


def _run(code: str, limits: SandboxLimits, env: dict, python: str, backend: str) -> SandboxResult:
    placed = placement(interpreter_dirs(python))
    shown = shown_path(python, placed)  # the program's interpreter, as the sandbox shows it
    ready_read, ready_write = os.pipe()
    settings = {
        "python": shown,
        "scratch": SCRATCH[0],
        "limits": dataclasses.asdict(limits),
        "env": _program_env(shown, env),
        "ready_fd": ready_write,
        "user": sandbox_user(),
        "view": None if backend == "bwrap" else fallback_view(placed, limits.scratch_bytes),
    }
    if backend == "bwrap":  # inside.py starts in the sandbox's view
        wrapper, launcher = bwrap_command(placed, limits.scratch_bytes), shown
    else:  # inside.py starts in the host's view, and makes the sandbox's
        wrapper, launcher = unshare_command(), python
    started = time.monotonic()
    try:
        process = _Sandboxed([*wrapper, launcher, "-I", "-S", "-c", INSIDE, json.dumps(settings)],
                             ready_write)  # fmt: skip
    finally:
        os.close(ready_write)
    watch = _Watch(process, ready_read, limits, started + limits.wall_seconds)
    try:
        watch.run(code.encode())
    finally:
        os.close(ready_read)
        returncode = process.end()
    if watch.setup[:1] != b"1" or len(watch.setup) > 1:  # see inside.py's main
        why = watch.setup[1:] or watch.stderr or f"exit status {returncode}".encode()
        raise RunFailure(
            f"the sandbox ({backend}) could not start: {why.decode(errors='replace').strip()}",
            hint="see Sandbox in docs/pt-rollout.md for what each backend needs",
        )
    if watch.timed_out or watch.overflow:
        returncode = -signal.SIGKILL  # stopped here, whatever the wrapper made of it
    stderr = watch.stderr.decode(errors="replace")
    return SandboxResult(
        stdout=watch.stdout.decode(errors="replace"),
        stderr=stderr,
        returncode=returncode,
        limit=_limit(watch, returncode, time.monotonic() - started, stderr, limits),
        stdout_truncated=watch.overflow == "stdout",
        stderr_truncated=watch.overflow == "stderr",
        seconds=time.monotonic() - started,
        backend=backend,
        limits=limits,
    )


def _program_env(python: str, env: dict) -> dict:
    threads = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1")
    path = f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin"
    base = {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", **threads}
    return {**base, **env}


def _limit(watch, returncode: int, seconds: float, stderr: str, limits) -> str | None:
    if watch.timed_out:
        return "wall_time"
    if watch.overflow:
        return "output"
    # SIGXCPU at the CPU limit; SIGKILL a second later for a program that ignores it (or
    # one that killed itself after as long: the kernel's signal is the same)
    if returncode == -signal.SIGXCPU or (
        returncode == -signal.SIGKILL and seconds >= limits.cpu_seconds
    ):
        return "cpu_time"
    if returncode == 0:
        return None
    # The last error stderr names: a limit's, or another exception's line after it. Not
    # only its last line: processes print over each other (Python writes an exception's
    # name and message apart), and a traceback is cut short when the program's end ends
    # the process writing it.
    met = None
    for line in stderr.splitlines():
        signed = [limit for limit, signs in FAILED_ON.items() if any(s in line for s in signs)]
        if signed:
            met = signed[0]
        elif EXCEPTION_LINE.match(line):
            met = None
    return met


class _Sandboxed:
    """The wrapper process (bwrap or unshare), started in a process group of its own, and
    the first process of the pid namespace it makes, once that runs."""

    def __init__(self, argv: list[str], ready_fd: int):
        self.popen = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(ready_fd,), start_new_session=True, env=WRAPPER_ENV,
        )  # fmt: skip
        self.pid = self.popen.pid
        self.first: list[int] = []  # pidfds of the namespace's first process

    def namespace_made(self) -> None:
        """The program's sandbox runs: hold on to its first process (a pidfd, which no
        later process with the same pid can be mistaken for)."""
        for child in _children(self.pid):
            with contextlib.suppress(ProcessLookupError):
                self.first.append(os.pidfd_open(child))

    def end(self) -> int:
        """End the run, if it has not ended, and wait until every process of it is gone:
        kill the namespace's first process (the kernel then kills every other one in it,
        and the wrapper ends), the wrapper's group too if it does not; reap the wrapper.
        The program's status as :attr:`SandboxResult.returncode` gives it."""
        if not _ended(self.pid, 0):
            for child in self.first:
                signal.pidfd_send_signal(child, signal.SIGKILL)
            for child in _children(self.pid):  # a namespace made after the last look
                os.kill(child, signal.SIGKILL)
            if not _ended(self.pid, KILL_WAIT_SECONDS):
                os.killpg(self.pid, signal.SIGKILL)  # not reaped yet: the group is still its
        _, status = os.waitpid(self.pid, 0)
        self.popen.returncode = code = os.waitstatus_to_exitcode(status)
        for child in self.first:  # bwrap may end before its first process has ended
            _ended(child, KILL_WAIT_SECONDS, pidfd=True)
            os.close(child)
        if code - 128 in _SIGNALS:  # the wrapper passes on a program killed by signal N as 128 + N
            code = -(code - 128)
        return code


def _ended(pid: int, timeout: float, *, pidfd: bool = False) -> bool:
    """Whether process ``pid`` (or the process of pidfd ``pid``) ends within ``timeout``."""
    fd = pid if pidfd else os.pidfd_open(pid)
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            return bool(selector.select(timeout))
    finally:
        if not pidfd:
            os.close(fd)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class _Watch:
    """The run's pipes and its end, watched together until the program ends or a limit
    is reached: the program written to stdin, stdout and stderr read up to the output
    limit, and what inside.py says of the start on the ready pipe."""

    def __init__(self, process: _Sandboxed, ready_fd: int, limits, deadline: float):
        self.process, self.ready_fd, self.limits, self.deadline = (
            process, ready_fd, limits, deadline,
        )  # fmt: skip
        self.stdout, self.stderr = b"", b""
        self.setup = b""  # what inside.py said on the ready pipe
        self.timed_out = False
        self.overflow: str | None = None

    def run(self, code: bytes) -> None:
        popen = self.process.popen
        assert popen.stdin and popen.stdout and popen.stderr
        exited = os.pidfd_open(popen.pid)
        selector = selectors.DefaultSelector()
        try:
            os.set_blocking(popen.stdin.fileno(), False)
            selector.register(popen.stdin, selectors.EVENT_WRITE, "stdin")
            for name, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
                selector.register(pipe, selectors.EVENT_READ, name)
            selector.register(self.ready_fd, selectors.EVENT_READ, "ready")
            selector.register(exited, selectors.EVENT_READ, "exited")
            self._loop(selector, code)
        finally:
            selector.close()
            os.close(exited)
            popen.stdin.close()

    def _loop(self, selector: selectors.BaseSelector, code: bytes) -> None:
        open_pipes = {"stdout", "stderr"}
        exited = False
        while open_pipes or not exited:
            left = self.deadline - time.monotonic()
            if left <= 0:
                self.timed_out = True
                return
            for key, _ in selector.select(left):
                if key.data == "exited":
                    exited = True
                    selector.unregister(key.fileobj)
                elif key.data == "stdin":
                    code = self._write(selector, key, code)
                elif key.data == "ready":
                    self._setup(selector, key)
                elif not self._read(key):
                    open_pipes.discard(key.data)
                    selector.unregister(key.fileobj)
                if self.overflow:
                    return

    def _setup(self, selector: selectors.BaseSelector, key) -> None:
        said = os.read(self.ready_fd, 1 << 12)
        if said and not self.setup:
            self.process.namespace_made()
        self.setup += said
        if not said:
            selector.unregister(key.fileobj)

    def _write(self, selector: selectors.BaseSelector, key, code: bytes) -> bytes:
        try:
            code = code[os.write(key.fd, code[: 1 << 16]) :]
        except BrokenPipeError:  # it ended before reading all: its stderr says why
            code = b""
        if not code:
            selector.unregister(key.fileobj)
            key.fileobj.close()
        return code

    def _read(self, key) -> bool:
        chunk = os.read(key.fd, 1 << 16)
        if not chunk:
            return False
        kept = getattr(self, key.data) + chunk
        if len(kept) > self.limits.output_bytes:
            kept, self.overflow = kept[: self.limits.output_bytes], key.data
        setattr(self, key.data, kept)
        return True
