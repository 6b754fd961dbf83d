"""GRPO's off-policy corrections and CISPO, against values and gradients worked out here.

- the rollout correction's weights (truncated IS, Yao et al. 2025; two-sided masking as
  IcePop; the geometric-mean sequence mask) from the importance ratio
  ``rho = pi_old / mu`` of each token;
- CISPO (MiniMax-M1 2025): ``-sg(clip(r)) A log pi``, whose gradient survives where the
  clipped surrogate's is zero.
"""

from __future__ import annotations

import math

import pytest
import torch

from pt_core.config import validate
from pt_core.errors import ConfigError
from pt_train.config import TrainConfig
from pt_train.objectives.grpo import RolloutCorrectionConfig, policy_loss, rollout_correction


def weights(ratios: list[float], sequences: list[int], **cfg):
    log_rho = torch.tensor(ratios, dtype=torch.float64).log()
    token_sequence = torch.tensor(sequences)
    return rollout_correction(
        log_rho, token_sequence, max(sequences) + 1, RolloutCorrectionConfig(**cfg)
    )


def test_token_truncation_caps_each_ratio():
    w, masked = weights([0.4, 1.0, 2.5, 1.5], [0, 0, 1, 1], level="token", cap=2.0)
    assert w.tolist() == pytest.approx([0.4, 1.0, 2.0, 1.5])
    assert masked is None


def test_token_mask_drops_ratios_out_of_bounds_on_either_side():
    """Bounds [0.5, 2]: 0.4 is below (the generator liked the token far more than the
    trainer), 2.5 above; both give no gradient, the others keep their ratio as weight."""
    w, masked = weights([0.4, 1.0, 2.5, 1.5], [0, 0, 1, 1], level="token", mode="mask")
    assert w.tolist() == pytest.approx([0.0, 1.0, 0.0, 1.5])
    assert masked.tolist() == [True, False, True, False]


def test_sequence_level_uses_the_product_and_geometric_the_mean_of_the_logs():
    """Ten tokens of ratio 1.1: the product 1.1^10 = 2.59 is out of [0.5, 2], so the
    sequence mask drops the whole sequence; the geometric mean 1.1 keeps it, each token
    weighted 1.1. A second sequence of ratios 2 and 0.5 has product and geometric mean 1."""
    ratios = [1.1] * 10 + [2.0, 0.5]
    sequences = [0] * 10 + [1, 1]
    w, masked = weights(ratios, sequences, level="sequence", mode="mask")
    assert w[:10].tolist() == [0.0] * 10 and masked[:10].all()
    assert w[10:].tolist() == pytest.approx([1.0, 1.0]) and not masked[10:].any()
    w, masked = weights(ratios, sequences, level="geometric", mode="mask")
    assert w[:10].tolist() == pytest.approx([1.1] * 10) and not masked.any()
    assert w[10:].tolist() == pytest.approx([1.0, 1.0])
    w, _ = weights(ratios, sequences, level="sequence", cap=2.0)
    assert w[:10].tolist() == pytest.approx([2.0] * 10)  # truncated at the cap
    assert w[0].item() == pytest.approx(min(1.1**10, 2.0))


def test_level_none_applies_no_weight():
    assert weights([3.0, 0.1], [0, 0], level="none") == (None, None)


def test_on_policy_tokens_are_never_masked():
    w, masked = weights([1.0, 1.0, 1.0], [0, 0, 1], level="geometric", mode="mask")
    assert w.tolist() == [1.0, 1.0, 1.0] and not masked.any()


@pytest.mark.parametrize(
    ("log_ratio", "advantage"),
    [
        (math.log(1.5), 1.0),  # r above 1 + eps_high, A > 0: the clipped surrogate is flat
        (math.log(0.5), -1.0),  # r below 1 - eps_low, A < 0: flat too
        (math.log(1.1), 1.0),  # inside
        (math.log(0.5), 1.0),
    ],
)
def test_cispo_gradient_is_the_clipped_ratio_times_the_advantage(log_ratio, advantage):
    """d/d log pi of -sg(clip(r)) A log pi is -clip(r) A wherever r is: CISPO keeps the
    tokens that PPO's clip drops (eps_low 0.2, eps_high 0.28)."""
    logp = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - log_ratio
    loss, _ = policy_loss(
        logp, old, torch.tensor([advantage], dtype=torch.float64), torch.tensor([0]), 1,
        epsilon_low=0.2, epsilon_high=0.28, policy="cispo",
    )  # fmt: skip
    clipped = min(max(math.exp(log_ratio), 0.8), 1.28)
    assert loss.item() == pytest.approx(-clipped * advantage * -1.0)
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert g.item() == pytest.approx(-clipped * advantage)


def test_cispo_on_policy_is_reinforce():
    """At r = 1 the weight is 1: the gradient of each token is -A grad log pi."""
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([1, 3, 0, 5])
    logps = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    advantages = torch.tensor([0.5, -2.0], dtype=torch.float64)
    sequence = torch.tensor([0, 0, 1, 1])
    loss, _ = policy_loss(
        logps, logps.detach(), advantages, sequence, 2,
        epsilon_low=0.2, epsilon_high=0.28, policy="cispo",
    )  # fmt: skip
    (grad,) = torch.autograd.grad(loss.sum(), logits, retain_graph=True)
    (want,) = torch.autograd.grad(-(advantages[sequence] * logps).sum(), logits)
    torch.testing.assert_close(grad, want)


def grpo(objective: dict) -> TrainConfig:
    return validate(
        {
            "run_name": "r",
            "model": {"init": {"tokenizer": "tok"}},
            "objective": {"name": "grpo", **objective},
            "training": {"max_steps": 1},
        },
        TrainConfig,
    )


@pytest.mark.parametrize(
    ("objective", "key"),
    [
        ({"rollout_correction": {"mode": "mask", "cap": 3.0}}, "rollout_correction.cap"),
        ({"rollout_correction": {"low": 0.2}}, "rollout_correction.low"),
        ({"rollout_correction": {"level": "none", "mode": "mask"}}, "rollout_correction.mode"),
        ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip"),
    ],
)
def test_correction_keys_without_effect_are_refused(objective, key):
    with pytest.raises(ConfigError, match="no effect") as caught:
        grpo(objective)
    assert key in str(caught.value)


def test_mask_bounds_must_hold_one():
    with pytest.raises(ConfigError, match="must hold"):
        grpo({"rollout_correction": {"mode": "mask", "low": 1.2, "high": 2.0}})
