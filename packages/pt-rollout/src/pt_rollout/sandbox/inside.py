"""The first code that runs inside the sandbox, before the program.

It runs as ``python -S -c <this file's text> <settings as JSON>``: nothing of pt is
importable in there, so it uses the standard library only, and it defines no names a
program could reach (the program runs in a fresh interpreter, after ``exec``).

Under bubblewrap it is the command bwrap starts, as the sandbox's user, in the view bwrap
made: it reads the program from stdin, writes it to the scratch directory as
``main.py``, forbids new privileges and some system calls (a seccomp filter), lowers the
limits and executes the interpreter on it.

In the ``unshare`` fallback it starts as root and as pid 1 of fresh namespaces (network,
pid, mount, ipc, uts, cgroup), and first makes the view bubblewrap would have made:
empty tmpfs over the home directories, the interpreter's own directories bound back,
every mount read-only and nosuid, tmpfs scratch at /tmp and /dev/shm. Then it forks the
program as an unprivileged user (``nobody``) and waits for it, reaping orphans as an init
does; when the program ends, pid 1 ends and the kernel kills what is left in the
namespace.
"""

import ctypes
import json
import os
import resource
import sys

PR_SET_NO_NEW_PRIVS = 38
# mount(2) flags and mount_setattr(2) (Linux 5.12) attributes
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 4096, 16384, 1 << 18
MS_REMOUNT = 32
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID = 1, 2
SYS_MOUNT_SETATTR, AT_FDCWD, AT_RECURSIVE = 442, -100, 0x8000
# The seccomp filter, a machine: its audit arch, clone's and clone3's numbers, and the system
# calls answered EPERM: namespaces and mounts (a user namespace is where kernel exploits
# start), keyrings, bpf, perf, userfaultfd, io_uring, modules, kexec, reboot, swap, syslog.
SECCOMP = {
    "x86_64": (0xC000003E, 56, 435, (272, 308, 165, 166, 155, 428, 429, 430, 432, 442, 248,
               249, 250, 321, 298, 323, 425, 426, 427, 175, 313, 176, 246, 320, 169, 167,
               168, 103, 163)),
    "aarch64": (0xC00000B7, 220, 435, (97, 268, 40, 39, 41, 428, 429, 430, 432, 442, 217,
                218, 219, 280, 241, 282, 425, 426, 427, 105, 273, 106, 104, 294, 142, 224,
                225, 116, 89)),
}  # fmt: skip
PR_SET_SECCOMP, SECCOMP_MODE_FILTER, CLONE_NEWUSER = 22, 2, 0x10000000
EPERM, ENOSYS = 1, 38
LIMITS = {
    "cpu_seconds": resource.RLIMIT_CPU,
    "memory_bytes": resource.RLIMIT_AS,
    "processes": resource.RLIMIT_NPROC,
    "file_bytes": resource.RLIMIT_FSIZE,
}


class MountAttr(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clear", "propagation", "userns")]


def libc_call(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}{args[:2]}: {os.strerror(errno)}")


def mount(source, target, fstype, flags, data=None):
    def encode(text):
        return None if text is None else text.encode()

    libc_call("mount", encode(source), encode(target), encode(fstype), flags, encode(data))


def lower_limits(limits):
    """Soft and hard limits equal (a program cannot raise them again), but CPU time: at the
    soft limit SIGXCPU, a second later SIGKILL for a program that ignores it."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for key, which in LIMITS.items():
        value = limits[key]
        hard = value + 1 if which == resource.RLIMIT_CPU else value
        resource.setrlimit(which, (value, hard))


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                ("k", ctypes.c_uint)]  # fmt: skip


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def forbid_system_calls():
    """A seccomp filter (classic BPF): the calls of :data:`SECCOMP` fail with EPERM, clone
    with CLONE_NEWUSER too; clone3 (whose flags a filter cannot read) with ENOSYS, so that
    the C library falls back to clone; so do the calls of another ABI (x32, i386), whose
    numbers differ. On a machine not in the table, no filter."""
    if os.uname().machine not in SECCOMP:
        return
    arch, clone, clone3, denied = SECCOMP[os.uname().machine]
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, errno = 0x7FFF0000, 0x00050000
    program = [(load, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, errno | ENOSYS), (load, 0, 0, 0)]
    program += [(jge, 0, 1, 0x40000000), (ret, 0, 0, errno | ENOSYS)]  # x32's numbers
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, errno | ENOSYS)]
    for number in denied:
        program += [(jeq, 0, 1, number), (ret, 0, 0, errno | EPERM)]
    program += [(jeq, 0, 3, clone), (load, 0, 0, 16), (jset, 0, 1, CLONE_NEWUSER),
                (ret, 0, 0, errno | EPERM), (ret, 0, 0, allow)]  # fmt: skip
    filters = (SockFilter * len(program))(*[SockFilter(*op) for op in program])
    fprog = SockFprog(len(program), filters)
    libc_call("prctl", PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)


def become(user):
    """Become ``user`` (uid and gid), with no supplementary groups; from root, that drops
    every capability too. Where the sandbox already runs as ``user``, nothing to do."""
    if os.getuid() != user:
        os.setgroups([])
        os.setresgid(user, user, user)
        os.setresuid(user, user, user)


def run_program(settings, code):
    """Write ``code`` to the scratch directory and execute the interpreter on it."""
    become(settings["user"])
    libc_call("prctl", PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid program gives root back
    forbid_system_calls()
    os.chdir(settings["scratch"])
    with open("main.py", "wb") as fh:
        fh.write(code)
    lower_limits(settings["limits"])
    python = settings["python"]
    # -E -s: no PYTHON* variables, no user site; -u: what was printed before a kill is kept
    os.execve(python, [python, "-E", "-s", "-u", "main.py"], settings["env"])


def make_view(view):
    """The fallback's file system view, in this process's own mount namespace (checked
    first: on the host's, these mounts would change the host)."""
    if os.readlink("/proc/self/ns/mnt") == view["host_mount_namespace"]:
        raise RuntimeError("not in a mount namespace of its own")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = {shown: os.open(path, os.O_PATH | os.O_DIRECTORY) for path, shown in view["keep"]}
    for path in view["hide"]:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
    bind_back(keep)
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID, 0, 0, 0)
    args = (AT_FDCWD, b"/", AT_RECURSIVE, ctypes.byref(attr), ctypes.sizeof(attr))
    libc_call("syscall", SYS_MOUNT_SETATTR, *args)
    for path in view["scratch"]:
        size = view["scratch_bytes"]
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    bind_back(keep)


def bind_back(keep):
    """Bind each kept directory (open since before it was covered) at the path it is shown
    at, where it is not there yet (a mount covered it, or it is shown elsewhere), read-only."""
    for path, fd in keep.items():
        if os.path.isdir(path) and os.path.samestat(os.stat(path), os.fstat(fd)):
            continue
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)


def supervise(settings, code):
    """pid 1 of the fallback: fork the program as the unprivileged user, reap every
    process that ends, and end with the program's status."""
    program = os.fork()
    if program == 0:
        try:
            os.setsid()
            run_program(settings, code)
        except BaseException as exc:  # noqa: BLE001  (a child must never return here)
            fail(settings, exc)
    for fd in (0, 1, 2, settings["ready_fd"]):
        os.close(fd)
    while True:
        pid, status = os.wait()
        if pid == program:  # a shell's status: 128 + N for a program killed by signal N
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def fail(settings, exc):
    """Tell the parent why the sandbox could not be made, on ``ready_fd``, and end."""
    os.write(settings["ready_fd"], f"{exc}".encode())
    os._exit(125)


def main():
    """``ready_fd`` tells the parent how the start went: one byte when this code starts,
    then either the reason it could not start the program, or nothing and end of file (it
    is closed on exec): the program runs, and what it does is its own."""
    settings = json.loads(sys.argv[1])
    os.set_inheritable(settings["ready_fd"], False)
    os.write(settings["ready_fd"], b"1")
    code = sys.stdin.buffer.read()
    try:
        if settings.get("view") is None:
            run_program(settings, code)
        make_view(settings["view"])
    except (OSError, RuntimeError) as exc:
        fail(settings, exc)
    supervise(settings, code)


main()
