"""How the sandbox's process is started: the command that makes its namespaces and its
view of the file system, and which of the two ways works on this machine.

- ``bwrap`` (bubblewrap, Debian's ``bubblewrap`` package): new user, pid, network, ipc,
  uts and cgroup namespaces; a root of its own holding only /usr (and the /bin, /lib
  links into it), a few files of /etc, the interpreter's directories, all read-only;
  tmpfs of a bounded size at /tmp and /dev/shm, the only places it can write; a fresh
  /proc and a minimal /dev. Run as ``nobody`` when pt runs as root, else as the user.
- ``unshare`` (util-linux), where bwrap is missing or cannot make its namespaces: root
  only. New network, pid, mount, ipc, uts and cgroup namespaces, made by ``unshare``;
  the view is made inside (``inside.py``): empty tmpfs over /root and /home, every mount
  read-only and nosuid, tmpfs scratch at /tmp and /dev/shm; the program runs as
  ``nobody``. Unlike bwrap, the rest of the host's files stay visible: a program can
  read what any user may read (world-readable files outside the home directories).

An interpreter whose directories lie under /tmp or /dev/shm (a checkout in /tmp) cannot be
shown at its own path: the program's scratch space is there, and must be empty. Such
directories are shown read-only under ``/run/pt-sandbox`` instead (a virtual environment
runs from anywhere: Python finds it by its ``pyvenv.cfg``), and the interpreter is run
from there.

Elsewhere (no bwrap that works, not root) there is no sandbox, and pt says so.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

from pt_core.errors import ConfigError, RunFailure

BACKENDS = ("bwrap", "unshare")
PACKAGES = {"bwrap": "bubblewrap", "unshare": "util-linux"}
SCRATCH = ("/tmp", "/dev/shm")
# what a program may see of /etc: the dynamic loader's cache, time zone, user names
ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)
# hidden under the fallback (bwrap shows none of them)
HOMES = ("/root", "/home")
# where an interpreter's directories under a scratch path are shown instead (the fallback
# covers /run with a tmpfs of its own to make room for them)
SHOWN = "/run/pt-sandbox"
RUN_UIDS = 0x70000000  # where pt runs as root, each run's uid is one of the 2**24 above
WRAPPER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}  # never the parent's environment


class SandboxUnavailable(RunFailure):
    """No sandbox can be made here: code is not run at all."""


def sandbox_user() -> int:
    """The uid a program runs as. Where pt runs as root, a uid of the run's own, which no
    user of the machine has (root's files, the shadow passwords, the homes stay closed to
    it, and its processes count against its process limit alone); else pt's own user,
    which bwrap maps into a user namespace."""
    if os.geteuid() != 0:
        return os.geteuid()
    while True:
        uid = RUN_UIDS + secrets.randbelow(1 << 24)
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid


@functools.cache
def interpreter_dirs(python: str) -> tuple[str, ...]:
    """The directories ``python`` runs from (its prefixes, and its environment's), which
    the sandbox shows read-only at the same paths; those under /usr are shown anyway."""
    try:
        done = subprocess.run(
            [python, "-I", "-c", "import sys, json; print(json.dumps([sys.prefix, "
             "sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix]))"],
            capture_output=True, text=True, timeout=60, env=WRAPPER_ENV,
        )  # fmt: skip
        prefixes = json.loads(done.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(
            f"the sandbox's interpreter {python} does not run here ({exc})",
            hint="give python= an interpreter that runs on this machine",
        ) from None
    dirs = {os.path.realpath(p) for p in prefixes} | set(prefixes)
    dirs |= {os.path.dirname(python), os.path.dirname(os.path.realpath(python))}
    return tuple(sorted(d for d in dirs if d != "/usr" and not d.startswith("/usr/")))


def placement(dirs: tuple[str, ...]) -> dict[str, str]:
    """Where each of the interpreter's directories is shown in the sandbox: at its own
    path, or, under a scratch path, at ``SHOWN/N/...`` (a directory inside another one
    keeps its place in it)."""
    under_scratch = [d for d in dirs if any(_within(d, s) for s in SCRATCH)]
    tops = [d for d in under_scratch if not any(o != d and _within(d, o) for o in under_scratch)]
    moved = {top: f"{SHOWN}/{n}" for n, top in enumerate(sorted(tops))}
    return {d: shown_path(d, moved) for d in dirs}


def shown_path(path: str, placed: dict[str, str]) -> str:
    """``path`` as the sandbox shows it, given the directories' placement."""
    for host, shown in placed.items():
        if _within(path, host):
            return shown + path[len(host) :]
    return path


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def bwrap_command(placed: dict[str, str], scratch_bytes: int) -> list[str]:
    """bwrap and its options: the namespaces, the read-only view, the scratch tmpfs. As
    root, bwrap makes no user namespace and keeps only the capabilities inside.py needs
    to become the run's uid (it drops them with root, before the program starts); else it
    maps the user into a user namespace and forbids the program to make more."""
    if os.geteuid() == 0:
        argv = [_which("bwrap"), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
                "--unshare-cgroup-try", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID",
                "--cap-add", "CAP_SETGID"]  # fmt: skip
    else:
        argv = [_which("bwrap"), "--unshare-all", "--unshare-user", "--disable-userns"]
    argv += [
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):  # merged /usr: a link into it
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for path in ETC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for path in SCRATCH:
        argv += ["--perms", "1777", "--size", str(scratch_bytes), "--tmpfs", path]
    made = set()
    for path, shown in placed.items():
        for parent in reversed(Path(shown).parents[:-1]):  # bwrap would make them 0700
            if parent not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
        argv += ["--ro-bind", path, shown]
    return [*argv, "--remount-ro", "/", "--chdir", "/tmp", "--clearenv", "--"]


def unshare_command() -> list[str]:
    """unshare and its options: the namespaces; inside.py makes the view as pid 1.
    setpriv first has unshare killed if its caller dies (bwrap's --die-with-parent):
    unshare then kills the namespace's first process, and the kernel the rest."""
    return [_which("setpriv"), "--pdeathsig", "KILL", "--", _which("unshare"), "--net", "--pid", "--mount", "--ipc", "--uts", "--cgroup",
            "--fork", "--kill-child", "--propagation", "private", "--mount-proc", "--"]  # fmt: skip


def fallback_view(placed: dict[str, str], scratch_bytes: int) -> dict:
    """What inside.py mounts in the fallback's mount namespace: ``keep`` holds each
    directory's path on the host and in the sandbox."""
    moved = any(path != shown for path, shown in placed.items())
    return {
        "host_mount_namespace": os.readlink("/proc/self/ns/mnt"),
        "keep": [[path, shown] for path, shown in placed.items()],
        "hide": [*HOMES, *([os.path.dirname(SHOWN)] if moved else [])],
        "scratch": list(SCRATCH),
        "scratch_bytes": scratch_bytes,
    }


def unavailable_reason(backend: str) -> str | None:
    """Why ``backend`` cannot start here (None: it can; whether its namespaces can be made
    is only known by running it: :func:`pt_rollout.sandbox.run.find_backend`)."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"sandbox backend {backend!r} is not one of {', '.join(BACKENDS)}",
            hint="give bwrap, unshare, or none (the first of them that works here)",
        )
    for program in (backend, "setpriv") if backend == "unshare" else (backend,):
        if shutil.which(program) is None:
            return f"{program} ({PACKAGES[backend]}) is not installed"
    if backend == "unshare" and os.geteuid() != 0:
        return "the unshare fallback needs root"
    return None


def _which(program: str) -> str:
    """The path of ``program`` on this process's PATH (the wrapper gets a PATH of its own)."""
    path = shutil.which(program)
    assert path is not None, f"{program} was looked for before it is started"
    return path
