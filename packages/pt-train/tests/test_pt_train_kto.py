"""KTO (Ethayarajh et al. 2024): the loss written out from the paper and checked against
``pt_train.objectives.kto``, first as a pure function of log-probs, then through the real
trainer (one CPU process, in-process) against log-probs computed here with plain
``transformers`` forward passes in float64.

Eq. 8, per completion y of prompt x, with r = log pi(y|x) - log ref(y|x) and the
reference point z0 (an estimate of KL(pi || ref), held constant in the gradient):

    v(x, y) = lambda_D s(beta (r - z0))   if y is desirable
              lambda_U s(beta (z0 - r))   if y is undesirable
    L = E[lambda_y - v(x, y)]

A preference pair is two labelled completions: the chosen one desirable, the rejected one
undesirable. z0 is, as documented, the mean of r over every completion of the micro-batch
clamped at 0 (``kl: batch``), or 0 (``kl: none``). A step's loss is the mean over its
completions.

The models are the tiny Llama of the root conftest (``tiny_model_dir``: hidden 128,
2 layers, seed 0, the same weights as ``model.init`` with ``training.seed: 0``) and, as "a
different reference", the same architecture built with seed 1.
"""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np
import pytest
import torch
from preference_data import completion_logp, load_float64, preference_pairs
from pydantic import ValidationError

from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.objectives.kto import KTOConfig, kto_loss
from pt_train.trainer import train

# --------------------------------------------------------------------------- the paper, here


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def paper_losses(r_d, r_u, *, beta, lambda_d=1.0, lambda_u=1.0, z0=None):
    """[P] desirable and [P] undesirable per-completion losses lambda_y - v (Eq. 8), from
    the log-ratios r_d (chosen) and r_u (rejected); z0 by default the batch estimate
    max(0, mean of all 2P log-ratios)."""
    if z0 is None:
        z0 = max(0.0, torch.cat([r_d, r_u]).mean().item())
    loss_d = lambda_d - lambda_d * torch.sigmoid(beta * (r_d - z0))
    loss_u = lambda_u - lambda_u * torch.sigmoid(beta * (z0 - r_u))
    return loss_d, loss_u


def f64(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def metric(metrics: dict, name: str) -> float:
    total, count = metrics[name]
    return float(total) / count


# --------------------------------------------------------------------------- the pure loss


def test_two_pairs_written_out_by_hand():
    """Log-ratios r_d = (1, -2) and r_u = (0.5, 3.5) (policy minus reference): z0 = mean
    = 0.75 > 0. With beta 0.5 the desirable losses are 1 - s(0.5 (r_d - 0.75)) and the
    undesirable ones 1 - s(0.5 (0.75 - r_u)); the sum over the 4 completions is returned
    with the count 4."""
    policy_c, reference_c = f64(-3.0, -9.0), f64(-4.0, -7.0)
    policy_r, reference_r = f64(-5.5, -2.0), f64(-6.0, -5.5)
    expected = (
        (1 - sigmoid(0.5 * (1 - 0.75))) + (1 - sigmoid(0.5 * (-2 - 0.75)))
        + (1 - sigmoid(0.5 * (0.75 - 0.5))) + (1 - sigmoid(0.5 * (0.75 - 3.5)))
    )  # fmt: skip
    total, count, metrics = kto_loss(policy_c, policy_r, reference_c, reference_r, beta=0.5)
    assert total.item() == pytest.approx(expected, rel=1e-12)
    assert count == 4.0
    assert metric(metrics, "kl") == pytest.approx(0.75, rel=1e-12)


@pytest.mark.parametrize(("lambda_d", "lambda_u"), [(1.0, 1.0), (2.0, 1.0), (1.0, 1.33)])
def test_each_completion_costs_half_its_weight_where_policy_and_reference_agree(lambda_d, lambda_u):
    """r = 0 and z0 = 0: v = lambda s(0) = lambda / 2, so each completion's loss is
    lambda_y / 2 whatever beta (0.5 each at the default weights)."""
    logps = f64(-3.0, -11.0, -0.5)
    total, count, _ = kto_loss(
        logps, logps - 1, logps, logps - 1, beta=3.0,
        desirable_weight=lambda_d, undesirable_weight=lambda_u,
    )  # fmt: skip
    assert count == 6.0
    assert total.item() == pytest.approx(3 * (lambda_d / 2 + lambda_u / 2), rel=1e-12)


def test_z0_is_the_mean_log_ratio_of_the_batch_clamped_at_zero():
    """Mean log-ratio 0.75 gives z0 = 0.75; a mean of -0.75 gives z0 = 0 (a KL estimate is
    never negative), and then the loss is Eq. 8 with z0 = 0."""
    zero = f64(0.0, 0.0)
    r_d, r_u = f64(1.0, -2.0), f64(0.5, 3.5)
    for sign, z0 in ((1, 0.75), (-1, 0.0)):
        total, _, metrics = kto_loss(sign * r_d, sign * r_u, zero, zero, beta=0.5)
        assert metric(metrics, "kl") == pytest.approx(z0, rel=1e-12)
        loss_d, loss_u = paper_losses(sign * r_d, sign * r_u, beta=0.5, z0=z0)
        assert total.item() == pytest.approx((loss_d.sum() + loss_u.sum()).item(), rel=1e-12)


def test_kl_none_sets_z0_to_zero():
    """With kl: none the same log-ratios (mean 0.75) are measured from z0 = 0."""
    zero = f64(0.0, 0.0)
    r_d, r_u = f64(1.0, -2.0), f64(0.5, 3.5)
    total, _, metrics = kto_loss(r_d, r_u, zero, zero, beta=0.5, kl="none")
    loss_d, loss_u = paper_losses(r_d, r_u, beta=0.5, z0=0.0)
    assert total.item() == pytest.approx((loss_d.sum() + loss_u.sum()).item(), rel=1e-12)
    assert metric(metrics, "kl") == 0.0
    batch, _, _ = kto_loss(r_d, r_u, zero, zero, beta=0.5)
    assert abs(batch.item() - total.item()) > 1e-2  # z0 = 0.75 would have shown


def test_the_weights_scale_each_side():
    """lambda_D multiplies every desirable completion's loss and lambda_U every
    undesirable one's: with (2, 0.5) the total is 2 x the desirable part at weight 1
    plus 0.5 x the undesirable part at weight 1 (z0 does not depend on the weights)."""
    zero = f64(0.0, 0.0)
    r_d, r_u = f64(1.0, -2.0), f64(0.5, 3.5)
    loss_d, loss_u = paper_losses(r_d, r_u, beta=0.5)
    only_d, _, _ = kto_loss(r_d, r_u, zero, zero, beta=0.5, undesirable_weight=0.0)
    only_u, _, _ = kto_loss(r_d, r_u, zero, zero, beta=0.5, desirable_weight=0.0)
    weighted, _, _ = kto_loss(
        r_d, r_u, zero, zero, beta=0.5, desirable_weight=2.0, undesirable_weight=0.5
    )
    assert only_d.item() == pytest.approx(loss_d.sum().item(), rel=1e-12)
    assert only_u.item() == pytest.approx(loss_u.sum().item(), rel=1e-12)
    assert weighted.item() == pytest.approx(
        2.0 * loss_d.sum().item() + 0.5 * loss_u.sum().item(), rel=1e-12
    )


def test_logged_rewards_and_log_probs():
    """rewards/chosen = mean beta r of the desirable completions, rewards/rejected of the
    undesirable ones, margins their difference, accuracies the share of pairs whose
    desirable reward is the larger; logps/* the policy's summed log-probs."""
    policy_c, reference_c = f64(-3.0, -9.0), f64(-4.0, -7.0)  # r_d = (1, -2)
    policy_r, reference_r = f64(-5.5, -2.0), f64(-6.0, -5.5)  # r_u = (0.5, 3.5)
    _, _, metrics = kto_loss(policy_c, policy_r, reference_c, reference_r, beta=0.5)
    assert metric(metrics, "rewards/chosen") == pytest.approx(0.5 * -0.5)
    assert metric(metrics, "rewards/rejected") == pytest.approx(0.5 * 2.0)
    assert metric(metrics, "rewards/margins") == pytest.approx(0.5 * (-0.5 - 2.0))
    assert metric(metrics, "rewards/accuracies") == 0.5  # 1 > 0.5 but -2 < 3.5
    assert metric(metrics, "logps/chosen") == pytest.approx(-6.0)
    assert metric(metrics, "logps/rejected") == pytest.approx(-3.75)


# --------------------------------------------------------------------------- gradients


def analytic_gradient(r_d, r_u, z0, *, beta, lambda_d, lambda_u):
    """d/dpi of the summed loss with z0 constant, s' = s (1 - s):

        desirable:    d/dpi_c [lambda_D (1 - s(beta (r - z0)))] = -lambda_D beta s'(beta (r - z0))
        undesirable:  d/dpi_r [lambda_U (1 - s(beta (z0 - r)))] = +lambda_U beta s'(beta (z0 - r))

    and each completion's loss depends on no other completion's log-probs."""
    x, y = torch.sigmoid(beta * (r_d - z0)), torch.sigmoid(beta * (z0 - r_u))
    return -lambda_d * beta * x * (1 - x), lambda_u * beta * y * (1 - y)


# r_d = (1, -2, 1.8), r_u = (0.5, 3.5, 0): z0 = 0.8 > 0 is not clamped, so a gradient
# through it would show
POLICY_C, POLICY_R = f64(-3.0, -9.0, -1.2), f64(-5.5, -2.0, -4.0)
REFERENCE_C, REFERENCE_R = f64(-4.0, -7.0, -3.0), f64(-6.0, -5.5, -4.0)
KW = {"beta": 0.8, "desirable_weight": 1.5, "undesirable_weight": 0.75}


def test_the_analytic_gradient_matches_finite_differences_of_the_paper_loss_at_fixed_z0():
    """The derivation above, on the paper's loss with z0 held at its value, by central
    differences in float64."""
    r_d, r_u = POLICY_C - REFERENCE_C, POLICY_R - REFERENCE_R
    z0 = torch.cat([r_d, r_u]).mean().item()
    beta, lambda_d, lambda_u = KW["beta"], KW["desirable_weight"], KW["undesirable_weight"]
    h = 1e-6

    def loss(d, u):
        loss_d, loss_u = paper_losses(d, u, beta=beta, lambda_d=lambda_d, lambda_u=lambda_u, z0=z0)
        return loss_d + loss_u  # [P]: pair i's two completions depend on r_d[i], r_u[i] only

    g_d, g_u = analytic_gradient(r_d, r_u, z0, beta=beta, lambda_d=lambda_d, lambda_u=lambda_u)
    torch.testing.assert_close((loss(r_d + h, r_u) - loss(r_d - h, r_u)) / (2 * h), g_d, rtol=1e-6, atol=1e-10)  # fmt: skip
    torch.testing.assert_close((loss(r_d, r_u + h) - loss(r_d, r_u - h)) / (2 * h), g_u, rtol=1e-6, atol=1e-10)  # fmt: skip


def test_autograd_of_kto_loss_holds_z0_constant():
    """By torch.autograd.functional.jacobian in float64, the gradient of kto_loss's sum
    w.r.t. the policy's log-probs is the analytic one at fixed z0 (z0 depends on every
    log-ratio, so a z0 that carried gradient would add dL/dz0 / 6 to every entry), and
    w.r.t. the reference's log-probs it is its negative."""
    r_d, r_u = POLICY_C - REFERENCE_C, POLICY_R - REFERENCE_R
    z0 = torch.cat([r_d, r_u]).mean().item()
    assert z0 == pytest.approx(0.8)
    g_d, g_u = analytic_gradient(
        r_d, r_u, z0, beta=KW["beta"], lambda_d=KW["desirable_weight"], lambda_u=KW["undesirable_weight"]
    )  # fmt: skip
    jac = torch.autograd.functional.jacobian(
        lambda pc, pr, rc, rr: kto_loss(pc, pr, rc, rr, **KW)[0],
        (POLICY_C, POLICY_R, REFERENCE_C, REFERENCE_R),
    )
    torch.testing.assert_close(jac[0], g_d, rtol=1e-10, atol=0)
    torch.testing.assert_close(jac[1], g_u, rtol=1e-10, atol=0)
    torch.testing.assert_close(jac[2], -g_d, rtol=1e-10, atol=0)
    torch.testing.assert_close(jac[3], -g_u, rtol=1e-10, atol=0)


# --------------------------------------------------------------------------- config


def test_a_key_of_another_objective_is_refused(tiny_run_config, tmp_path):
    """objective.simpo_gamma belongs to DPO: under kto the schema refuses it."""
    cfg = tiny_run_config(tmp_path, tmp_path / "pairs.jsonl", {"name": "kto", "simpo_gamma": 0.5})
    with pytest.raises(ValidationError, match="simpo_gamma"):
        TrainConfig.model_validate(cfg)


def test_config_defaults_and_refusals():
    """Defaults as documented; weights and beta must be positive; kl is batch or none."""
    cfg = KTOConfig()
    assert (cfg.beta, cfg.desirable_weight, cfg.undesirable_weight, cfg.kl) == (
        0.1,
        1.0,
        1.0,
        "batch",
    )
    assert cfg.reference.path is None and cfg.reference.precompute is False
    for bad in (
        {"beta": 0},
        {"desirable_weight": 0},
        {"undesirable_weight": -1},
        {"kl": "mismatched"},
    ):
        with pytest.raises(ValidationError):
            KTOConfig(**bad)


# --------------------------------------------------------------------------- the trainer


def kto_config(tiny_run_config, output_dir, data_path, objective: dict, **training):
    return TrainConfig.model_validate(
        tiny_run_config(output_dir, data_path, {"name": "kto", **objective}, **training)
    )


def run_metrics(cfg: TrainConfig) -> list[dict]:
    train(cfg)
    return read_metrics(cfg.run_dir)


def pair_logps(model, rows) -> torch.Tensor:
    """[P, 2] summed log-probs (chosen, rejected)."""
    return torch.stack(
        [
            torch.stack(
                [
                    completion_logp(model, row["prompt_input_ids"], row[f"{side}_input_ids"], row[f"{side}_labels"])[0]
                    for side in ("chosen", "rejected")
                ]
            )
            for row in rows
        ]
    )  # fmt: skip


@pytest.fixture(scope="module")
def logps(tiny_model_dir, other_model_dir):
    """Independent log-probs of the module's pairs under the policy's start (seed 0) and
    the other reference (seed 1): ``{"policy": [P, 2], "other": [P, 2]}``."""
    rows = preference_pairs()
    with torch.no_grad():
        return {
            "policy": pair_logps(load_float64(tiny_model_dir), rows),
            "other": pair_logps(load_float64(other_model_dir), rows),
        }


def expected_loss(objective: dict, logps: dict) -> float:
    """The step's loss, the mean over the 16 completions of Eq. 8, from the independent
    log-probs against the seed-1 reference (one micro-batch: z0 over all 16)."""
    r = logps["policy"] - logps["other"]
    z0 = 0.0 if objective.get("kl") == "none" else None
    loss_d, loss_u = paper_losses(
        r[:, 0], r[:, 1], beta=objective["beta"],
        lambda_d=objective.get("desirable_weight", 1.0),
        lambda_u=objective.get("undesirable_weight", 1.0), z0=z0,
    )  # fmt: skip
    return torch.cat([loss_d, loss_u]).mean().item()


# The trainer works in float32: its summed log-probs are ~1e-6 off the float64 ones, and
# the loss (order 0.5, derivative at most beta lambda / 4 per log-ratio) agrees to ~1e-7.
LOSS_TOLERANCE = {"abs": 1e-5, "rel": 1e-5}

# beta 2: beta r of order 1 to 5 for these log-ratios
CASES = {
    "default": {"beta": 2.0},
    "weighted": {"beta": 2.0, "desirable_weight": 1.3, "undesirable_weight": 0.8},
    "kl none": {"beta": 2.0, "kl": "none"},
}


def test_the_seed_1_reference_gives_log_ratios_far_from_zero_and_a_positive_z0(logps):
    """The data are worth something only if a wrong sign, beta, weight or z0 shows at
    1e-5: the log-ratios are of order 1, of both signs, and their mean (z0 = 0.43) is
    positive, so kl: batch and kl: none differ by 1e-2 in the loss; desirable and
    undesirable swapped, by 2e-3. (The loss itself stays near 0.5: the mean margin
    r_d - r_u of these pairs is 0.02, and Eq. 8 is odd about 0.5 to first order in it.)"""
    r = logps["policy"] - logps["other"]
    assert r.abs().max() > 1.0 and (r > 0).any() and (r < 0).any()
    assert r.mean() > 0.4
    default, no_kl = expected_loss(CASES["default"], logps), expected_loss(CASES["kl none"], logps)
    assert abs(default - no_kl) > 1e-2
    swapped = {name: value.flip(1) for name, value in logps.items()}
    assert abs(default - expected_loss(CASES["default"], swapped)) > 1e-3


@pytest.mark.parametrize(
    ("weights", "expected"),
    [({}, 0.5), ({"desirable_weight": 2.0, "undesirable_weight": 1.0}, (2.0 / 2 + 1.0 / 2) / 2)],
)
def test_loss_at_initialisation_is_half_the_mean_weight(
    tmp_path, tiny_run_config, pairs_file, weights, expected
):
    """With no reference path the reference is the policy's start: every r is 0, z0 = 0,
    and each completion costs lambda_y / 2, so the step's mean over its 8 desirable and 8
    undesirable completions is (lambda_D + lambda_U) / 4: 0.5 at the default weights."""
    cfg = kto_config(tiny_run_config, tmp_path, pairs_file, {"beta": 0.1, **weights})
    (record,) = run_metrics(cfg)
    assert record["loss"] == pytest.approx(expected, abs=1e-7)
    for key in ("kl", "rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert record[key] == pytest.approx(0.0, abs=1e-7), key


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_one_loss_with_a_different_reference_matches_the_paper(
    tmp_path, tiny_run_config, pairs_file, other_model_dir, logps, case
):
    """lr 0: the logged step-1 loss is Eq. 8 of the starting policy against the seed-1
    reference on the independent log-probs, and the logged kl is z0."""
    objective = CASES[case]
    cfg = kto_config(
        tiny_run_config, tmp_path, pairs_file, {**objective, "reference": {"path": str(other_model_dir)}}
    )  # fmt: skip
    (record,) = run_metrics(cfg)
    assert record["loss"] == pytest.approx(expected_loss(objective, logps), **LOSS_TOLERANCE)
    r = logps["policy"] - logps["other"]
    z0 = 0.0 if objective.get("kl") == "none" else max(0.0, r.mean().item())
    assert record["kl"] == pytest.approx(z0, abs=1e-5)
    beta = objective["beta"]
    assert record["rewards/chosen"] == pytest.approx(beta * r[:, 0].mean().item(), abs=1e-5)
    assert record["rewards/rejected"] == pytest.approx(beta * r[:, 1].mean().item(), abs=1e-5)


def test_precomputed_reference_gives_the_live_reference_loss(
    tmp_path, tiny_run_config, pairs_file, other_model_dir, logps
):
    """reference.precompute computes the reference's log-probs once, before training, and
    stores them in <run>/reference/; the step-1 loss is the one with the reference run
    live beside the policy, and the stored table is the reference's log-probs."""
    objective = CASES["default"]
    live, stored = (
        kto_config(
            tiny_run_config, tmp_path / name, pairs_file,
            {**objective, "reference": {"path": str(other_model_dir), "precompute": precompute}},
        )
        for name, precompute in (("live", False), ("precompute", True))
    )  # fmt: skip
    (live_record,) = run_metrics(live)
    (stored_record,) = run_metrics(stored)
    assert stored_record["loss"] == pytest.approx(live_record["loss"], abs=1e-6)
    assert stored_record["loss"] == pytest.approx(expected_loss(objective, logps), **LOSS_TOLERANCE)
    assert stored_record["kl"] == pytest.approx(live_record["kl"], abs=1e-6)

    reference = stored.run_dir / "reference"
    assert sorted(p.name for p in reference.iterdir()) == ["logps.npy", "meta.json"]
    table = np.load(reference / "logps.npy")  # [pairs, 2]: chosen, rejected, in file order
    np.testing.assert_allclose(table, logps["other"].numpy(), rtol=0, atol=1e-5)
    assert not (live.run_dir / "reference").exists()


def test_a_few_steps_of_training_raise_the_reward_margin(tmp_path, tiny_run_config, pairs_file):
    """lr 1e-3 on the same 8 pairs each step, the policy its own reference: the margin
    starts at 0 and grows (desirable completions up, undesirable down), and the loss
    falls below its starting 0.5."""
    cfg = kto_config(
        tiny_run_config, tmp_path, pairs_file, {"beta": 0.5}, learning_rate=1e-3, max_steps=4
    )
    records = run_metrics(cfg)
    margins = [r["rewards/margins"] for r in records]
    assert margins[0] == pytest.approx(0.0, abs=1e-7)
    assert all(b > a for a, b in pairwise(margins)), margins
    assert records[-1]["rewards/chosen"] > 0 > records[-1]["rewards/rejected"]
    assert records[-1]["loss"] < records[0]["loss"] == pytest.approx(0.5, abs=1e-7)
