"""A tiny, deterministic stand-in for a training stage, to test the job mechanics fast.

    python standin.py CONFIG

reads ``standin:`` from the run config (steps, step_seconds, fail_first) and, in the
run dir (output_dir/run_name):

* counts steps 1..steps, appending each to ``steps.log``, one line per step done;
* keeps ``checkpoint`` (the last step done) and resumes after it;
* on SIGUSR1/SIGTERM finishes the current step, saves and exits 85 (the requeue code);
* exits 3 (a real failure) on each of its first ``fail_first`` starts;
* prints ``start restart=<SLURM_RESTART_COUNT>`` on stdout when it starts.
"""

from __future__ import annotations

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
    run_dir.mkdir(parents=True, exist_ok=True)
    stop = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))

    starts_file = run_dir / "starts"
    starts = int(starts_file.read_text()) + 1 if starts_file.exists() else 1
    starts_file.write_text(str(starts))
    print(f"start restart={os.environ.get('SLURM_RESTART_COUNT', '0')}", flush=True)
    if starts <= opts.get("fail_first", 0):
        print(f"failing on purpose (start {starts})", file=sys.stderr, flush=True)
        return FAILURE_EXIT_CODE

    ckpt = run_dir / "checkpoint"
    step = int(ckpt.read_text()) if ckpt.exists() else 0
    with open(run_dir / "steps.log", "a") as log:
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
