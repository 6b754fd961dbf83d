"""The sandbox for model-written code (pt_rollout.sandbox): what a program sees and may do,
what stops it, and hostile programs, each run on both backends (bubblewrap, and the
unshare fallback), each followed by a look at the host: no process of the run left, the
files planted for it unread and unchanged, nothing written outside its scratch space,
the processes it aimed at alive.

Skipped where a backend cannot run here (bwrap not installed, not root for the
fallback); failed instead with ``PT_REQUIRE_SANDBOX=1`` or ``CI=true`` (.ci/run sets it,
.ci/setup-sandbox.sh installs bubblewrap).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from pt_core.errors import ConfigError
from pt_rollout.sandbox import SandboxLimits, SandboxUnavailable, run_python
from pt_rollout.sandbox.backends import BACKENDS
from pt_rollout.sandbox.run import backend_problem

REPO = Path(__file__).resolve().parents[3]
# Small limits, so that a program that reaches one is stopped in about a second.
LIMITS = SandboxLimits(
    cpu_seconds=1,
    wall_seconds=10,
    memory_bytes=512 << 20,
    processes=16,
    file_bytes=1 << 20,
    scratch_bytes=4 << 20,
)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request):
    problem = backend_problem(request.param, sys.executable)
    if problem is not None:
        why = f"sandbox backend {request.param} cannot run here: {problem}"
        if os.environ.get("PT_REQUIRE_SANDBOX") == "1" or os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return request.param


class Host:
    """What a program could harm, set up before it runs and looked at after: a file
    planted in the home directory, a secret in this process's environment, a process and
    a listening socket of the host, and paths outside the scratch space a program may try
    to write (in the repository, in the host's /tmp). The program finds their names in its
    environment (``os.environ["PLANTED"]``...), as a model that guessed them would."""

    def __init__(self, backend: str, tmp_path: Path):
        self.backend = backend
        self.secret = f"secret-{uuid.uuid4().hex}"
        self.mark = uuid.uuid4().hex  # in the environment of every process of the run
        self.planted = Path.home() / f".pt-sandbox-planted-{uuid.uuid4().hex}"
        self.planted.write_text(self.secret)
        self.outside = [REPO / f"pt-sandbox-{self.mark}", Path("/tmp") / f"pt-sandbox-{self.mark}"]
        self.victim = subprocess.Popen(["sleep", "600"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.setblocking(False)
        self.env = {
            "PT_SANDBOX_MARK": self.mark,
            "PLANTED": str(self.planted),
            "VICTIM": str(self.victim.pid),
            "PORT": str(self.listener.getsockname()[1]),
            "REPO_TARGET": str(self.outside[0]),
            "TMP_TARGET": str(self.outside[1]),
            "HOST_TMP": str(tmp_path),
        }

    def run(self, code: str, **limits):
        limits = {**LIMITS.__dict__, **limits}
        return run_python(code, limits=SandboxLimits(**limits), env=self.env, backend=self.backend)

    def leftovers(self) -> list[int]:
        """Processes of the host whose environment carries the run's mark."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if f"PT_SANDBOX_MARK={self.mark}".encode() in (entry / "environ").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found

    def assert_unharmed(self, result) -> None:
        assert self.leftovers() == []
        assert self.victim.poll() is None, "the host's process was killed"
        assert self.planted.read_text() == self.secret
        assert self.secret not in result.stdout + result.stderr
        with pytest.raises(BlockingIOError):  # nobody connected to the host's listener
            self.listener.accept()
        for path in self.outside:
            assert not path.exists(), f"{path} was written"

    def close(self) -> None:
        for pid in self.leftovers():
            os.kill(pid, 9)
        self.victim.kill()
        self.victim.wait()
        self.listener.close()
        self.planted.unlink(missing_ok=True)
        for path in self.outside:
            path.unlink(missing_ok=True)


@pytest.fixture
def host(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("PT_SANDBOX_TEST_SECRET", "placeholder")
    made = Host(backend, tmp_path)
    monkeypatch.setenv("PT_SANDBOX_TEST_SECRET", made.secret)
    yield made
    made.close()


def test_the_look_at_the_host_sees_a_process_left_and_a_file_written(backend, tmp_path):
    """The check every hostile program is followed by can fail: a process of the host with
    the run's mark, and a file where a program must not write, are both seen."""
    made = Host(backend, tmp_path)
    nothing = run_python("pass", env=made.env, backend=backend)
    made.assert_unharmed(nothing)
    left = subprocess.Popen(["sleep", "600"], env={**made.env, "PATH": os.environ["PATH"]})
    try:
        # /proc/PID/environ is the new one only once the exec is through: on a busy machine
        # that can be after Popen returns
        deadline = time.monotonic() + 10
        while made.leftovers() != [left.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert made.leftovers() == [left.pid]
        made.outside[1].write_text("written")
        with pytest.raises(AssertionError):
            made.assert_unharmed(nothing)
    finally:
        left.kill()
        left.wait()
        made.close()


# --- what a program sees and gets back ----------------------------------------------------


def test_a_program_prints_and_its_exit_status_comes_back(host):
    """stdout, stderr and the status are the program's own; no limit stopped it; a
    status above 128 that is no signal's stays a status."""
    result = host.run("import sys\nprint(2 ** 100)\nprint('careful', file=sys.stderr)\nsys.exit(3)")
    assert result.stdout == "1267650600228229401496703205376\n"
    assert result.stderr == "careful\n"
    assert (result.returncode, result.limit) == (3, None)
    assert result.report() == "1267650600228229401496703205376\n[stderr]\ncareful\n[exit status 3]"
    assert host.run("raise SystemExit(200)").report() == "[exit status 200]"
    terminated = host.run("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)")
    assert (terminated.returncode, terminated.report()) == (-15, "[killed by SIGTERM]")
    host.assert_unharmed(result)


def test_a_program_works_in_a_fresh_scratch_directory_it_can_import_from(host):
    """Its working directory is /tmp, empty at each run (a file of an earlier run is
    gone), and a module it writes there imports."""
    first = host.run(
        "open('helper.py', 'w').write('ANSWER = 42')\nimport helper\nprint(helper.ANSWER)"
    )
    assert first.stdout == "42\n"
    second = host.run("import os\nprint(os.getcwd(), sorted(os.listdir('.')))")
    assert second.stdout == "/tmp ['main.py']\n"
    host.assert_unharmed(second)


def test_an_interpreter_under_tmp_is_shown_elsewhere_and_the_scratch_stays_empty(backend):
    """A virtual environment in the host's /tmp (a checkout there) runs the program, with
    its own packages, from /run/pt-sandbox, read-only; the program's /tmp holds only its
    own files, and a write to the environment's host path or its shown path fails."""
    venv = Path(tempfile.mkdtemp(prefix="pt-sandbox-venv-", dir="/tmp"))
    venv.chmod(0o755)  # the program's user reads it, as it reads a checkout's environment
    try:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
        (site,) = (venv / "lib").glob("python*/site-packages")
        (site / "pt_sandbox_probe.py").write_text("WHERE = 'the venv under /tmp'\n")
        code = f"""import os, sys, pt_sandbox_probe
print(os.getcwd(), sorted(os.listdir('/tmp')), sys.prefix, pt_sandbox_probe.WHERE)
for path in ({str(venv)!r}, sys.prefix):
    try:
        open(path + '/written', 'w').write('written')
        print('written')
    except OSError as exc:
        print(type(exc).__name__)
"""
        python = str(venv / "bin" / "python")
        result = run_python(code, limits=LIMITS, python=python, backend=backend)
        lines = result.stdout.splitlines()
        assert lines[0] == "/tmp ['main.py'] /run/pt-sandbox/0 the venv under /tmp", result.report()
        assert lines[1] == "FileNotFoundError"  # the host's /tmp is not there
        assert lines[2] in ("OSError", "PermissionError")  # read-only
        assert not (venv / "written").exists()
    finally:
        shutil.rmtree(venv)


def test_a_program_runs_as_an_unprivileged_user_without_new_privileges(host):
    """Not root, and a setuid program could not make it root again (no_new_privs)."""
    result = host.run(
        "import os\nstatus = open('/proc/self/status').read()\n"
        "print(os.getuid() != 0, 'NoNewPrivs:\\t1' in status, 'CapEff:\\t0000000000000000' in status)"
    )
    assert result.stdout == "True True True\n"


def test_the_interpreters_packages_are_importable(host):
    """The program runs with the interpreter running pt and its environment's packages."""
    result = host.run("import sympy\nprint(sympy.factorint(2 ** 10 * 3))")
    assert result.stdout == "{2: 10, 3: 1}\n", result.report()


# --- hostile programs ------------------------------------------------------------------------


def test_a_fork_bomb_is_stopped_by_the_process_limit(host):
    result = host.run("import os\nwhile True:\n    os.fork()")
    assert result.limit == "processes", result.report()
    assert "stopped by the process limit (16 processes and threads)" in result.report()
    host.assert_unharmed(result)


@pytest.mark.parametrize(
    ("stderr", "limit"),
    [
        # a traceback cut short after the error, and an error's name and message apart
        ("BlockingIOError: [Errno 11] Resource temporarily unavailable\\n"
         "Traceback (most recent call last):\\n    os.fork()\\n", "processes"),
        ("BlockingIOError:     os.fork()[Errno 11] Resource temporarily unavailable\\n",
         "processes"),
        # a limit's error the program got over, then another one
        ("MemoryError\\nTraceback (most recent call last):\\nValueError: no limit\\n", None),
    ],
)  # fmt: skip
def test_the_limit_a_program_failed_on_is_the_last_error_its_stderr_names(host, stderr, limit):
    """The processes of a fork bomb print over each other, and the last traceback is cut
    short when the program's end ends them: the last error stderr names still says which
    limit it met (the stderr here written by the program itself, as it would come)."""
    code = f"import sys\nsys.stderr.write('{stderr}')\nsys.exit(1)"
    assert host.run(code).limit == limit


def test_a_thread_bomb_is_stopped_by_the_process_limit(host):
    """Linux counts threads against the same limit as processes."""
    code = (
        "import threading, time\nwhile True:\n"
        "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()"
    )
    result = host.run(code)
    assert result.limit == "processes", result.report()
    assert "can't start new thread" in result.stderr
    host.assert_unharmed(result)


def test_an_endless_loop_is_stopped_by_the_cpu_limit(host):
    result = host.run("while True:\n    pass")
    assert (result.limit, result.returncode) == ("cpu_time", -24)  # SIGXCPU
    assert result.report() == "[stopped by the CPU time limit (1 s)]"
    host.assert_unharmed(result)


def test_an_endless_loop_that_ignores_sigxcpu_is_killed_a_second_later(host):
    """The hard limit, a second above the soft one, kills it (SIGKILL) well before the
    wall time (10 s) would."""
    result = host.run(
        "import signal\nsignal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass"
    )
    assert (result.limit, result.returncode) == ("cpu_time", -9)
    host.assert_unharmed(result)


def test_sleeping_beyond_the_wall_time_is_stopped_and_keeps_what_was_printed(host):
    """No CPU used, so only the wall clock stops it; what it printed before is kept
    (the program's output is unbuffered)."""
    result = host.run("import time\nprint('started')\ntime.sleep(600)", wall_seconds=1)
    assert (result.limit, result.returncode, result.stdout) == ("wall_time", -9, "started\n")
    assert 1 <= result.seconds < 10  # not the 600 s it asked for
    assert result.report() == "started\n[stopped by the time limit (1 s)]"
    host.assert_unharmed(result)


def test_a_10_gb_allocation_fails_with_a_memory_error(host):
    result = host.run("x = bytearray(10 * 2**30)")
    assert result.limit == "memory"
    assert result.stderr.rstrip().endswith("MemoryError")
    host.assert_unharmed(result)


def test_huge_stdout_is_cut_at_the_output_limit_and_stops_the_program(host):
    result = host.run("while True:\n    print('x' * 1000)", output_bytes=4096)
    assert (result.limit, result.stdout_truncated, len(result.stdout)) == ("output", True, 4096)
    assert result.report().endswith(
        "[output cut at 4096 bytes; stopped by the output limit (4096 bytes)]"
    )
    host.assert_unharmed(result)


def test_a_huge_file_in_scratch_is_stopped_by_the_file_size_limit(host):
    result = host.run("open('big', 'wb').write(b'0' * (2 << 20))")
    assert result.limit == "file_size"
    host.assert_unharmed(result)


def test_filling_the_scratch_space_with_many_files_runs_out_of_space(host):
    """Files under the size limit each, 4 MiB in all: the tmpfs is full, the disk is not
    touched."""
    code = "i = 0\nwhile True:\n    open(f'f{i}', 'wb').write(b'0' * (512 << 10))\n    i += 1"
    result = host.run(code)
    assert result.limit == "scratch_space"
    host.assert_unharmed(result)


def test_filling_memory_through_dev_shm_is_bounded(host):
    """/dev/shm is a tmpfs of the scratch space's size, not the host's."""
    code = (
        "i = 0\nwhile True:\n    open(f'/dev/shm/f{i}', 'wb').write(b'0' * (512 << 10))\n    i += 1"
    )
    result = host.run(code)
    assert result.limit == "scratch_space"
    host.assert_unharmed(result)


def test_no_network_out_nor_to_the_hosts_loopback(host):
    """Its network namespace has no route out, and its loopback is not the host's: the
    host's listener on 127.0.0.1 gets no connection."""
    code = """import os, socket
for address in [('1.1.1.1', 80), ('127.0.0.1', int(os.environ['PORT']))]:
    try:
        socket.create_connection(address, timeout=2)
        print('connected', address)
    except OSError as exc:
        print(type(exc).__name__)
"""
    result = host.run(code)
    assert "connected" not in result.stdout
    assert len(result.stdout.splitlines()) == 2
    host.assert_unharmed(result)


def test_the_home_directory_cannot_be_read(host):
    """A file planted in the home directory of the user running pt: bwrap shows no home;
    the fallback covers /root and /home with empty tmpfs."""
    code = "import os\ntry:\n    print(open(os.environ['PLANTED']).read())\nexcept OSError as exc:\n    print(type(exc).__name__)"
    result = host.run(code)
    assert result.stdout == "FileNotFoundError\n"
    assert os.listdir(Path.home())  # and it is there on the host
    host.assert_unharmed(result)


def test_etc_shadow_cannot_be_read(host):
    code = "try:\n    print(open('/etc/shadow').read())\nexcept OSError as exc:\n    print(type(exc).__name__)"
    result = host.run(code)
    assert result.stdout in ("FileNotFoundError\n", "PermissionError\n")
    host.assert_unharmed(result)


def test_writing_outside_the_scratch_space_fails_or_stays_inside(host):
    """The repository and the home directory are not writable; the host's /tmp is not
    the program's /tmp (a file it writes there is in its scratch space, gone after)."""
    code = """import os
for name in ('REPO_TARGET', 'PLANTED', 'TMP_TARGET'):
    try:
        open(os.environ[name], 'w').write('written')
        print(name, 'written')
    except OSError as exc:
        print(name, type(exc).__name__)
"""
    result = host.run(code)
    lines = result.stdout.splitlines()
    assert lines[0] in ("REPO_TARGET FileNotFoundError", "REPO_TARGET OSError")  # not there / ro
    assert lines[1] in ("PLANTED FileNotFoundError", "PLANTED OSError")
    assert lines[2] == "TMP_TARGET written"
    host.assert_unharmed(result)


def test_deleting_files_outside_the_scratch_space_fails(host):
    """The planted file and a file of the host's /tmp stay."""
    sacrificial = Path(host.env["HOST_TMP"]) / "keep-me"
    sacrificial.write_text("kept")
    code = """import os
for path in (os.environ['PLANTED'], os.environ['HOST_TMP'] + '/keep-me', '/usr/bin/env'):
    try:
        os.remove(path)
        print('removed', path)
    except OSError as exc:
        print(type(exc).__name__)
"""
    result = host.run(code)
    assert "removed" not in result.stdout
    assert sacrificial.read_text() == "kept" and Path("/usr/bin/env").exists()
    host.assert_unharmed(result)


def test_symlinks_and_hard_links_do_not_reach_outside(host):
    code = """import os
for make in (os.symlink, os.link):
    try:
        make(os.environ['PLANTED'], 'escape')
        print(open('escape').read())
    except OSError as exc:
        print(type(exc).__name__)
    if os.path.lexists('escape'):
        os.remove('escape')
"""
    result = host.run(code)
    assert result.stdout == "FileNotFoundError\nFileNotFoundError\n"
    host.assert_unharmed(result)


def test_killing_its_parent_fails_and_the_host_is_untouched(host):
    """Its parent is the first process of its pid namespace, which it may not signal; the
    host's processes it cannot see at all."""
    code = """import os
for pid in (os.getppid(), 1, int(os.environ['VICTIM'])):
    try:
        os.kill(pid, 9)
        print('killed', pid)
    except OSError as exc:
        print(type(exc).__name__)
print('alive')
"""
    result = host.run(code)
    assert "killed" not in result.stdout and result.stdout.endswith("alive\n")
    host.assert_unharmed(result)


def test_killing_every_process_it_may_signal_reaches_none_of_the_hosts(host):
    result = host.run("import os\nos.kill(-1, 9)\nprint('alive')")
    assert result.returncode in (0, 1)  # nothing else to kill, or not allowed: it lives
    host.assert_unharmed(result)


def test_processes_it_leaves_behind_end_with_it(host):
    """A double fork with setsid, and nohup sleep: both outlive the program, not the run."""
    code = """import os, subprocess, time
subprocess.Popen(['nohup', 'sleep', '600'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True:
            time.sleep(1)
    os._exit(0)
print('left them')
"""
    result = host.run(code)
    assert result.stdout == "left them\n"
    host.assert_unharmed(result)  # no process of the run left


def test_a_program_that_closes_its_output_and_hides_is_stopped_at_the_wall_time(host):
    code = "import os, time\nos.close(1)\nos.close(2)\nwhile True:\n    time.sleep(1)"
    result = host.run(code, wall_seconds=1)
    assert result.limit == "wall_time"
    host.assert_unharmed(result)


def test_raising_its_limits_fails(host):
    code = """import resource
try:
    resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
except ValueError as exc:
    print(exc)
print(resource.getrlimit(resource.RLIMIT_NPROC))
"""
    result = host.run(code)
    assert result.stdout == "not allowed to raise maximum limit\n(16, 16)\n"
    host.assert_unharmed(result)


def test_ptrace_of_its_parent_and_of_the_hosts_processes_fails(host):
    code = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for pid in (1, int(os.environ['VICTIM'])):
    print(libc.ptrace(16, pid, 0, 0), os.strerror(ctypes.get_errno()))  # PTRACE_ATTACH
"""
    result = host.run(code)
    assert result.stdout == "-1 Operation not permitted\n-1 No such process\n"
    host.assert_unharmed(result)


def test_the_parents_environment_is_not_passed(host):
    """Not in its environment, nor in the environment of the processes it can see."""
    code = """import os
print(sorted(os.environ))
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            print(open(f'/proc/{pid}/environ').read())
        except OSError:
            pass
"""
    result = host.run(code)
    assert "PT_SANDBOX_TEST_SECRET" not in result.stdout
    host.assert_unharmed(result)  # the secret is nowhere in the output


def test_proc_shows_only_the_runs_processes_and_cannot_be_written(host):
    code = """import os
print(len([p for p in os.listdir('/proc') if p.isdigit()]) <= 3)
for path in ('/proc/sysrq-trigger', '/proc/sys/kernel/hostname', '/proc/1/root/x'):
    try:
        open(path, 'w').write('x')
        print('wrote', path)
    except OSError as exc:
        print(type(exc).__name__)
"""
    result = host.run(code)
    lines = result.stdout.splitlines()
    assert lines[0] == "True" and not any(line.startswith("wrote") for line in lines)
    host.assert_unharmed(result)


def test_libc_through_ctypes_cannot_mount_nor_become_root(host):
    """setuid(0) and mount(2) over a host directory, called straight through libc."""
    code = """import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print('setuid', libc.setuid(0), os.getuid() != 0)
print('mount', libc.mount(b'tmpfs', os.environ['HOST_TMP'].encode(), b'tmpfs', 0, None))
"""
    result = host.run(code)
    assert result.stdout == "setuid -1 True\nmount -1\n"
    assert not os.path.ismount(host.env["HOST_TMP"])
    host.assert_unharmed(result)


def test_the_kernel_interfaces_exploits_start_from_are_closed(host):
    """A user namespace of its own (unshare, or clone with CLONE_NEWUSER), bpf, keyrings,
    userfaultfd and io_uring fail with EPERM (the seccomp filter); clone3, whose flags a
    filter cannot read, with ENOSYS, so that threads and processes are made with clone."""
    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip(f"no seccomp filter on {os.uname().machine}")
    code = """import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
numbers = {"x86_64": {"bpf": 321, "keyctl": 250, "userfaultfd": 323, "io_uring_setup": 425,
                      "clone3": 435, "clone": 56},
           "aarch64": {"bpf": 280, "keyctl": 219, "userfaultfd": 282, "io_uring_setup": 425,
                       "clone3": 435, "clone": 220}}[os.uname().machine]
for name, number in numbers.items():
    first = 0x10000000 | 17 if name == "clone" else 0  # CLONE_NEWUSER | SIGCHLD
    print(name, libc.syscall(number, first, 0, 0, 0, 0), os.strerror(ctypes.get_errno()))
print("unshare", libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))
thread = threading.Thread(target=print, args=("a thread runs",))
thread.start()
thread.join()
"""
    result = host.run(code)
    assert result.stdout == (
        "bpf -1 Operation not permitted\n"
        "keyctl -1 Operation not permitted\n"
        "userfaultfd -1 Operation not permitted\n"
        "io_uring_setup -1 Operation not permitted\n"
        "clone3 -1 Function not implemented\n"
        "clone -1 Operation not permitted\n"
        "unshare -1 Operation not permitted\n"
        "a thread runs\n"
    ), result.report()
    host.assert_unharmed(result)


# --- refusals ----------------------------------------------------------------------------------


def test_without_any_backend_the_sandbox_is_refused_with_the_fix(monkeypatch, tmp_path):
    """No bwrap nor unshare on PATH: nothing runs, and the error says what to install."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert backend_problem("bwrap", sys.executable) == "bwrap (bubblewrap) is not installed"
    assert backend_problem("unshare", sys.executable) == "unshare (util-linux) is not installed"
    from pt_rollout.sandbox.run import find_backend

    with pytest.raises(SandboxUnavailable, match="no sandbox for model-written code") as caught:
        find_backend(sys.executable)
    assert "apt-get install bubblewrap" in str(caught.value.hint)


AS_A_USER = """
import json, os
from pt_rollout.sandbox.run import backend_problem, find_backend, run_python
result = run_python(
    "import os\\nprint(os.getuid())\\nprint(open(os.environ['PLANTED']).read())",
    python="/usr/bin/python3", env={"PLANTED": os.environ["PLANTED"]},
)
print(json.dumps({"uid": os.getuid(), "unshare": backend_problem("unshare", "/usr/bin/python3"),
                  "chosen": find_backend("/usr/bin/python3"), "stdout": result.stdout,
                  "stderr": result.stderr.splitlines()[-1], "backend": result.backend}))
"""


def test_as_a_user_who_is_not_root_bwrap_maps_the_user_into_a_user_namespace(tmp_path):
    """Most users run pt as themselves: bwrap then makes a user namespace, the program
    runs as that user in it, sees no home, and the fallback is refused (it needs root).
    Run here as ``nobody``, with the system's interpreter (this environment's is in
    root's home, which nobody may not read) and pt's sources on its path."""
    if os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or not shutil.which("setpriv"):
        pytest.skip("needs root (to become nobody), setpriv and /usr/bin/python3")
    if backend_problem("bwrap", sys.executable) is not None:
        pytest.skip("bwrap cannot run here")
    planted = Path.home() / f".pt-sandbox-planted-{uuid.uuid4().hex}"
    planted.write_text("secret")
    sources = [REPO / "packages" / p / "src" for p in ("pt-core", "pt-rollout")]
    site = next(p for p in sys.path if p.endswith("site-packages"))  # pt's dist-info: versions
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PLANTED": str(planted),
           "PYTHONPATH": ":".join([*map(str, sources), site])}  # fmt: skip
    try:
        done = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
             "/usr/bin/python3", "-c", AS_A_USER],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        planted.unlink()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    nobody = pwd.getpwnam("nobody").pw_uid
    assert seen == {
        "uid": nobody,
        "unshare": "the unshare fallback needs root",
        "chosen": "bwrap",
        "stdout": f"{nobody}\n",
        "stderr": f"FileNotFoundError: [Errno 2] No such file or directory: '{planted}'",
        "backend": "bwrap",
    }


def test_a_missing_interpreter_is_refused(backend):
    with pytest.raises(SandboxUnavailable, match="interpreter /no/such/python does not run"):
        run_python("pass", python="/no/such/python", backend=backend)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("wall_seconds", 0, "a positive number"),
        ("memory_bytes", -1, "a positive whole number"),
        ("cpu_seconds", 0.5, "a positive whole number"),  # rlimits count whole seconds
    ],
)
def test_a_limit_that_is_not_a_positive_number_is_refused(field, value, expected):
    with pytest.raises(ConfigError, match=f"sandbox limit {field}={value}: expected {expected}"):
        SandboxLimits(**{field: value})
    assert SandboxLimits(wall_seconds=0.5).wall_seconds == 0.5
