"""Ctrl-C in `pt-rollout generate`: exit 130 with one line saying how many rows the partial
output kept, no traceback; the same command resumes after them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pt_core.files import read_rows

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _commands_take_ctrl_c():
    """Under a shell that started the tests in the background SIGINT is ignored, and the
    commands started here would inherit that; give them a terminal's Ctrl-C."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def generate(tmp_path: Path, model: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [Path(sys.executable).parent / "pt-rollout", "generate", "--model", model,
         "--prompts", tmp_path / "prompts.jsonl", "--out", tmp_path / "rollouts.jsonl",
         "--n", "2", "--max-tokens", "16", "--engine", "hf", "--batch-size", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip


def test_ctrl_c_keeps_the_written_batches_and_the_same_command_resumes_after_them(
    tmp_path, tiny_model_dir
):
    with open(tmp_path / "prompts.jsonl", "w") as fh:
        for i in range(60):
            fh.write(json.dumps({"id": i, "prompt": f"what is {i} + {i}?"}) + "\n")
    partial = tmp_path / "rollouts.jsonl.partial"
    proc = generate(tmp_path, tiny_model_dir)
    deadline = time.monotonic() + 300
    while not (partial.exists() and len(partial.read_text().splitlines()) >= 8):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = " ".join(err.split())

    assert proc.returncode == 130, err
    assert out == "" and "Traceback" not in err
    kept = len([json.loads(line) for line in partial.read_text().splitlines()])
    assert 8 <= kept < 120
    assert f"error: interrupted: {kept} rows kept in {partial}; the same command resumes" in err
    assert not (tmp_path / "rollouts.jsonl").exists()  # the output appears only when complete

    proc = generate(tmp_path, tiny_model_dir)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    manifest = json.loads(out)
    assert manifest["resumed"] == kept and manifest["generated"] == 120 - kept
    rows = read_rows(tmp_path / "rollouts.jsonl")
    assert sorted((r["id"], r["sample"]) for r in rows) == [
        (i, s) for i in range(60) for s in (0, 1)
    ]
