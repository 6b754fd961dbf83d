"""Alarms (``training.alarms``) stop a run whose figures leave their bounds, before it
trains on what tripped them; the collapse case is a generator that samples with weights
other than the trainer's."""

from __future__ import annotations

import json

import pytest
import torch

from pt_core.config import validate
from pt_core.errors import ConfigError
from pt_train.alarms import AlarmTripped
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train


def sft_config(tmp_path, tokenizer_dir, alarms: dict) -> TrainConfig:
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(
                {"input_ids": list(range(5 + i, 25 + i)), "labels": list(range(5 + i, 25 + i))}
            )
            for i in range(4)
        )
    )
    return TrainConfig.model_validate(
        {
            "run_name": "run",
            "output_dir": str(tmp_path),
            "model": {"init": {"tokenizer": str(tokenizer_dir)}},
            "data": {"path": str(rows)},
            "training": {"global_batch_size": 2, "max_steps": 2, "alarms": alarms},
        }
    )


def test_a_loss_above_its_bound_stops_the_run_before_the_update(tmp_path, tiny_tokenizer_dir):
    """A random model's loss is about log(vocabulary) > 5: a bound of 1 trips at step 1;
    the step is logged as skipped, and no checkpoint holds its update."""
    cfg = sft_config(tmp_path, tiny_tokenizer_dir, {"loss": {"above": 1.0}})
    with pytest.raises(AlarmTripped) as caught:
        train(cfg)
    message = str(caught.value)
    assert "step 1: loss = " in message and "training.alarms.loss.above = 1.0" in message
    assert "update was not applied" in message and caught.value.exit_code == 3
    (record,) = read_metrics(cfg.run_dir)
    assert record["step"] == 1 and record["skipped"] and record["loss"] > 5
    assert not (cfg.run_dir / "checkpoints").exists()


def test_bounds_that_hold_let_the_run_finish(tmp_path, tiny_tokenizer_dir):
    cfg = sft_config(tmp_path, tiny_tokenizer_dir, {"loss": {"above": 100.0, "below": 0.0}})
    assert train(cfg).step == 2


def test_a_bound_on_a_figure_the_run_never_logs_is_refused(tmp_path, tiny_tokenizer_dir):
    cfg = sft_config(tmp_path, tiny_tokenizer_dir, {"rollout_kl": {"above": 0.1}})
    with pytest.raises(AlarmTripped, match="logs no figure 'rollout_kl'"):
        train(cfg)


def test_an_alarm_without_a_bound_is_refused():
    with pytest.raises(ConfigError, match="needs a bound"):
        validate(
            {
                "run_name": "r",
                "model": {"init": {"tokenizer": "t"}},
                "training": {"max_steps": 1, "alarms": {"loss": {}}},
            },
            TrainConfig,
        )


@pytest.fixture
def grpo_world(tmp_path, tiny_tokenizer):
    from pt_train.model import build_llama

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.save_pretrained(tmp_path / "policy")
    tiny_tokenizer.save_pretrained(tmp_path / "policy")
    with open(tmp_path / "prompts.jsonl", "w") as fh:
        for i in range(4):
            fh.write(json.dumps({"id": i, "prompt": f"{i} + {i} =", "answer": str(2 * i)}) + "\n")
    (tmp_path / "alarm_reward.py").write_text(
        "def reward(rows):\n    return [float(len(r['completion_token_ids']) % 2) for r in rows]\n"
    )
    return tmp_path


def grpo_config(root, name) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "run_name": name,
            "output_dir": str(root / "runs"),
            "model": {"name_or_path": str(root / "policy")},
            "objective": {"name": "grpo"},
            "reward": {"function": "alarm_reward:reward"},
            "rollout": {"prompts": str(root / "prompts.jsonl"), "samples_per_prompt": 4,
                        "max_tokens": 8, "temperature": 0.7},
            "training": {"seed": 0, "learning_rate": 1e-3, "global_batch_size": 4,
                         "micro_batch_size": 4, "max_steps": 2,
                         "alarms": {"rollout_kl": {"above": 0.01}}},
        }
    )  # fmt: skip


def test_a_generator_sampling_with_wrong_weights_trips_the_mismatch_alarm(grpo_world, monkeypatch):
    """The same GRPO run twice: with the generator sampling from the policy itself the
    trainer's and generator's log-probs agree (rollout_kl ~ 0) and it finishes; with the
    generator's weights perturbed (noise of std 0.05 on every matrix while it samples,
    a broken weight push) the log-probs recorded at sampling are not the trainer's,
    rollout_kl is far above 0.01 and the run stops at step 1 without its update."""
    from pt_train.producers.online.generators.local import LocalGenerator

    monkeypatch.syspath_prepend(str(grpo_world))
    healthy = grpo_config(grpo_world, "healthy")
    assert train(healthy).step == 2
    assert all(r["rollout_kl"] < 1e-6 for r in read_metrics(healthy.run_dir))

    generate = LocalGenerator._generate

    def with_wrong_weights(self, requests):
        model = self.context.weights.policy.module()
        saved = [p.detach().clone() for p in model.parameters()]
        noise = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 2:
                    p.add_(torch.randn(p.shape, generator=noise) * 0.05)
        try:
            return generate(self, requests)
        finally:
            with torch.no_grad():
                for p, s in zip(model.parameters(), saved, strict=True):
                    p.copy_(s)

    monkeypatch.setattr(LocalGenerator, "_generate", with_wrong_weights)
    broken = grpo_config(grpo_world, "broken")
    with pytest.raises(AlarmTripped, match=r"step 1: rollout_kl = .* is above"):
        train(broken)
    (record,) = read_metrics(broken.run_dir)
    assert record["skipped"] and record["rollout_kl"] > 0.01
