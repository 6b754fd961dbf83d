"""A real SLURM cluster for the tests marked ``slurm``: munged, slurmctld and one slurmd
per node started as root from a slurm.conf in a temporary directory, stopped at the end.
It has two nodes, both this machine: its own hostname and ``localhost`` (two slurmd
with ``-N``), so that multi-node jobs really rendezvous across two SLURM nodes.

Install the packages with ``.ci/setup-slurm.sh``. Where they are missing, or the tests
do not run as root, the ``slurm`` tests are skipped with the reason, unless
``PT_REQUIRE_SLURM=1`` (set in CI), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo")


def _missing() -> str | None:
    """Why a local cluster cannot start here, or None."""
    absent = [b for b in (*DAEMONS, *CLIENTS) if shutil.which(b) is None]
    if absent:
        return f"SLURM not installed (missing {', '.join(absent)}); run .ci/setup-slurm.sh"
    if os.geteuid() != 0:
        return "the local SLURM cluster is started as root; these tests are not running as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_lines() -> tuple[list[str], list[str]]:
    """Node names and their slurm.conf lines: this machine's real CPUs and memory, as
    slurmd itself sees them, once under its hostname and once as ``localhost``."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True).stdout
    line = next((x for x in out.splitlines() if x.startswith("NodeName=")), None)
    if line is None:
        line = f"NodeName={socket.gethostname().split('.')[0]} CPUs={os.cpu_count() or 1}"
    words = [w for w in line.split() if w.split("=")[0] not in ("UpTime", "NodeName")]
    host = line.split()[0].split("=", 1)[1]
    names = [host] if host == "localhost" else [host, "localhost"]
    lines = [
        f"NodeName={name} NodeAddr=127.0.0.1 Port={_free_port()} {' '.join(words)} State=UNKNOWN"
        for name in names
    ]
    return names, lines


SLURM_CONF = """\
ClusterName=ptlocal
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
# cred_expire also holds a requeued job back (120 s by default; 5 s is the minimum)
AuthInfo=socket={root}/munge/munge.socket,cred_expire=5
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge=3600
KillWait=10
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1,sched_min_interval=100000
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
# A job of the partition "high" preempts the jobs of "debug" it needs the nodes of, and
# SLURM requeues them (what a site's preemptible partition does); SIGTERM first, then
# GraceTime seconds to save.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
{nodes}
PartitionName=debug Nodes={node_names} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20
PartitionName=high Nodes={node_names} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF
"""


class LocalSlurm:
    """Handles on the running cluster for tests."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.nodes: list[str] = []

    # ----------------------------------------------------------------- life cycle

    def start(self) -> None:
        root = self.root
        for sub in ("state", "log", "munge"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o711)
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.nodes, node_lines = _node_lines()
        self.conf.write_text(
            SLURM_CONF.format(
                root=root,
                host=self.nodes[0],
                nodes="\n".join(node_lines),
                node_names=",".join(self.nodes),
                ctld_port=_free_port(),
            )
        )
        os.environ["SLURM_CONF"] = str(self.conf)
        munge = root / "munge"
        self._spawn(
            "munged",
            "--foreground",
            "--force",
            f"--key-file={key}",
            f"--socket={munge / 'munge.socket'}",
            f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}",
        )
        self._wait_for(lambda: (munge / "munge.socket").exists(), "munged socket")
        self._spawn("slurmctld", "-D", "-i", "-f", str(self.conf))
        for name in self.nodes:
            self._spawn("slurmd", "-D", "-N", name, "-f", str(self.conf), name=f"slurmd-{name}")
        self._wait_for(self._nodes_idle, "the nodes to become idle")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def _spawn(self, *argv: str, name: str | None = None) -> None:
        log = open(self.root / "log" / f"{name or argv[0]}.stderr", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=log))

    def _nodes_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-p", "debug", "-o", "%T"], capture_output=True, text=True
        )
        return out.returncode == 0 and out.stdout.split() == ["idle"] * len(self.nodes)

    def _wait_for(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited; see {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}; see {self.root / 'log'}")

    # ----------------------------------------------------------------- queries

    def dead_conf(self, path: Path) -> Path:
        """A copy of this cluster's slurm.conf at ``path`` naming a controller port nobody
        listens on: SLURM's clients fail with "Unable to contact slurm controller" after
        MessageTimeout (2 s here; 18 s with the default of 10)."""
        text = re.sub(r"(?m)^SlurmctldPort=\d+", "SlurmctldPort=9", self.conf.read_text())
        path.write_text(text + "MessageTimeout=2\n")
        return path

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a mapping (JobState, Restarts, ExitCode, ...)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", str(job_id)], capture_output=True, text=True
        )
        fields: dict[str, str] = {}
        for word in out.stdout.split():
            if "=" in word:
                k, v = word.split("=", 1)
                fields.setdefault(k, v)
        return fields

    def job_ids_named(self, name: str) -> list[str]:
        """Every job of that name SLURM knows of, running, pending or finished."""
        out = subprocess.run(
            ["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"], capture_output=True, text=True
        )
        return sorted(out.stdout.split())

    def completions(self, name: str) -> list[dict[str, str]]:
        """The job-completion log's records for jobs of that name (one per run that ended,
        requeues included)."""
        path = self.root / "jobcomp.log"
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            rec = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if rec.get("Name") == name:
                records.append(rec)
        return records

    def signal_batch(self, job_id: str, sig: str = "USR1") -> None:
        subprocess.run(["scancel", f"--signal={sig}", "--batch", str(job_id)], check=True)

    # ----------------------------------------------------------------- waiting

    @staticmethod
    def wait_until(predicate, what: str, timeout: float = 180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def wait_final(self, job_id: str, run_dir, timeout: float = 180) -> dict:
        """Wait until SLURM has finished with the job and its events say it is over; the
        run's state."""
        from pt_slurm.state import FINAL_STATUSES, read_state

        def over():
            st = read_state(run_dir)
            finished = self.job(job_id).get("JobState") in ENDED
            return st if finished and st["status"] in FINAL_STATUSES else None

        return self.wait_until(over, f"job {job_id} to finish", timeout)


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
STANDIN = Path(__file__).with_name("standin.py")
PT_SLURM = os.path.join(os.path.dirname(sys.executable), "pt-slurm")


class Standin:
    """Runs of the stand-in stage (tests/standin.py), judged like a pt stage: finished
    when it printed its manifest, making progress when its checkpoint file changes."""

    pt_slurm = PT_SLURM
    path = STANDIN

    @staticmethod
    def config(root: Path, name: str, standin: dict, **slurm) -> Path:
        config = {
            "run_name": name,
            "output_dir": str(root / "runs"),
            "standin": standin,
            "slurm": {
                "job_name": name,
                "command": f"{sys.executable} {STANDIN} {{config}}",
                "launcher": "none",
                "completion": "manifest",
                "progress": "checkpoint",
                **slurm,
            },
        }
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    @staticmethod
    def submit(config: Path, *overrides: str, env: dict | None = None) -> dict:
        """``pt-slurm submit``; its manifest, the only line on stdout."""
        proc = subprocess.run(
            [PT_SLURM, "submit", str(config), *overrides],
            capture_output=True,
            text=True,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert len(lines) == 1, proc.stdout
        return json.loads(lines[0])

    @staticmethod
    def steps(run_dir) -> list[int]:
        """The steps done, in the order they were done (steps.log)."""
        path = Path(run_dir) / "steps.log"
        return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.fixture(scope="session")
def standin():
    return Standin


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    reason = _missing()
    if reason is not None:
        if os.environ.get("PT_REQUIRE_SLURM") == "1":
            pytest.fail(f"PT_REQUIRE_SLURM=1 but {reason}")
        pytest.skip(reason)
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    old_conf = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if old_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old_conf


@pytest.fixture
def pt_slurm(monkeypatch):
    """``pt-slurm ARGS`` run in this process (its console-script entry point, without the
    second or so a new interpreter takes to import): the exit code, stdout and stderr."""
    import contextlib
    import io

    from pt_slurm.cli import main

    def run(*args, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
        argv = ["pt-slurm", *map(str, args)]
        out, err = io.StringIO(), io.StringIO()
        with monkeypatch.context() as patch:
            patch.setattr(sys, "argv", argv)
            patch.setenv("COLUMNS", "80")
            if cwd is not None:
                patch.chdir(cwd)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    main()
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        proc = subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())
        if check and code != 0:
            raise AssertionError(f"{' '.join(argv)} exited {code}\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run
