"""A full disk in `pt-train run`: one `error:` line naming the checkpoint directory and "no
space left", exit 74 (pt_core.errors.DiskFull), the half-written `.tmp-step-N` removed, and
`latest` still naming the last complete checkpoint, which the same command resumes from
once there is room. The same whether the checkpoint is written by the training loop or in
the background (``training.async_save``)."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from pt_core.errors import DiskFull

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("overrides", "stall", "stalled"),
    [
        # Before step 5 (0-based) the run waits 5 s: step-4 is saved, and the disk fills up
        # before step-6's save.
        ((), "at=step,step=5,seconds=5", "stalls 5 s at step 5"),
        # step-6 is copied and its background write waits 5 s before it starts; the disk
        # fills up meanwhile, while training goes on, and step-8's save, which first waits
        # for step-6's write, reports it.
        (("training.async_save=true",), "at=write,step=6,seconds=5", "stalls 5 s at write 6"),
    ],
    ids=["sync", "async"],
)
def test_a_checkpoint_save_that_runs_out_of_space_leaves_the_last_complete_one_to_resume(
    tmp_path, small_disk, tiny_run_config, pt_train_run, overrides, stall, stalled
):
    disk = small_disk(64)
    with open(tmp_path / "rows.jsonl", "w") as fh:
        for i in range(16):
            ids = [5 + (i * 7 + j) % 250 for j in range(12 + i % 9)]
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * 3 + ids[3:]}) + "\n")
    # metrics are logged only at the end, so that the save is the first write to meet the
    # full disk; with async_save the step-6 write's failure is reported by the step-8 save,
    # which must come before the end's metrics (the last step is 12)
    config = tiny_run_config(
        disk.path / "runs", tmp_path / "rows.jsonl", {"name": "sft"},
        global_batch_size=4, micro_batch_size=4, max_steps=12, save_steps=2, logging_steps=100,
    )  # fmt: skip
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))

    run = pt_train_run(tmp_path / "train.yaml", "full", *overrides, stall=stall)
    run.run_dir = disk.path / "runs" / "full"
    deadline = time.monotonic() + 300
    while stalled not in run.stderr():
        assert run.proc.poll() is None and time.monotonic() < deadline, run.stderr()
        time.sleep(0.05)
    disk.fill()
    code, out, err = run.finish()

    checkpoints = run.run_dir / "checkpoints"
    assert code == DiskFull.exit_code == 74, err
    assert out == "" and "Traceback" not in err
    assert err.count("error:") == 1
    assert (
        f"error: {checkpoints}: no space left on the device; step-6 not saved (.tmp-step-6 "
        "removed); the same command resumes from step-4, the last complete checkpoint" in err
    )
    assert not list(checkpoints.glob(".tmp-*"))
    assert (checkpoints / "latest").read_text().strip() == "step-4"

    disk.free()
    code, out, err = pt_train_run(tmp_path / "train.yaml", "full", *overrides).finish()
    assert code == 0, err
    assert "resuming" in err and "(step 4)" in err
    assert json.loads(out)["step"] == 12
