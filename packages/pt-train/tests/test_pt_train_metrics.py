"""W&B run ids: one per run directory, kept across resumes."""

from __future__ import annotations

import re

from pt_train.metrics import WANDB_ID_FILE, wandb_run_id


def test_runs_of_the_same_name_in_different_output_dirs_get_different_ids(tmp_path):
    # Both runs are named "sft"; an id made of the name alone made the second resume the
    # first one's W&B run.
    a, b = tmp_path / "out-a" / "sft", tmp_path / "out-b" / "sft"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    id_a, id_b = wandb_run_id(a), wandb_run_id(b)
    assert id_a != id_b
    assert id_a.startswith("sft-") and id_b.startswith("sft-")
    # W&B ids may not hold / \ # ? % : (and are part of a URL)
    assert re.fullmatch(r"[A-Za-z0-9_.-]+", id_a)


def test_a_resumed_run_keeps_its_id_even_when_its_directory_moved(tmp_path):
    run = tmp_path / "runs" / "my run: v2"
    run.mkdir(parents=True)
    first = wandb_run_id(run)
    assert first.startswith("my-run-v2-")
    assert (run / WANDB_ID_FILE).read_text().strip() == first
    assert wandb_run_id(run) == first  # the rerun after a requeue
    moved = tmp_path / "archive" / "my run: v2"
    moved.parent.mkdir()
    run.rename(moved)
    assert wandb_run_id(moved) == first
