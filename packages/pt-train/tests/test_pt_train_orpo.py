"""ORPO (Hong, Lee and Thorne 2024): the loss written out from the paper and checked
against ``pt_train.objectives.orpo``, first as a pure function of log-probs, then through
the real trainer (one CPU process, in-process) against log-probs computed here with plain
``transformers`` forward passes in float64.

Per pair, with ``m`` the trained tokens of a completion and ``P(y|x) = exp(1/m sum_t
log p(y_t | x, y_<t))`` its length-normalised likelihood:

- Eq. 2: L_SFT = -1/m sum_t log p(y_t | x, y_<t) = -log P(y_c|x), of the chosen completion;
- Eq. 6-7: odds(y|x) = P / (1 - P), L_OR = -log s(log(odds(y_c|x) / odds(y_r|x)));
- L = L_SFT + lambda L_OR (``beta`` is lambda, as in TRL); a step's loss is the mean over
  its pairs. There is no reference model.

The model is the tiny Llama of the root conftest (``tiny_model_dir``: hidden 128, 2 layers,
seed 0, the same weights as ``model.init`` with ``training.seed: 0``).
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
from preference_data import completion_logp, load_float64, preference_pairs
from pydantic import ValidationError

from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.objectives.orpo import ORPOConfig, log_odds, orpo_loss
from pt_train.trainer import train

# --------------------------------------------------------------------------- the paper, here


def paper_loss(s_c, s_r, n_c, n_r, *, beta: float) -> torch.Tensor:
    """[P] per-pair ORPO losses from summed log-probs ``s_*`` and trained-token counts
    ``n_*``, written from Eq. 2 and 6-7 with the plain odds P / (1 - P) (float64)."""
    p_c, p_r = torch.exp(s_c / n_c), torch.exp(s_r / n_r)
    odds_c, odds_r = p_c / (1 - p_c), p_r / (1 - p_r)
    l_sft = -torch.log(p_c)
    l_or = -torch.log(torch.sigmoid(torch.log(odds_c / odds_r)))
    return l_sft + beta * l_or


def f64(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# --------------------------------------------------------------------------- the pure loss


def test_loss_of_one_pair_written_out_by_hand():
    """Chosen: 3 tokens, summed log-prob -1.5, so log P_c = -0.5; rejected: 4 tokens, -8,
    so log P_r = -2. Then L_SFT = 0.5 and L_OR = log(1 + odds_r / odds_c) (that is
    -log s(log(odds_c / odds_r))), with odds = e^a / (1 - e^a)."""
    beta = 0.25
    odds_c = math.exp(-0.5) / (1 - math.exp(-0.5))
    odds_r = math.exp(-2.0) / (1 - math.exp(-2.0))
    expected = 0.5 + beta * math.log(1 + odds_r / odds_c)
    total, count, metrics = orpo_loss(f64(-1.5), f64(-8.0), f64(3), f64(4), beta=beta)
    assert total.item() == pytest.approx(expected, rel=1e-12)
    assert count == 1.0
    assert metrics["nll"] == (pytest.approx(0.5, rel=1e-12), 1.0)


def test_the_loss_of_a_step_is_the_sum_over_pairs_with_the_pair_count():
    """orpo_loss returns the SUM of the per-pair losses and the number of pairs, so that
    the trainer's sum / count is the mean over the step's pairs whatever the split."""
    s_c, s_r = f64(-1.5, -12.0, -0.3), f64(-8.0, -9.0, -0.2)
    n_c, n_r = f64(3, 6, 1), f64(4, 3, 2)
    total, count, _ = orpo_loss(s_c, s_r, n_c, n_r, beta=0.1)
    assert count == 3.0
    assert total.item() == pytest.approx(
        paper_loss(s_c, s_r, n_c, n_r, beta=0.1).sum().item(), rel=1e-12
    )


@pytest.mark.parametrize("beta", [0.1, 1.0])
def test_equal_token_mean_log_probs_give_an_odds_ratio_term_of_beta_log_2(beta):
    """Chosen 2 tokens summing to -3 and rejected 4 tokens summing to -6 have the same
    token-mean log-prob -1.5: the odds ratio is 1, -log s(0) = log 2, so the loss is
    1.5 + beta log 2 (the summed log-probs differ; only the token means count)."""
    total, _, metrics = orpo_loss(f64(-3.0), f64(-6.0), f64(2), f64(4), beta=beta)
    assert total.item() == pytest.approx(1.5 + beta * math.log(2), rel=1e-12)
    assert metrics["log_odds_chosen"][0].item() == 0.0
    assert metrics["log_odds_ratio"][0].item() == pytest.approx(-math.log(2), rel=1e-12)


def test_the_same_completion_as_chosen_and_rejected_costs_its_nll_plus_beta_log_2():
    s, n = f64(-4.2, -0.7), f64(7, 2)
    total, _, _ = orpo_loss(s, s, n, n, beta=0.1)
    expected = (4.2 / 7 + 0.7 / 2) + 2 * 0.1 * math.log(2)
    assert total.item() == pytest.approx(expected, rel=1e-12)


def test_the_nll_is_the_token_mean_over_trained_tokens():
    """The same summed log-prob -6 over 2 or over 6 trained tokens is a token-mean NLL of
    3 or of 1 (Eq. 2 divides by the completion's length)."""
    for n, nll in ((2, 3.0), (6, 1.0)):
        _, _, metrics = orpo_loss(f64(-6.0), f64(-6.0), f64(n), f64(n), beta=0.1)
        assert metrics["nll"][0].item() == pytest.approx(nll, rel=1e-12)


def test_logged_metrics_are_the_documented_means():
    """rewards/* = beta x token-mean log-prob, margins their difference, accuracies the
    share of pairs whose chosen reward is the larger, logps/* the summed log-probs."""
    beta = 0.5
    s_c, s_r, n_c, n_r = f64(-2.0, -9.0), f64(-6.0, -2.0), f64(2, 3), f64(3, 1)
    a_c, a_r = s_c / n_c, s_r / n_r  # (-1, -3) and (-2, -2)
    _, _, metrics = orpo_loss(s_c, s_r, n_c, n_r, beta=beta)

    def mean(name):
        total, count = metrics[name]
        return float(total) / count

    assert mean("rewards/chosen") == pytest.approx(beta * a_c.mean().item())
    assert mean("rewards/rejected") == pytest.approx(beta * a_r.mean().item())
    assert mean("rewards/margins") == pytest.approx(beta * (a_c - a_r).mean().item())
    assert mean("rewards/accuracies") == 0.5  # -1 > -2 but -3 < -2
    assert mean("logps/chosen") == pytest.approx(-5.5)
    assert mean("logps/rejected") == pytest.approx(-4.0)
    p_c, p_r = torch.exp(a_c), torch.exp(a_r)
    ratio = torch.log(p_c / (1 - p_c)) - torch.log(p_r / (1 - p_r))
    assert mean("log_odds_chosen") == pytest.approx(ratio.mean().item())


def test_log_odds_metrics_hold_what_trls_metrics_of_the_same_names_hold():
    """TRL's ORPOTrainer (trl/experimental/orpo/orpo_trainer.py, odds_ratio_loss, here
    written out) logs ``log_odds_chosen`` = the mean log odds ratio
    ``(a_c - a_r) - (log(1 - e^a_c) - log(1 - e^a_r))`` and ``log_odds_ratio`` = the mean of
    its log-sigmoid (the odds-ratio term before beta): a run compared with a TRL run
    compares the same curves."""
    s_c, s_r, n_c, n_r = f64(-2.0, -9.0), f64(-6.0, -2.0), f64(2, 3), f64(3, 1)
    a_c, a_r = s_c / n_c, s_r / n_r
    log_odds = (a_c - a_r) - (torch.log1p(-torch.exp(a_c)) - torch.log1p(-torch.exp(a_r)))
    _, _, metrics = orpo_loss(s_c, s_r, n_c, n_r, beta=0.5)

    def mean(name):
        total, count = metrics[name]
        return float(total) / count

    assert mean("log_odds_chosen") == pytest.approx(log_odds.mean().item(), rel=1e-12)
    assert mean("log_odds_ratio") == pytest.approx(
        torch.nn.functional.logsigmoid(log_odds).mean().item(), rel=1e-12
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_odds_is_finite_and_right_near_p_1_and_near_p_0(dtype):
    """At a = -1e-8, P = 1 - 1e-8: 1 - P underflows to 0 in float32 if computed from P, yet
    log odds = a - log(1 - e^a) ~ -log(1e-8) = 18.42. At a = -50, P = e^-50: log odds ~ -50.
    Both finite, with finite derivatives 1 / (1 - e^a) (1e8 and 1)."""
    a = torch.tensor([-1e-8, -50.0], dtype=dtype, requires_grad=True)
    value = log_odds(a)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(a.grad).all()
    assert value[0].item() == pytest.approx(-math.log(1e-8), rel=1e-6)
    assert value[1].item() == pytest.approx(-50.0, rel=1e-6)
    assert a.grad[0].item() == pytest.approx(1e8, rel=1e-6)
    assert a.grad[1].item() == pytest.approx(1.0, rel=1e-6)


def test_log_odds_is_the_log_of_p_over_one_minus_p():
    a = f64(-0.01, -0.5, -2.0, -7.0)
    p = torch.exp(a)
    torch.testing.assert_close(log_odds(a), torch.log(p / (1 - p)), rtol=1e-12, atol=0)


def test_the_loss_stays_finite_near_p_1_and_near_p_0():
    """A chosen completion of near-certain tokens and a rejected one of near-impossible
    ones (and the reverse) give finite losses and gradients in float32."""
    s_c = torch.tensor([-1e-7, -200.0], requires_grad=True)
    s_r = torch.tensor([-200.0, -1e-7], requires_grad=True)
    n = torch.tensor([4, 4])
    total, _, _ = orpo_loss(s_c, s_r, n, n, beta=0.1)
    total.backward()
    assert torch.isfinite(total)
    assert torch.isfinite(s_c.grad).all() and torch.isfinite(s_r.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_completion_of_certain_tokens_gives_a_finite_loss_and_gradient(dtype):
    """float32 log_softmax gives exactly 0 to a token of probability ~1, so a confident
    completion (or one with no trained token) has a = 0, where log odds are infinite.
    Pair 1: such a chosen completion; its odds term is 0 and its gradient the NLL's
    -1/n_c = -0.5 (not 0 x inf = nan). Pair 2: such a rejected completion; the loss
    stays finite."""
    s_c = torch.tensor([0.0, -2.0], dtype=dtype, requires_grad=True)
    s_r = torch.tensor([-3.0, 0.0], dtype=dtype, requires_grad=True)
    total, _, _ = orpo_loss(s_c, s_r, torch.tensor([2, 2]), torch.tensor([2, 0]), beta=0.1)
    total.backward()
    assert torch.isfinite(total)
    assert torch.isfinite(s_c.grad).all() and torch.isfinite(s_r.grad).all()
    assert s_c.grad[0].item() == pytest.approx(-0.5, rel=1e-6)


# --------------------------------------------------------------------------- gradients


def analytic_gradient(s_c, s_r, n_c, n_r, *, beta):
    """dL/ds_c and dL/ds_r of one pair's loss. With a = s / n, l = lo(a_c) - lo(a_r) and
    lo(a) = a - log(1 - e^a), so lo'(a) = 1 / (1 - e^a), and d/dl [-log s(l)] = -s(-l):

        dL/ds_c = (-1 - beta s(-l) / (1 - e^a_c)) / n_c
        dL/ds_r = beta s(-l) / (1 - e^a_r) / n_r
    """
    a_c, a_r = s_c / n_c, s_r / n_r
    lo_c = a_c - torch.log(1 - torch.exp(a_c))
    lo_r = a_r - torch.log(1 - torch.exp(a_r))
    push = torch.sigmoid(-(lo_c - lo_r))
    d_c = (-1 - beta * push / (1 - torch.exp(a_c))) / n_c
    d_r = beta * push / (1 - torch.exp(a_r)) / n_r
    return d_c, d_r


# Pairs with P from 0.0025 to 0.9: P near 1 makes lo'(a) = 1 / (1 - P) large (10x here).
GRAD_CASES = (f64(-1.5, -12.0, -0.3, -0.42), f64(-8.0, -9.0, -0.2, -24.0),
              f64(3, 2, 1, 4), f64(4, 3, 2, 4))  # fmt: skip


def test_the_analytic_gradient_matches_finite_differences_of_the_paper_loss():
    """The derivation above, checked on the paper's loss (not the implementation) by
    central differences in float64."""
    s_c, s_r, n_c, n_r = GRAD_CASES
    beta, h = 0.7, 1e-6
    d_c, d_r = analytic_gradient(s_c, s_r, n_c, n_r, beta=beta)
    fd_c = (paper_loss(s_c + h, s_r, n_c, n_r, beta=beta) - paper_loss(s_c - h, s_r, n_c, n_r, beta=beta)) / (2 * h)  # fmt: skip
    fd_r = (paper_loss(s_c, s_r + h, n_c, n_r, beta=beta) - paper_loss(s_c, s_r - h, n_c, n_r, beta=beta)) / (2 * h)  # fmt: skip
    torch.testing.assert_close(fd_c, d_c, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(fd_r, d_r, rtol=1e-6, atol=1e-9)


def test_autograd_of_orpo_loss_is_the_analytic_gradient():
    """The gradient of orpo_loss's sum w.r.t. the summed log-probs, by
    torch.autograd.functional.jacobian in float64: each pair's loss depends on its own
    log-probs only, with the derivatives derived above."""
    s_c, s_r, n_c, n_r = GRAD_CASES
    beta = 0.7
    jac_c, jac_r = torch.autograd.functional.jacobian(
        lambda c, r: orpo_loss(c, r, n_c, n_r, beta=beta)[0], (s_c, s_r)
    )
    d_c, d_r = analytic_gradient(s_c, s_r, n_c, n_r, beta=beta)
    torch.testing.assert_close(jac_c, d_c, rtol=1e-10, atol=0)
    torch.testing.assert_close(jac_r, d_r, rtol=1e-10, atol=0)


# --------------------------------------------------------------------------- config


def test_a_key_of_another_objective_is_refused(tiny_run_config, tmp_path):
    """objective.simpo_gamma belongs to DPO: under orpo the schema refuses it."""
    cfg = tiny_run_config(tmp_path, tmp_path / "pairs.jsonl", {"name": "orpo", "simpo_gamma": 0.5})
    with pytest.raises(ValidationError, match="simpo_gamma"):
        TrainConfig.model_validate(cfg)


def test_orpo_takes_no_reference(tiny_run_config, tmp_path):
    """ORPO has no reference model; a config that gives it one is refused."""
    objective = {"name": "orpo", "reference": {"path": "somewhere"}}
    with pytest.raises(ValidationError, match="reference"):
        TrainConfig.model_validate(tiny_run_config(tmp_path, tmp_path / "p.jsonl", objective))


def test_beta_must_be_positive():
    assert ORPOConfig().beta == 0.1
    with pytest.raises(ValidationError, match="beta"):
        ORPOConfig(beta=0.0)


# --------------------------------------------------------------------------- the trainer


def orpo_config(tiny_run_config, output_dir, data_path, objective: dict, **training):
    return TrainConfig.model_validate(
        tiny_run_config(output_dir, data_path, {"name": "orpo", **objective}, **training)
    )


def run_metrics(cfg: TrainConfig) -> list[dict]:
    train(cfg)
    return read_metrics(cfg.run_dir)


@pytest.fixture(scope="module")
def logps(tiny_model_dir):
    """Independent log-probs of the module's pairs under the policy's start:
    ``{"policy": [P, 2] summed log-probs (chosen, rejected), "n": [P, 2] trained tokens}``."""
    model = load_float64(tiny_model_dir)
    sums, counts = [], []
    with torch.no_grad():
        for row in preference_pairs():
            c, nc = completion_logp(
                model, row["prompt_input_ids"], row["chosen_input_ids"], row["chosen_labels"]
            )
            r, nr = completion_logp(
                model, row["prompt_input_ids"], row["rejected_input_ids"], row["rejected_labels"]
            )
            sums.append(torch.stack([c, r]))
            counts.append([nc, nr])
    return {"policy": torch.stack(sums), "n": torch.tensor(counts, dtype=torch.float64)}


# The trainer works in float32: its summed log-probs are ~1e-6 off the float64 ones, and
# the loss (6 to 8 here: a token-mean NLL near log 462 = 6.1 plus the odds term) agrees
# to ~1e-6.
LOSS_TOLERANCE = {"abs": 1e-5, "rel": 1e-5}


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_step_one_loss_matches_the_paper(tmp_path, tiny_run_config, pairs_file, logps, beta):
    """lr 0: the logged step-1 loss is the mean over the 8 pairs of Eq. 2 + beta Eq. 7 on
    the independent log-probs, and the logged NLL and log odds ratio (log_odds_chosen, as
    TRL names it) are its parts."""
    cfg = orpo_config(tiny_run_config, tmp_path, pairs_file, {"beta": beta})
    (record,) = run_metrics(cfg)
    pi, n = logps["policy"], logps["n"]
    expected = paper_loss(pi[:, 0], pi[:, 1], n[:, 0], n[:, 1], beta=beta).mean().item()
    assert record["loss"] == pytest.approx(expected, **LOSS_TOLERANCE)
    assert record["nll"] == pytest.approx((-pi[:, 0] / n[:, 0]).mean().item(), **LOSS_TOLERANCE)
    p = torch.exp(pi / n)
    ratio = torch.log(p[:, 0] / (1 - p[:, 0])) - torch.log(p[:, 1] / (1 - p[:, 1]))
    assert record["log_odds_chosen"] == pytest.approx(ratio.mean().item(), abs=1e-5)
    # the odds-ratio term is visible at this tolerance: the pairs' ratios are far from 0
    assert ratio.abs().max() > 0.05


def test_a_few_steps_of_training_lower_the_loss(tmp_path, tiny_run_config, pairs_file):
    """lr 1e-3 on the same 8 pairs each step: the loss goes down from step to step, and
    the chosen completions' token-mean NLL with it."""
    cfg = orpo_config(
        tiny_run_config, tmp_path, pairs_file, {"beta": 0.1}, learning_rate=1e-3, max_steps=4
    )
    records = run_metrics(cfg)
    losses = [r["loss"] for r in records]
    assert len(losses) == 4
    assert all(b < a for a, b in pairwise(losses)), losses
    assert records[-1]["nll"] < records[0]["nll"]
