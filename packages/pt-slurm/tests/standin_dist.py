"""A distributed stand-in stage: every rank joins one gloo group (as torchrun set it up),
all-reduces a number each step, and on SIGUSR1/SIGTERM all ranks agree to stop, rank 0
saves a checkpoint, and every rank exits 85.

    torchrun ... python standin_dist.py CONFIG

Rank 0 writes, in the run dir: ``steps.log`` (one line per step: step, all-reduced sum),
``checkpoint.json`` ({"step", "total"}), and ``starts.jsonl`` (one line per start: the
world size, and the SLURM node and MASTER_ADDR of every rank).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

REQUEUE_EXIT_CODE = 85


def main(config_path: str) -> int:
    config = yaml.safe_load(Path(config_path).read_text())
    opts = config.get("standin", {})
    run_dir = Path(config["output_dir"]) / config["run_name"]
    stop = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    where = {"node": os.environ.get("SLURMD_NODENAME"), "master": os.environ.get("MASTER_ADDR")}
    everyone = [None] * world
    dist.all_gather_object(everyone, where)
    ckpt = run_dir / "checkpoint.json"
    state = json.loads(ckpt.read_text()) if ckpt.exists() else {"step": 0, "total": 0.0}
    if rank == 0:
        with open(run_dir / "starts.jsonl", "a") as fh:
            fh.write(json.dumps({"world": world, "ranks": everyone}) + "\n")

    code = 0
    while state["step"] < opts.get("steps", 10):
        time.sleep(opts.get("step_seconds", 0.2))
        value = torch.tensor([rank + 1.0])
        dist.all_reduce(value)
        state["step"] += 1
        state["total"] += value.item()
        if rank == 0:
            with open(run_dir / "steps.log", "a") as fh:
                fh.write(f"{state['step']} {value.item()}\n")
        # All ranks stop at the same step, even if the signal reached only some of them.
        flag = torch.tensor([1.0 if stop else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            code = REQUEUE_EXIT_CODE
            break
    if rank == 0:
        ckpt.write_text(json.dumps(state))
    dist.barrier()
    dist.destroy_process_group()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
