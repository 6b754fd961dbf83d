"""`pt_train.trainer.train()` called from Python, as the trainer's docstring shows."""

from __future__ import annotations

import json
import os

from pt_train.config import TrainConfig
from pt_train.trainer import train


def test_training_in_process_leaves_the_launcher_environment_as_it_was(
    tmp_path, tiny_tokenizer_dir, launcher_variables
):
    """A plain process that trains in-process and then starts `pt-train run
    launcher.nproc=2` (a script, a notebook, a test) hands its environment to the child.
    If train() left RANK=0 WORLD_SIZE=1 MASTER_PORT=... there, the child takes itself
    for rank 0 of a launched job of one, ignores launcher.nproc and dies with EADDRINUSE
    on the port the parent's process group still listens on. So after train() returns,
    the launcher variables must be what they were before it."""
    for name in launcher_variables:
        os.environ.pop(name, None)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": list(range(5, 25)), "labels": list(range(5, 25))}))
    cfg = TrainConfig.model_validate(
        {
            "run_name": "run",
            "output_dir": str(tmp_path),
            "model": {"init": {"tokenizer": str(tiny_tokenizer_dir)}},
            "data": {"path": str(rows)},
            "training": {"global_batch_size": 1, "max_steps": 1},
        }
    )
    train(cfg)
    left = {name: os.environ[name] for name in launcher_variables if name in os.environ}
    assert left == {}


def test_a_run_frozen_before_a_key_existed_resumes(tmp_path, tiny_tokenizer_dir):
    """A run frozen by an older pt has no ``training.alarms`` or ``rollout.decoder`` in its
    config.yaml: resuming it with today's pt (which writes them at their defaults) is no
    change of config. A key given another value still is."""
    import pytest
    import yaml

    from pt_core.errors import ConfigError

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": list(range(5, 25)), "labels": list(range(5, 25))}))

    def config(steps: int = 2, lr: float = 1e-5) -> TrainConfig:
        return TrainConfig.model_validate(
            {
                "run_name": "run",
                "output_dir": str(tmp_path),
                "model": {"init": {"tokenizer": str(tiny_tokenizer_dir)}},
                "data": {"path": str(rows)},
                "training": {"global_batch_size": 1, "max_steps": steps, "learning_rate": lr},
            }
        )

    train(config(2))
    frozen = tmp_path / "run" / "config.yaml"
    old = yaml.safe_load(frozen.read_text())
    del old["training"]["alarms"], old["rollout"]["decoder"]
    frozen.write_text(yaml.safe_dump(old))
    with pytest.raises(ConfigError, match="training.learning_rate"):
        train(config(2, lr=1e-3))
    assert train(config(2)).step == 2
