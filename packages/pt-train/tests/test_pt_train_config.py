"""The config schema, the derived DeepSpeed JSON, schedules and training lengths."""

from __future__ import annotations

import pytest
import yaml

from pt_core.errors import ConfigError
from pt_train.config import TrainConfig, batch_layout, resume_changed_keys
from pt_train.schedule import lr_at
from pt_train.trainer import deepspeed_config, total_steps_of


def config(**training) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "run_name": "r",
            "model": {"init": {"tokenizer": "tok"}},
            "training": {"global_batch_size": 4, **training},
        }
    )


def test_exactly_one_training_length_is_required():
    with pytest.raises(ValueError, match="exactly one training length"):
        config()
    with pytest.raises(ValueError, match="max_steps, num_epochs"):
        config(max_steps=3, num_epochs=1)


def test_training_lengths_become_optimizer_steps():
    # 40 rows of 25 tokens on average, 4 rows per step: an epoch is 10 steps.
    assert total_steps_of(config(num_epochs=1), 40, 1000) == 10
    assert total_steps_of(config(num_epochs=0.55), 40, 1000) == 6  # a partial batch rounds up
    assert total_steps_of(config(num_training_samples=10), 40, 1000) == 3
    assert total_steps_of(config(num_training_tokens=1000), 40, 1000) == 10
    assert total_steps_of(config(max_steps=7), 40, 1000) == 7


def test_gradient_accumulation_is_derived_and_must_divide():
    cfg = config(max_steps=1, global_batch_size=8, micro_batch_size=2)
    assert batch_layout(cfg.training, 2) == 2  # 8 = 2 x 2 x 2
    with pytest.raises(ConfigError, match="not divisible"):
        batch_layout(cfg.training, 3)


def test_deepspeed_json_follows_the_yaml_and_raw_keys_win():
    cfg = TrainConfig.model_validate(
        {
            "run_name": "r",
            "model": {"init": {"tokenizer": "tok"}},
            "training": {"global_batch_size": 8, "micro_batch_size": 2, "max_steps": 1},
            "deepspeed": {
                "zero_stage": 3,
                "offload_optimizer": True,
                "raw": {"zero_optimization": {"reduce_bucket_size": 1000}},
            },
        }
    )
    ds = deepspeed_config(cfg, grad_accum=2, bf16=False)
    assert ds["train_batch_size"] == 8 and ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert ds["zero_optimization"]["reduce_bucket_size"] == 1000  # merged, not replacing


def test_offload_without_zero_is_rejected():
    with pytest.raises(ValueError, match="offload_optimizer needs zero_stage"):
        TrainConfig.model_validate(
            {
                "run_name": "r",
                "model": {"init": {"tokenizer": "tok"}},
                "training": {"max_steps": 1},
                "deepspeed": {"offload_optimizer": True},
            }
        )


def test_resume_check_ignores_save_and_log_frequencies_only():
    old = config(max_steps=5, save_steps=2).model_dump(mode="json")
    new = config(max_steps=5, save_steps=1, logging_steps=3).model_dump(mode="json")
    assert resume_changed_keys(old, new) == []
    new["training"]["learning_rate"] = 1.0
    new["launcher"]["nproc"] = 4
    assert resume_changed_keys(old, new) == ["training.learning_rate"]


def test_resume_check_takes_a_path_written_another_way_as_the_same(tmp_path, monkeypatch):
    """`--data out/data/sft` and `pt-data build ... | pt-train run --data -` (whose manifest
    gives the absolute path) name one dataset; another directory is a change."""
    (tmp_path / "out" / "data" / "sft").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path)
    old = config(max_steps=5).model_dump(mode="json")
    new = config(max_steps=5).model_dump(mode="json")
    old["data"]["path"] = str(tmp_path / "out" / "data" / "sft")
    new["data"]["path"] = "out/data/sft"
    assert resume_changed_keys(old, new) == []
    new["data"]["path"] = "other"
    assert resume_changed_keys(old, new) == ["data.path"]
    new["data"]["path"] = "missing/elsewhere"
    assert resume_changed_keys(old, new) == ["data.path"]


def test_warmup_then_cosine_to_the_floor():
    t = config(
        max_steps=10, learning_rate=1.0, warmup_steps=2, min_lr_ratio=0.1, lr_schedule="cosine"
    ).training
    lrs = [lr_at(s, t, 10) for s in range(10)]
    assert lrs[:3] == [0.5, 1.0, 1.0]  # warmup ramps linearly, then decay starts at the peak
    assert lrs[3:] == sorted(lrs[3:], reverse=True)
    # halfway through the 8 decay steps the cosine is at the midpoint between peak and floor
    assert lr_at(6, t, 10) == pytest.approx(0.1 + 0.9 * 0.5)
    assert min(lrs) > 0.1


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("objective.simpo_gamma=1", "objective.simpo_gamma=1.0 has no effect"),
        ("objective.loss_weights=[1,2]", "loss_weights has 2 values for 1 loss types"),
        ("objective.name=dpoo", "name 'dpoo' is not known"),
    ],
)
def test_a_refused_objective_override_is_blamed_on_the_command_line(
    tmp_path, tiny_run_config, pt_train_in_process, override, says
):
    """The file's objective section (DPO, sigmoid loss) is valid as written; the override
    makes it invalid, so the error names the override, not the file's line."""
    config = tiny_run_config(tmp_path / "runs", tmp_path, {"name": "dpo", "beta": 0.1})
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    code, _, err = pt_train_in_process("check", tmp_path / "train.yaml", override)
    err = " ".join(err.split())
    assert code == 2 and err.count("error:") == 1, err
    assert err.startswith(f"error: override {override.split('=')[0]}: ") and says in err, err
    assert "train.yaml:" not in err
