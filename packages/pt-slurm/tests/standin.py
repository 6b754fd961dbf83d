"""A tiny, deterministic stand-in for a training stage, to test the job mechanics fast.

    python standin.py CONFIG

reads ``standin:`` from the run config (steps, step_seconds, fail_first) and, in the
run dir (output_dir/run_name):

* counts steps 1..steps, appending each to ``steps.log``, one line per step done;
* keeps ``checkpoint`` (the last step done) and resumes after it;
* on SIGUSR1/SIGTERM finishes the current step, saves and exits 85 (the requeue code);
* exits 3 (a real failure) on each of its first ``fail_first`` starts;
* exits 85 at once, saving nothing, on each of its first ``requeue_first`` starts
  (a stage that asks for a requeue without making progress);
* saves one more step and exits 85 on each of its first ``save_and_requeue`` starts;
* exits 0 without its manifest on each of its first ``exit_zero_first`` starts (what a
  step whose node failed can look like);
* prints ``start restart=<SLURM_RESTART_COUNT>`` on stdout when it starts, and when
  done its manifest, ``{"kind": "checkpoint", "path": <run dir>, "step": N}``;
* with ``per_node``, runs once per node of a job, each in ``node-<SLURM_NODEID>/`` of the
  run dir (node 0 prints the manifest).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import yaml

REQUEUE_EXIT_CODE = 85
FAILURE_EXIT_CODE = 3


def main(config_path: str) -> int:
    config = yaml.safe_load(Path(config_path).read_text())
    opts = config.get("standin", {})
    run_dir = Path(config.get("output_dir", "runs")) / config["run_name"]
    node = os.environ.get("SLURM_NODEID", "0")
    work_dir = run_dir / f"node-{node}" if opts.get("per_node") else run_dir
    work_dir.mkdir(parents=True, exist_ok=True)
    stop = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))

    starts_file = work_dir / "starts"
    starts = int(starts_file.read_text()) + 1 if starts_file.exists() else 1
    starts_file.write_text(str(starts))
    print(f"start restart={os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
    if starts <= opts.get("fail_first", 0):
        print(f"failing on purpose (start {starts})", file=sys.stderr, flush=True)
        return FAILURE_EXIT_CODE
    if starts <= opts.get("requeue_first", 0):
        print(f"asking for a requeue without saving (start {starts})", flush=True)
        return REQUEUE_EXIT_CODE
    if starts <= opts.get("exit_zero_first", 0):
        print(f"exiting 0 without a manifest (start {starts})", flush=True)
        return 0

    ckpt = work_dir / "checkpoint"
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    if starts <= opts.get("save_and_requeue", 0):
        step += 1
        ckpt.write_text(str(step))
        print(f"saved step {step}, asking for a requeue (start {starts})", flush=True)
        return REQUEUE_EXIT_CODE
    with open(work_dir / "steps.log", "a") as log:
        while step < opts.get("steps", 10):
            time.sleep(opts.get("step_seconds", 0.2))
            step += 1
            log.write(f"{step}\n")
            log.flush()
            if stop:
                ckpt.write_text(str(step))
                print(f"signal {stop[0]}: saved step {step}", flush=True)
                return REQUEUE_EXIT_CODE
    ckpt.write_text(str(step))
    print(f"done at step {step}", flush=True)
    if node == "0":
        manifest = {"kind": "checkpoint", "path": str(run_dir.resolve()), "step": step}
        print(json.dumps(manifest), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
