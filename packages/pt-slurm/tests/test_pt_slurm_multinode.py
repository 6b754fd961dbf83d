"""Two-node jobs on the local SLURM (two slurmd on this machine): the launcher on each
node meets the other at MASTER_ADDR:MASTER_PORT and the ranks form one group; with
torchrun, the early signal reaches the ranks on both nodes, which stop together and
resume after the requeue. (DeepSpeed's launcher is slower to start, so within the time
the suite has it is only checked to rendezvous and finish.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("torch.distributed", reason="the distributed stand-in needs torch")

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STANDIN = Path(__file__).with_name("standin_dist.py")
STEPS = 30


def _steps(run_dir: Path) -> list[tuple[int, float]]:
    path = run_dir / "steps.log"
    if not path.exists():
        return []
    return [(int(a), float(b)) for a, b in (x.split() for x in path.read_text().splitlines())]


@pytest.mark.parametrize("launcher, signalled", [("torchrun", True), ("deepspeed", False)])
def test_two_node_job_rendezvous_and_self_healing(
    slurm_cluster, tmp_path, cli, launcher, signalled
):
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the local cluster has one node (this machine's hostname is localhost)")
    steps = STEPS if signalled else 5
    config = {
        "run_name": "two-nodes",
        "output_dir": str(tmp_path / "runs"),
        "standin": {"steps": steps, "step_seconds": 0.25},
        "slurm": {
            "nodes": 2,
            "launcher": launcher,
            "command": f"{sys.executable} {STANDIN} {{config}}",
            "progress": "checkpoint.json",
            "env": {"OMP_NUM_THREADS": 1, "DS_ACCELERATOR": "cpu"},
        },
    }
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(config))
    manifest = json.loads(cli("pt-slurm", "submit", path).stdout)
    job_id, run_dir = manifest["job_id"], Path(manifest["path"])

    if signalled:
        slurm_cluster.wait_until(
            lambda: len(_steps(run_dir)) >= 3, "the two ranks to make progress", 240
        )
        slurm_cluster.signal_batch(job_id, "USR1")

    # Both the job and the run's state have to be over: a state read before SLURM's
    # "COMPLETED" may be the one the batch script had not yet replaced.
    st = slurm_cluster.wait_final(job_id, run_dir, timeout=240)
    assert slurm_cluster.job(job_id).get("JobState") == "COMPLETED"

    starts = [json.loads(x) for x in (run_dir / "starts.jsonl").read_text().splitlines()]
    assert len(starts) == (2 if signalled else 1)  # signalled: requeued and started again
    first_host = sorted(slurm_cluster.nodes)[0]  # what `scontrol show hostnames` lists first
    for start in starts:
        assert start["world"] == 2
        assert sorted(r["node"] for r in start["ranks"]) == sorted(slurm_cluster.nodes)
        assert {r["master"] for r in start["ranks"]} == {first_host}
    # Every step once, each all-reduced over both ranks (1 + 2), through the requeue.
    assert _steps(run_dir) == [(step, 3.0) for step in range(1, steps + 1)]
    assert json.loads((run_dir / "checkpoint.json").read_text()) == {
        "step": steps,
        "total": 3.0 * steps,
    }
    assert st["status"] == "completed" and st["failures"] == 0
    assert st["job_ids"] == [job_id] and slurm_cluster.job(job_id)["NumNodes"] == "2"
    if signalled:
        assert st["requeues"] == 1 and slurm_cluster.job(job_id)["Restarts"] == "1"
        assert st["runs"][0]["signals"] == ["USR1"] and st["runs"][0]["outcome"] == "requeue"
