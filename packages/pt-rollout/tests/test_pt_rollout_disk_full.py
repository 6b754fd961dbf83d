"""A full disk in `pt-rollout generate`: one `error:` line naming the partial output and "no
space left", exit 74, no traceback; the rows written before stay, and the same command
resumes after them once there is room."""

from __future__ import annotations

import json
import time

import pytest
from rollout_commands import start_generate

from pt_core.errors import DiskFull

pytestmark = pytest.mark.slow


def test_a_full_disk_keeps_the_rows_written_and_the_same_command_resumes(
    tmp_path, small_disk, tiny_model_dir
):
    disk = small_disk(8)
    prompts = tmp_path / "prompts.jsonl"
    with open(prompts, "w") as fh:
        for i in range(40):
            fh.write(json.dumps({"id": i, "prompt": f"what is {i} + {i}?"}) + "\n")
    out = disk.path / "rollouts.jsonl"
    partial = disk.path / "rollouts.jsonl.partial"
    proc = start_generate(prompts, out, tiny_model_dir)
    deadline = time.monotonic() + 300
    while not (partial.exists() and partial.read_text().count("\n") >= 4):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    disk.fill()
    stdout, err = proc.communicate(timeout=300)
    err = " ".join(err.split())

    assert proc.returncode == DiskFull.exit_code == 74, err
    assert stdout == "" and "Traceback" not in err
    assert err.count("error:") == 1
    kept = partial.read_text().count("\n")  # complete lines; a torn last one is dropped
    assert f"error: {partial}: no space left on the device; {kept} rows kept in {partial}" in err
    assert not out.exists()

    disk.free()
    stdout, err = start_generate(prompts, out, tiny_model_dir).communicate(timeout=600)
    manifest = json.loads(stdout)
    assert manifest["rows"] == 80 and manifest["resumed"] == kept
