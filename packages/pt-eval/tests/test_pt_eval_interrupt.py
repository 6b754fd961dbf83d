"""Ctrl-C in `pt-eval run`: exit 130 with one line saying what was kept (the rollouts
generated so far, which the same command resumes after; grades are written whole, at the
end), no traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("commands_take_ctrl_c")]


def test_ctrl_c_while_generating_keeps_the_rollouts_so_far_and_writes_no_grades(
    tmp_path, tiny_model_dir
):
    # 1,200 samples: pt-rollout writes them in batches of 256, so the first batch is kept
    # while the others are still to come, however fast this machine generates
    with open(tmp_path / "bench.jsonl", "w") as fh:
        for i in range(600):
            fh.write(json.dumps({"id": i, "problem": f"What is {i} + 1?", "answer": str(i + 1)}))
            fh.write("\n")
    out_dir = tmp_path / "eval"
    proc = subprocess.Popen(
        [Path(sys.executable).parent / "pt-eval", "run", "--model", tiny_model_dir,
         "--benchmark", tmp_path / "bench.jsonl", "--n", "2", "--max-tokens", "16",
         "--engine", "hf", "--out", out_dir],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    partial = out_dir / "rollouts.jsonl.partial"
    deadline = time.monotonic() + 300
    while not (partial.exists() and partial.read_text().count("\n") >= 1):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = " ".join(err.split())

    assert proc.returncode == 130, err
    assert out == "" and "Traceback" not in err
    kept = len([json.loads(line) for line in partial.read_text().splitlines()])
    assert f"error: interrupted: {kept} rows kept in {partial}; the same command resumes" in err
    assert not (out_dir / "grades.jsonl").exists()
