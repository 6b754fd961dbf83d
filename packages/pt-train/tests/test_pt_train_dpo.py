"""DPO and its family, trained by the real trainer (one CPU process, in-process), checked
against log-probs computed here with plain ``transformers`` forward passes in float64 and
the losses written out from the papers:

- sigmoid: Rafailov et al. 2023 (DPO), Eq. 7; label smoothing e: Mitchell 2023 (cDPO);
- robust: Chowdhury et al. 2024 (provably robust DPO: unbiased under label-flip rate e);
- hinge: Liu et al. 2023 (RSO), SLiC's hinge (Zhao et al. 2023) on the reference-normalised
  margin, max(0, 1 - b h), as in TRL;
- ipo: Azar et al. 2023, Eq. 17, on token-mean log-probs as in TRL;
- bco_pair: Jung et al. 2024 (BCO), rewards shifted by a running mean delta (here, as
  documented, of the steps before this one; TRL also counts the current batch);
- sppo_hard: Wu et al. 2024 (SPPO), Eq. 4.7 with hard win probabilities 1 and 0;
- apo_zero: D'Oosterlinck et al. 2024 (APO-zero);
- simpo: Meng et al. 2024, Eq. 6 (token-mean log-probs, no reference, margin gamma);
- rpo_alpha: Pang et al. 2024 (Iterative RPO), + alpha x the chosen response's
  length-normalised NLL.

The models are the tiny Llama of the root conftest (``tiny_model_dir``: hidden 128,
2 layers, seed 0, the same weights as ``model.init`` with ``training.seed: 0``) and,
as "a different reference", the same architecture built with seed 1.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from preference_data import completion_logp, load_float64, preference_pairs
from safetensors.torch import load_file

from pt_core.files import write_rows
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train


@pytest.fixture(scope="module")
def dpo_config_dict(tiny_run_config):
    """``build(output_dir, data_path, objective, **training)``: a DPO run's config dict."""

    def build(output_dir, data_path, objective: dict, **training) -> dict:
        return tiny_run_config(output_dir, data_path, {"name": "dpo", **objective}, **training)

    return build


@pytest.fixture(scope="module")
def dpo_config(dpo_config_dict):
    """Like ``dpo_config_dict``, validated."""
    return lambda *args, **kwargs: TrainConfig.model_validate(dpo_config_dict(*args, **kwargs))


def run_metrics(cfg: TrainConfig) -> list[dict]:
    train(cfg)
    return read_metrics(cfg.run_dir)


# --------------------------------------------------------------------------- independent side


def pair_logps(model, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """[P, 2] summed log-probs (chosen, rejected) and [P, 2] trained-token counts."""
    sums, counts = [], []
    for row in rows:
        c, nc = completion_logp(
            model, row["prompt_input_ids"], row["chosen_input_ids"], row["chosen_labels"]
        )
        r, nr = completion_logp(
            model, row["prompt_input_ids"], row["rejected_input_ids"], row["rejected_labels"]
        )
        sums.append(torch.stack([c, r]))
        counts.append([nc, nr])
    return torch.stack(sums), torch.tensor(counts, dtype=torch.float64)


@pytest.fixture(scope="module")
def logps(tiny_model_dir, other_model_dir):
    """Independent log-probs of the module's pairs under the policy's start (seed 0) and
    the other reference (seed 1): ``{"policy": [P, 2], "other": [P, 2], "n": [P, 2]}``."""
    rows = preference_pairs()
    with torch.no_grad():
        policy, n = pair_logps(load_float64(tiny_model_dir), rows)
        other, n_other = pair_logps(load_float64(other_model_dir), rows)
    assert torch.equal(n, n_other)
    return {"policy": policy, "other": other, "n": n}


def paper_losses(loss_type, pi, ref, n, *, beta, e=0.0, gamma=0.5, delta=0.0):
    """[P] per-pair losses written from the papers (see the module docstring).

    pi, ref: [P, 2] summed log-probs (chosen, rejected); n: [P, 2] trained tokens.
    """
    logsig = F.logsigmoid
    c, r = pi[:, 0] - ref[:, 0], pi[:, 1] - ref[:, 1]  # implicit reward log-ratios
    h = c - r
    if loss_type == "sigmoid":  # -log s(b h), the label flipped with probability e
        return -(1 - e) * logsig(beta * h) - e * logsig(-beta * h)
    if loss_type == "robust":  # unbiased estimate of the clean loss under flip rate e
        return ((1 - e) * -logsig(beta * h) - e * -logsig(-beta * h)) / (1 - 2 * e)
    if loss_type == "hinge":
        return torch.clamp(1 - beta * h, min=0)
    if loss_type == "ipo":  # the regression target of the length-normalised margin
        h_mean = c / n[:, 0] - r / n[:, 1]
        return (h_mean - 1 / (2 * beta)) ** 2
    if loss_type == "bco_pair":
        return -logsig(beta * c - delta) - logsig(-(beta * r - delta))
    if loss_type == "sppo_hard":  # P(chosen wins) = 1, P(rejected wins) = 0
        return (c - 1 / (2 * beta)) ** 2 + (r + 1 / (2 * beta)) ** 2
    if loss_type == "apo_zero":  # push chosen up, rejected down, each on its own
        return (1 - torch.sigmoid(beta * c)) + torch.sigmoid(beta * r)
    if loss_type == "simpo":  # no reference: the policy's own token-mean log-probs
        z = beta * (pi[:, 0] / n[:, 0] - pi[:, 1] / n[:, 1]) - gamma
        return -(1 - e) * logsig(z) - e * logsig(-z)
    raise AssertionError(loss_type)


# --------------------------------------------------------------------------- at initialisation


@pytest.mark.parametrize(
    ("loss_type", "beta", "expected"),
    [
        ("sigmoid", 0.1, math.log(2)),  # -log s(0)
        ("robust", 0.1, math.log(2)),  # ((1-e) log 2 - e log 2) / (1 - 2e) with e = 0
        ("hinge", 0.1, 1.0),  # max(0, 1 - 0)
        ("ipo", 0.1, 1 / (4 * 0.1**2)),  # (0 - 1/(2b))^2 = 25
        ("ipo", 0.5, 1 / (4 * 0.5**2)),  # = 1: the value follows beta
        ("bco_pair", 0.1, 2 * math.log(2)),  # -log s(0) - log s(0), delta = 0
        ("sppo_hard", 0.1, 1 / (2 * 0.1**2)),  # (0 - 1/(2b))^2 + (0 + 1/(2b))^2 = 50
        ("apo_zero", 0.1, 1.0),  # (1 - s(0)) + s(0)
    ],
)
def test_loss_at_initialisation_where_policy_and_reference_agree(
    tmp_path, dpo_config, pairs_file, loss_type, beta, expected
):
    """With no reference path the reference is the policy's start, so every log-ratio is
    0 and each loss takes the value of its formula at c = r = 0."""
    cfg = dpo_config(tmp_path, pairs_file, {"loss_type": loss_type, "beta": beta})
    (record,) = run_metrics(cfg)
    assert record["loss"] == pytest.approx(expected, abs=1e-6)
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert record[key] == pytest.approx(0.0, abs=1e-7), key


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_sigmoid_gradient_at_initialisation_is_minus_half_beta_times_the_margin_gradient(
    tmp_path, dpo_config, tiny_model_dir, pairs_file, beta
):
    """d/dh [-log s(b h)] = -b s(-b h) = -b/2 at h = 0, so at the start the gradient of the
    step's mean loss is -b/2 x the gradient of the mean margin mean_p(pi_c - pi_r) (the
    reference is constant). The logged grad_norm (before clipping) must be b/2 x the norm
    of that gradient, computed here with autograd through a plain forward in float64."""
    cfg = dpo_config(tmp_path, pairs_file, {"beta": beta})
    (record,) = run_metrics(cfg)

    model = load_float64(tiny_model_dir)
    rows = preference_pairs()
    margins = []
    for row in rows:
        c, _ = completion_logp(
            model, row["prompt_input_ids"], row["chosen_input_ids"], row["chosen_labels"]
        )
        r, _ = completion_logp(
            model, row["prompt_input_ids"], row["rejected_input_ids"], row["rejected_labels"]
        )
        margins.append(c - r)
    torch.stack(margins).mean().backward()
    margin_grad_norm = torch.sqrt(sum((p.grad**2).sum() for p in model.parameters()))
    assert record["grad_norm"] == pytest.approx(beta / 2 * margin_grad_norm.item(), rel=1e-5)


# --------------------------------------------------------------------------- a different reference

# The objective of each case; the expected loss is the papers' formula on the independent
# log-probs (expected_loss). Betas are chosen so that b h is of order 1 for these models
# (hinge: so that the clamp at 0 is reached by some pairs and not by others).
CASES = {
    "sigmoid": {"loss_type": "sigmoid", "beta": 0.5},
    "sigmoid-smoothed": {"loss_type": "sigmoid", "beta": 0.5, "label_smoothing": 0.2},
    "robust": {"loss_type": "robust", "beta": 0.5, "label_smoothing": 0.2},
    "hinge": {"loss_type": "hinge", "beta": 1.0},
    "ipo": {"loss_type": "ipo", "beta": 0.5},
    "bco_pair": {"loss_type": "bco_pair", "beta": 0.5},
    "sppo_hard": {"loss_type": "sppo_hard", "beta": 0.5},
    "apo_zero": {"loss_type": "apo_zero", "beta": 0.5},
    "simpo": {"loss_type": "simpo", "beta": 2.0, "simpo_gamma": 0.5},
    "simpo-smoothed": {
        "loss_type": "simpo",
        "beta": 2.0,
        "simpo_gamma": 0.3,
        "label_smoothing": 0.1,
    },  # fmt: skip
    "rpo": {"loss_type": "sigmoid", "beta": 0.5, "rpo_alpha": 0.5},
    # a sum-of-log-probs loss and a token-mean one: each keeps its own normalisation
    "sigmoid+ipo": {"loss_type": ["sigmoid", "ipo"], "loss_weights": [1.0, 0.25], "beta": 0.5},
}


def expected_loss(objective: dict, logps: dict, *, delta: float = 0.0) -> float:
    """The step's loss: the mean over pairs of sum_i w_i loss_i (+ rpo_alpha x the chosen
    response's token-mean NLL), from the independent log-probs."""
    pi, ref, n = logps["policy"], logps["other"], logps["n"]
    types = objective["loss_type"]
    types = [types] if isinstance(types, str) else types
    weights = objective.get("loss_weights") or [1.0] * len(types)
    total = torch.zeros(len(pi), dtype=torch.float64)
    for loss_type, weight in zip(types, weights, strict=True):
        total += weight * paper_losses(
            loss_type,
            pi,
            ref,
            n,
            beta=objective["beta"],
            e=objective.get("label_smoothing", 0.0),
            gamma=objective.get("simpo_gamma", 0.5),
            delta=delta,
        )
    if objective.get("rpo_alpha"):
        total += objective["rpo_alpha"] * (-pi[:, 0] / n[:, 0])
    return total.mean().item()


# The trainer works in float32: its sequence log-probs are ~1e-6 off the float64 ones
# (measured: 1.3e-6 at most over these 16 sequences). Losses of order 1 then agree to
# ~1e-6; sppo_hard's (~5, squares whose derivative reaches |2 (r + 1/(2b))| ~ 7) to ~2e-5,
# hence a relative 1e-5 for the losses above 1.
LOSS_TOLERANCE = {"abs": 1e-5, "rel": 1e-5}


def test_the_seed_1_reference_moves_the_log_ratios_far_from_zero(logps):
    """The test data are worth something only if a wrong sign, beta or normalisation
    shows at 1e-5: the margins h are of order 1, of both signs, and the sigmoid loss is
    far from its value at the start."""
    c = logps["policy"][:, 0] - logps["other"][:, 0]
    r = logps["policy"][:, 1] - logps["other"][:, 1]
    h = c - r
    assert h.abs().min() > 0.04 and h.abs().max() > 1.0
    assert (h > 0).any() and (h < 0).any()
    assert abs(expected_loss(CASES["sigmoid"], logps) - math.log(2)) > 1e-2
    # hinge with b = 1: some pairs are past the margin (loss 0), some are not
    assert (h > 1).any() and (h < 1).any()


@pytest.mark.parametrize("case", sorted(CASES))
def test_step_one_loss_with_a_different_reference_matches_the_paper(
    tmp_path, dpo_config, pairs_file, other_model_dir, logps, case
):
    """lr 0: the logged step-1 loss is the loss of the starting policy against the seed-1
    reference, which is the paper's formula on the independent log-probs. (SimPO has no
    reference, and a config that gives it one is refused.)"""
    objective = CASES[case]
    reference = {} if objective["loss_type"] == "simpo" else {"path": str(other_model_dir)}
    cfg = dpo_config(tmp_path, pairs_file, {**objective, "reference": reference})
    (record,) = run_metrics(cfg)
    assert record["loss"] == pytest.approx(expected_loss(objective, logps), **LOSS_TOLERANCE)


def test_logged_rewards_and_log_probs_are_the_papers_implicit_rewards(
    tmp_path, dpo_config, pairs_file, other_model_dir, logps
):
    """rewards/chosen = mean_p b (pi_c - ref_c), likewise rejected, margins their
    difference, accuracies the fraction of pairs whose chosen reward is the larger, and
    logps/* the policy's summed log-probs (DPO paper, Sec. 5; TRL's metric names)."""
    beta = 0.5
    cfg = dpo_config(
        tmp_path,
        pairs_file,
        {"beta": beta, "reference": {"path": str(other_model_dir)}},
    )
    (record,) = run_metrics(cfg)
    pi, ref = logps["policy"], logps["other"]
    chosen, rejected = beta * (pi[:, 0] - ref[:, 0]), beta * (pi[:, 1] - ref[:, 1])
    assert record["rewards/chosen"] == pytest.approx(chosen.mean().item(), abs=1e-5)
    assert record["rewards/rejected"] == pytest.approx(rejected.mean().item(), abs=1e-5)
    assert record["rewards/margins"] == pytest.approx((chosen - rejected).mean().item(), abs=1e-5)
    # 4 of the 8 pairs have the larger chosen reward (none within 0.02 of a tie)
    assert (chosen - rejected).abs().min() > 0.02
    assert record["rewards/accuracies"] == (chosen > rejected).double().mean().item() == 0.5
    assert record["logps/chosen"] == pytest.approx(pi[:, 0].mean().item(), abs=1e-5)
    assert record["logps/rejected"] == pytest.approx(pi[:, 1].mean().item(), abs=1e-5)


def test_bco_pair_shifts_by_the_mean_reward_of_the_steps_before(
    tmp_path, dpo_config, pairs_file, other_model_dir, logps
):
    """bco_pair's delta is, as documented, the mean of every chosen and rejected reward
    of the previous steps: 0 at step 1, and at step 2 (lr 0, the same 8 pairs again) the
    mean of the 16 rewards b c, b r of step 1."""
    objective = CASES["bco_pair"]
    cfg = dpo_config(
        tmp_path,
        pairs_file,
        {**objective, "reference": {"path": str(other_model_dir)}},
        max_steps=2,
    )
    first, second = run_metrics(cfg)
    rewards = objective["beta"] * (logps["policy"] - logps["other"])  # [P, 2]
    delta = rewards.mean().item()
    assert abs(delta) > 0.05  # far enough from 0 to tell the two steps apart
    assert first["loss"] == pytest.approx(expected_loss(objective, logps), **LOSS_TOLERANCE)
    assert second["loss"] == pytest.approx(
        expected_loss(objective, logps, delta=delta), **LOSS_TOLERANCE
    )


def test_precomputed_reference_gives_the_live_reference_loss(
    tmp_path, dpo_config, pairs_file, other_model_dir, logps
):
    """reference.precompute computes the reference's log-probs once, before training, and
    stores them in <run>/reference/; the step-1 loss is the one with the reference run
    live beside the policy, and the stored table is the reference's log-probs."""
    objective = {"loss_type": "sigmoid", "beta": 0.1}
    live, stored = (
        dpo_config(
            tmp_path / name,
            pairs_file,
            {**objective, "reference": {"path": str(other_model_dir), "precompute": precompute}},
        )
        for name, precompute in (("live", False), ("precompute", True))
    )
    (live_record,) = run_metrics(live)
    (stored_record,) = run_metrics(stored)
    assert stored_record["loss"] == pytest.approx(live_record["loss"], abs=1e-6)
    assert stored_record["loss"] == pytest.approx(expected_loss(objective, logps), abs=1e-6)

    reference = stored.run_dir / "reference"
    assert sorted(p.name for p in reference.iterdir()) == ["logps.npy", "meta.json"]
    table = np.load(reference / "logps.npy")  # [pairs, 2]: chosen, rejected, in file order
    np.testing.assert_allclose(table, logps["other"].numpy(), rtol=0, atol=1e-5)
    assert not (live.run_dir / "reference").exists()


@pytest.mark.parametrize(
    ("layout", "training", "data"),
    [
        ("8 pairs x 1", {"micro_batch_size": 8}, {}),
        ("1 pair x 8", {"micro_batch_size": 1}, {}),
        # rows of at most 20 tokens: most pairs' two sequences land in different rows
        ("8 pairs x 1, short rows", {"micro_batch_size": 8}, {"max_seq_length": 20}),
    ],
)
def test_step_one_loss_is_the_same_however_the_pairs_are_laid_out(
    tmp_path, dpo_config_dict, pairs_file, other_model_dir, logps, layout, training, data
):
    """A pair is one item: with one pair per micro-batch and 8 accumulation steps the
    chosen and rejected sequences of a pair are still scored together, and the step's
    loss is still the mean over its 8 pairs."""
    objective = CASES["sigmoid"]
    cfg_dict = dpo_config_dict(
        tmp_path,
        pairs_file,
        {**objective, "reference": {"path": str(other_model_dir)}},
        **training,
    )
    cfg_dict["data"].update(data)
    (record,) = run_metrics(TrainConfig.model_validate(cfg_dict))
    assert record["loss"] == pytest.approx(expected_loss(objective, logps), **LOSS_TOLERANCE)


def test_pairs_from_a_pt_data_dataset_directory_train_like_the_jsonl_file(
    tmp_path, dpo_config, other_model_dir, logps
):
    """data.path may be a pt-data dataset directory (<dir>/train/part-*.parquet) of the
    same tokenized pairs: the step-1 loss is the same paper value."""
    dataset = tmp_path / "dataset"
    write_rows(dataset / "train" / "part-00000.parquet", preference_pairs())
    objective = CASES["sigmoid"]
    cfg = dpo_config(
        tmp_path / "runs",
        dataset,
        {**objective, "reference": {"path": str(other_model_dir)}},
    )
    (record,) = run_metrics(cfg)
    assert record["loss"] == pytest.approx(expected_loss(objective, logps), **LOSS_TOLERANCE)


def test_eight_micro_batches_of_one_pair_train_like_one_of_eight(
    tmp_path, dpo_config, other_model_dir
):
    """The step's loss is the mean over all its pairs whatever the split, so 1 x 8 and
    8 x 1 give the same losses and weights after 3 steps of lr 1e-3 (16 pairs, shuffled).
    Tolerances as for SFT (test_pt_train_math): the two layouts add the same float32 terms
    in another order (~1e-7 relative on the gradients); AdamW divides each update by
    sqrt(v), which for weights whose gradient is near 0 makes that rounding up to a few
    percent of one lr-1e-3 step."""
    data = write_rows(tmp_path / "pairs16.jsonl", preference_pairs(16, seed=1))
    runs = {}
    for micro in (8, 1):
        cfg = dpo_config(
            tmp_path / f"micro{micro}",
            data,
            {"loss_type": ["sigmoid", "bco_pair"], "beta": 0.5,
             "reference": {"path": str(other_model_dir)}},
            learning_rate=1e-3, micro_batch_size=micro, max_steps=3,
        )  # fmt: skip
        losses = [r["loss"] for r in run_metrics(cfg)]
        runs[micro] = losses, load_file(cfg.run_dir / "inference" / "step-3" / "model.safetensors")
    (loss_8, weights_8), (loss_1, weights_1) = runs[8], runs[1]
    assert loss_8[0] != pytest.approx(loss_8[2], abs=1e-3)  # the policy did move
    assert loss_1 == pytest.approx(loss_8, abs=1e-5)
    for name, w in weights_8.items():
        torch.testing.assert_close(weights_1[name], w, atol=5e-5, rtol=0)


# --------------------------------------------------------------------------- `pt-train run`

CLI_STEPS = 12


def pt_train(*args, stdin=None):
    """`pt-train ARGS` in its own process group (so that a hung job can be killed whole)."""
    bindir = os.path.dirname(sys.executable)
    return subprocess.Popen(
        [os.path.join(bindir, "pt-train"), *map(str, args)],
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
    )


def finish(proc, timeout=600):
    """Wait for ``proc``; past ``timeout`` kill its whole process group and fail."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"pt-train did not finish in {timeout} s; stderr ends:\n{err[-3000:]}")
    return proc.returncode, out, err


def stop_after(proc, metrics, steps: int) -> None:
    """SIGTERM ``proc`` once ``metrics`` has ``steps`` lines; it must exit with the
    requeue code after saving a checkpoint."""
    from pt_core.contracts import REQUEUE_EXIT_CODE

    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    code, _, err = finish(proc)
    assert code == REQUEUE_EXIT_CODE, err


def cli_losses(run_dir) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir)]


def cli_weights(run_dir, step: int = CLI_STEPS) -> dict:
    return load_file(run_dir / "inference" / f"step-{step}" / "model.safetensors")


@pytest.fixture(scope="module")
def cli_workdir(tmp_path_factory, dpo_config_dict, other_model_dir):
    """16 pairs, a seed-1 reference of its own (so that a test may take it away), and a
    config: [sigmoid, bco_pair] (bco_pair's running mean is state that a resume must
    restore), cosine schedule with warm-up, 4 pairs a step in micro-batches of 2."""
    root = tmp_path_factory.mktemp("dpo-cli")
    data = write_rows(root / "pairs.jsonl", preference_pairs(16, seed=1))
    for name in ("reference", "reference-for-precompute"):
        shutil.copytree(other_model_dir, root / name)
    config = dpo_config_dict(
        root / "runs",
        data,
        {"loss_type": ["sigmoid", "bco_pair"], "loss_weights": [1.0, 0.5], "beta": 0.5,
         "reference": {"path": str(root / "reference")}},
        learning_rate=1e-3, lr_schedule="cosine", warmup_steps=2, min_lr_ratio=0.1,
        global_batch_size=4, micro_batch_size=2, max_steps=CLI_STEPS, save_steps=4,
    )  # fmt: skip
    (root / "dpo.yaml").write_text(yaml.safe_dump(config))
    precompute = {
        **config["objective"],
        "reference": {"path": str(root / "reference-for-precompute"), "precompute": True},
    }
    (root / "dpo-precompute.yaml").write_text(yaml.safe_dump({**config, "objective": precompute}))
    return root


@pytest.fixture(scope="module")
def uninterrupted(cli_workdir):
    code, out, err = finish(pt_train("run", cli_workdir / "dpo.yaml", "run_name=uninterrupted"))
    assert code == 0, err
    assert json.loads(out)["objective"] == "dpo"
    return cli_workdir / "runs" / "uninterrupted"


@pytest.fixture(scope="module")
def uninterrupted_precompute(cli_workdir):
    config = cli_workdir / "dpo-precompute.yaml"
    code, out, err = finish(pt_train("run", config, "run_name=uninterrupted-precompute"))
    assert code == 0, err
    return cli_workdir / "runs" / "uninterrupted-precompute"


@pytest.mark.slow
def test_dpo_sigterm_then_rerun_ends_bit_exact(cli_workdir, uninterrupted):
    """Stopped by SIGTERM after a few steps and run again, a DPO run ends with the loss
    curve and weights of the uninterrupted run, bit for bit (model, optimizer, data
    position, learning rate and bco_pair's running mean all restored)."""
    run_dir = cli_workdir / "runs" / "sigterm"
    args = ("run", cli_workdir / "dpo.yaml", "run_name=sigterm")
    stop_after(pt_train(*args), run_dir / "metrics.jsonl", 3)
    stopped_at = int((run_dir / "checkpoints" / "latest").read_text().strip().split("-")[1])
    assert 3 <= stopped_at < CLI_STEPS, "the signal should land mid-run"
    code, out, err = finish(pt_train(*args))
    assert code == 0, err
    assert json.loads(out)["step"] == CLI_STEPS
    assert cli_losses(run_dir) == cli_losses(uninterrupted)
    ref, got = cli_weights(uninterrupted), cli_weights(run_dir)
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)


@pytest.mark.slow
def test_precomputed_reference_is_not_loaded_again_on_resume(
    cli_workdir, uninterrupted, uninterrupted_precompute
):
    """With reference.precompute the reference's log-probs are computed once into
    <run>/reference/ (logps.npy and meta.json, the per-chunk parts removed). A resumed run
    reads them: it still finishes, bit-exact, after the reference model directory is
    gone. Live and precomputed references give the same step-1 loss."""
    assert cli_losses(uninterrupted_precompute)[0] == pytest.approx(
        cli_losses(uninterrupted)[0], abs=1e-6
    )
    run_dir = cli_workdir / "runs" / "precompute-sigterm"
    args = ("run", cli_workdir / "dpo-precompute.yaml", "run_name=precompute-sigterm")
    stop_after(pt_train(*args), run_dir / "metrics.jsonl", 3)
    assert sorted(p.name for p in (run_dir / "reference").iterdir()) == [
        "logps.npy",
        "meta.json",
    ]
    reference_model = cli_workdir / "reference-for-precompute"
    shutil.rmtree(reference_model)
    code, out, err = finish(pt_train(*args))
    assert code == 0, err
    assert cli_losses(run_dir) == cli_losses(uninterrupted_precompute)
    ref, got = cli_weights(uninterrupted_precompute), cli_weights(run_dir)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


@pytest.mark.slow
def test_two_ranks_zero3_train_like_one_rank(cli_workdir, uninterrupted):
    """2 ranks under ZeRO-3, one pair per micro-batch: each rank scores whole pairs, the
    step's loss is the mean over the 4 pairs of both ranks, and the reference is
    partitioned like the policy. Losses agree to 1e-5 and weights after 12 steps to 5e-5
    (float32 sums in another order, amplified by AdamW as in the accumulation test;
    measured 1.7e-5 after 6 steps)."""
    code, out, err = finish(
        pt_train(
            "run",
            cli_workdir / "dpo.yaml",
            "run_name=zero3",
            "launcher.nproc=2",
            "deepspeed.zero_stage=3",
            "training.micro_batch_size=1",
        )  # fmt: skip
    )
    assert code == 0, err
    run_dir = cli_workdir / "runs" / "zero3"
    assert cli_losses(run_dir) == pytest.approx(cli_losses(uninterrupted), abs=1e-5)
    ref, got = cli_weights(uninterrupted), cli_weights(run_dir)
    for name, w in ref.items():
        torch.testing.assert_close(got[name], w, atol=5e-5, rtol=0)


@pytest.mark.slow
def test_two_ranks_zero3_with_a_precomputed_reference_finish(cli_workdir, uninterrupted_precompute):
    """Precomputing under ZeRO-3 on 2 ranks: the reference is partitioned over the ranks,
    so every forward pass of it is a collective. The run must finish (a one-rank run of
    this config takes seconds) and give the one-rank step-1 loss."""
    config = cli_workdir / "dpo-precompute.yaml"
    shutil.copytree(cli_workdir / "reference", cli_workdir / "reference-zero3")
    code, out, err = finish(
        pt_train(
            "run", config, "run_name=zero3-precompute", "launcher.nproc=2",
            "deepspeed.zero_stage=3", "training.micro_batch_size=1", "training.max_steps=2",
            f"objective.reference.path={cli_workdir / 'reference-zero3'}",
        ),
        timeout=300,
    )  # fmt: skip
    assert code == 0, err
    first = cli_losses(cli_workdir / "runs" / "zero3-precompute")[0]
    assert first == pytest.approx(cli_losses(uninterrupted_precompute)[0], abs=1e-6)


# --------------------------------------------------------------------------- bad input


def sft_rows_file(root):
    rows = [{"input_ids": [5, 6, 7, 8, 9, 10], "labels": [-100, -100, 7, 8, 9, 10]}] * 4
    return write_rows(root / "sft.jsonl", rows)


def short_labels_file(root):
    """Pairs whose first row has one chosen label fewer than chosen tokens."""
    rows = preference_pairs(4)
    rows[0]["chosen_labels"] = rows[0]["chosen_labels"][:-1]
    return write_rows(root / "short-labels.jsonl", rows)


# case -> (change to the config, the data file it needs or None, words the error must hold)
BAD_INPUT = {
    "dpo on sft rows": ({}, sft_rows_file, ["sft.jsonl", "preference pairs"]),
    "sft on pair rows": ({"objective": {"name": "sft"}}, None, ["pairs.jsonl", "objective.name=dpo"]),
    "loss_weights of the wrong length": (
        {"objective": {"name": "dpo", "loss_type": ["sigmoid", "ipo"], "loss_weights": [1.0]}},
        None,
        ["loss_weights has 1 values for 2 loss types"],
    ),
    "label_smoothing with hinge": (
        {"objective": {"name": "dpo", "loss_type": "hinge", "label_smoothing": 0.1}},
        None,
        ["label_smoothing", "hinge"],
    ),
    "unknown loss_type": (
        {"objective": {"name": "dpo", "loss_type": "sigmod"}}, None, ["loss_type", "'sigmoid'"]
    ),
    "unknown objective": ({"objective": {"name": "ppo"}}, None, ["'ppo'", "'dpo'"]),
    "asft with a precomputed reference": (
        {"objective": {"name": "asft", "reference": {"precompute": True}}}, None, ["precompute"]
    ),
    "pair labels of the wrong length": ({}, short_labels_file, ["row 1", "chosen_labels"]),
    "training.loss and objective both": (
        {"training": {"loss": "dft"}}, None, ["training.loss", "objective"]
    ),
}  # fmt: skip


def error_report(stderr: str) -> list[str]:
    """The lines from the ``error:`` line to the end of stderr."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert len(starts) == 1, stderr
    return lines[starts[0] :]


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_exits_2_with_one_clear_error(tmp_path, cli_workdir, case, pt_train_in_process):
    """Each mistake is reported by `pt-train run` as one `error:` line (and at most one
    `fix:` line after it) that names what is wrong, exit code 2, no traceback."""
    change, make_data, words = BAD_INPUT[case]
    config = yaml.safe_load((cli_workdir / "dpo.yaml").read_text())
    config["output_dir"] = str(tmp_path / "runs")
    config["data"]["path"] = str(make_data(tmp_path) if make_data else cli_workdir / "pairs.jsonl")
    for section, value in change.items():
        config[section] = value if section == "objective" else {**config[section], **value}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    code, out, err = pt_train_in_process("run", tmp_path / "bad.yaml")
    assert code == 2, err
    assert out == "" and "Traceback" not in err
    report = error_report(err)
    assert len(report) == 1 or (len(report) == 2 and report[1].startswith("  fix:")), report
    for word in words:
        assert word in " ".join(report), (word, report)


def test_bad_data_leaves_no_run_directory(tmp_path, cli_workdir, pt_train_in_process):
    """Bad input writes nothing (the project's rule: no half-written outputs): a DPO run
    pointed at SFT rows stops with exit 2 before the run directory exists."""
    config = yaml.safe_load((cli_workdir / "dpo.yaml").read_text())
    config["output_dir"] = str(tmp_path / "runs")
    config["data"]["path"] = str(sft_rows_file(tmp_path))
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    code, _, err = pt_train_in_process("run", tmp_path / "bad.yaml")
    assert code == 2, err
    assert not (tmp_path / "runs").exists(), sorted(
        str(p.relative_to(tmp_path)) for p in (tmp_path / "runs").rglob("*")
    )


@pytest.mark.slow
def test_the_old_training_loss_key_still_trains_that_objective(
    tmp_path, dpo_config_dict, cli_workdir
):
    """`training.loss: dft` (the key before objectives were sections) is read as
    `objective: {name: dft}`, with a warning that names the new key: the run trains DFT,
    says so in its manifest and frozen config, and logs the losses of an
    `objective: {name: dft}` run."""
    rows = [{"input_ids": list(range(5 + i, 25 + i)), "labels": [-100] * 4 + list(range(9 + i, 25 + i))} for i in range(8)]  # fmt: skip
    data = write_rows(tmp_path / "rows.jsonl", rows)
    old = dpo_config_dict(tmp_path / "runs", data, {}, learning_rate=1e-3, max_steps=2)
    del old["objective"]
    old["training"]["loss"] = "dft"
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old))
    code, out, err = finish(pt_train("run", tmp_path / "old.yaml", "run_name=old"))
    assert code == 0, err
    assert json.loads(out)["objective"] == "dft"
    assert "objective.name=dft" in " ".join(err.split())
    frozen = yaml.safe_load((tmp_path / "runs" / "old" / "config.yaml").read_text())
    assert frozen["objective"] == {"name": "dft"} and "loss" not in frozen["training"]

    new = {**old, "run_name": "new", "objective": {"name": "dft"}}
    new["training"] = {k: v for k, v in old["training"].items() if k != "loss"}
    train(TrainConfig.model_validate(new))
    assert cli_losses(tmp_path / "runs" / "old") == cli_losses(tmp_path / "runs" / "new")
