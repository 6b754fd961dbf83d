"""Ranks: reading them from a launcher's environment, starting them ourselves, and
the few collectives the trainer needs.

Under ``torchrun``, ``deepspeed`` or ``accelerate launch`` the ranks come from
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``. With ``launcher.nproc=N`` (and no such
environment) ``pt-train run`` starts N local copies of itself with that
environment and forwards SIGTERM/SIGUSR1 and Ctrl-C (SIGINT) to them.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_core.errors import Interrupted
from pt_core.log import get_logger, set_rank

log = get_logger(__name__)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_env() -> DistEnv | None:
    """The ranks a launcher set up, or None when this is a plain process."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return DistEnv(
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        local_rank=int(os.environ.get("LOCAL_RANK", os.environ["RANK"])),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(backend: str) -> DistEnv:
    """Join (or, for a plain process, create) the process group; return this rank."""
    import torch
    import torch.distributed as dist

    env = launched_env()
    if env is None:
        os.environ.update(
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            MASTER_ADDR=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            MASTER_PORT=os.environ.get("MASTER_PORT", str(free_port())),
        )
        env = DistEnv(0, 1, 0)
    set_rank(env.rank)  # the pt loggers speak on rank 0 only
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(env.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size)
    return env


def all_reduce(values: list[float], device) -> list[float]:
    """Element-wise sums of ``values`` over all ranks, in one collective (float64)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def spawn_local_ranks(nproc: int, argv: list[str], master_port: int | None = None) -> int:
    """Run ``argv`` as ``nproc`` local ranks; return the exit code the job should end with.

    Rank 0's stdout (the manifest) is passed through; every other stream goes to
    stderr. SIGTERM/SIGUSR1 are forwarded so every rank checkpoints and stops. The ranks
    run in a session of their own, so that a terminal's Ctrl-C reaches this process
    alone, which forwards it as it is: a first SIGINT makes every rank save at the next
    step boundary and exit 130, a second stops them at once, without saving, and a third
    kills them. A rank that fails takes the others down rather than leaving them waiting
    in a collective. Ranks left when this process ends are killed; if it is killed, they
    get SIGTERM (save and stop) from the kernel.

    The result is a failed rank's code; else 130 if the ranks stopped on Ctrl-C;
    else REQUEUE_EXIT_CODE if they stopped on another signal; else 0.
    """
    port = master_port or free_port()
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    base["WORLD_SIZE"] = str(nproc)
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    clean = (0, REQUEUE_EXIT_CODE, Interrupted.exit_code)  # done, or stopped as asked
    procs: list[subprocess.Popen] = []
    interrupts = 0

    def forward(signum, _frame):
        nonlocal interrupts
        if signum == signal.SIGINT:
            interrupts += 1
        for p in procs:
            if p.poll() is not None:
                continue
            if interrupts > 2:
                p.kill()
            else:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    codes: dict[int, int] = {}
    preexec = _stop_with_parent()
    try:
        for rank in range(nproc):
            env = {
                **base,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(nproc),
            }
            procs.append(
                subprocess.Popen(
                    argv,
                    env=env,
                    stdout=None if rank == 0 else sys.stderr.fileno(),
                    start_new_session=True,
                    preexec_fn=preexec,
                )
            )
        while len(codes) < nproc:
            for i, p in enumerate(procs):
                if i in codes:
                    continue
                try:
                    code = p.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    continue
                codes[i] = code
                if code not in clean:
                    # after a second Ctrl-C a rank whose peer left mid-collective fails for
                    # that reason: the stop was asked for, not a failure to report
                    if interrupts < 2:
                        log.error("rank %d exited with %d; stopping the other ranks", i, code)
                    for q in procs:
                        if q.poll() is None:
                            q.kill()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s, h in old.items():
            signal.signal(s, h)
    failed = [c for c in codes.values() if c not in clean]
    if failed and interrupts < 2:
        return failed[0]
    if failed or Interrupted.exit_code in codes.values():
        return Interrupted.exit_code
    return REQUEUE_EXIT_CODE if REQUEUE_EXIT_CODE in codes.values() else 0


# prctl(2) option: the signal this process gets when its parent ends.
_PR_SET_PDEATHSIG = 1


def _stop_with_parent():
    """A ``preexec_fn`` that has the kernel send a rank SIGTERM when the process that
    started it ends, however it ends (even SIGKILL), so that the ranks, in a session of
    their own, do not outlive it; None where prctl(2) is not there (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent ended before prctl took effect
            os._exit(1)

    return preexec
