"""Ctrl-C in `pt-rollout generate`: exit 130 with one line saying how many rows the partial
output kept, no traceback; the same command resumes after them."""

from __future__ import annotations

import json
import signal
import time

import pytest
from rollout_commands import start_generate

from pt_core.files import read_rows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("commands_take_ctrl_c")]


def test_ctrl_c_keeps_the_written_batches_and_the_same_command_resumes_after_them(
    tmp_path, tiny_model_dir
):
    with open(tmp_path / "prompts.jsonl", "w") as fh:
        for i in range(60):
            fh.write(json.dumps({"id": i, "prompt": f"what is {i} + {i}?"}) + "\n")
    partial = tmp_path / "rollouts.jsonl.partial"
    proc = start_generate(tmp_path / "prompts.jsonl", tmp_path / "rollouts.jsonl", tiny_model_dir)
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

    proc = start_generate(tmp_path / "prompts.jsonl", tmp_path / "rollouts.jsonl", tiny_model_dir)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    manifest = json.loads(out)
    assert manifest["resumed"] == kept and manifest["generated"] == 120 - kept
    rows = read_rows(tmp_path / "rollouts.jsonl")
    assert sorted((r["id"], r["sample"]) for r in rows) == [
        (i, s) for i in range(60) for s in (0, 1)
    ]
