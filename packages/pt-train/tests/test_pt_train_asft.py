"""ASFT (Zhu et al. 2025, "Anchored Supervised Fine-Tuning", arXiv:2509.23753): DFT's
loss plus kl_coef x a token-level KL to a frozen reference, trained by the real trainer
and checked against full-vocabulary log-probs computed here with plain ``transformers``
forward passes in float64.

Per trained token t, with p the policy's and r the reference's next-token distribution:

    loss_t = -sg(p(y_t)) log p(y_t) + kl_coef * KL_t
    KL_t = KL(r || p) = sum_v r(v) (log r(v) - log p(v))    kl_direction: forward
    KL_t = KL(p || r) = sum_v p(v) (log p(v) - log r(v))    kl_direction: reverse

and the step's loss is the mean over its trained tokens. (The authors' code,
github.com/zhuchichi56/ASFT train.py, computes ``F.kl_div(log_softmax(policy),
softmax(reference))``, i.e. KL(r || p), averaged with the DFT term over the valid tokens.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from pt_core.files import write_rows
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train


def token_rows(n: int = 8, seed: int = 0) -> list[dict]:
    """Tokenized rows of 12-30 tokens whose first 3-7 tokens (the prompt) are not trained."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        length = int(torch.randint(12, 30, (1,), generator=g))
        ids = torch.randint(5, 300, (length,), generator=g).tolist()
        prompt = 3 + i % 5
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    return write_rows(tmp_path_factory.mktemp("rows") / "rows.jsonl", token_rows())


@pytest.fixture(scope="module")
def sharp_reference_dir(tmp_path_factory, tiny_tokenizer):
    """A reference far from the policy: the tiny Llama with seed 1 and its output layer
    scaled by 10, so its next-token distributions are peaked where the policy's are
    nearly uniform, and KL(r || p) and KL(p || r) differ clearly."""
    from pt_train.model import build_llama

    out = tmp_path_factory.mktemp("sharp-reference")
    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    model.save_pretrained(str(out))
    tiny_tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def run(tiny_run_config):
    """``run(output_dir, data_path, objective, **training)``: train the tiny Llama (see
    ``tiny_run_config``); return (metrics records, final weights)."""

    def train_and_read(output_dir, data_path, objective: dict, **training):
        cfg = TrainConfig.model_validate(
            tiny_run_config(output_dir, data_path, objective, **training)
        )
        result = train(cfg)
        path = cfg.run_dir / "inference" / f"step-{result.step}" / "model.safetensors"
        return read_metrics(cfg.run_dir), load_file(path)

    return train_and_read


# --------------------------------------------------------------------------- independent side


def full_logps(model_dir, rows) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, V] float64 log-probs at every trained position of ``rows`` (row by row, in
    order) and [N] the trained target ids, from one plain forward pass per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    logps, targets = [], []
    with torch.no_grad():
        for row in rows:
            ids, labels = row["input_ids"], row["labels"]
            logits = model(input_ids=torch.tensor([ids])).logits[0]
            logp = torch.log_softmax(logits[:-1].double(), dim=-1)  # t predicts t + 1
            trained = [t for t in range(len(ids) - 1) if labels[t + 1] != -100]
            logps.append(logp[trained])
            targets += [ids[t + 1] for t in trained]
    return torch.cat(logps), torch.tensor(targets)


@pytest.fixture(scope="module")
def distributions(tiny_model_dir, sharp_reference_dir):
    rows = token_rows()
    policy, targets = full_logps(tiny_model_dir, rows)
    reference, _ = full_logps(sharp_reference_dir, rows)
    return {"policy": policy, "reference": reference, "targets": targets}


def dft_terms(policy: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[N] -p(y_t) log p(y_t) (Wu et al. 2025, Eq. 9; sg() changes only the gradient)."""
    logp = policy.gather(1, targets[:, None])[:, 0]
    return -logp.exp() * logp


def kl_terms(policy: torch.Tensor, reference: torch.Tensor, direction: str) -> torch.Tensor:
    p, r = policy.exp(), reference.exp()
    if direction == "forward":  # KL(r || p)
        return (r * (reference - policy)).sum(-1)
    return (p * (policy - reference)).sum(-1)  # KL(p || r)


# --------------------------------------------------------------------------- tests


def test_asft_with_kl_coef_zero_is_dft_bit_for_bit(tmp_path, run, rows_file):
    """kl_coef 0 removes the anchor: 3 steps of lr 1e-3 give DFT's losses and weights
    exactly (the reference is not even loaded)."""
    training = {"learning_rate": 1e-3, "micro_batch_size": 4, "max_steps": 3}
    dft, dft_weights = run(tmp_path / "dft", rows_file, {"name": "dft"}, **training)
    asft, asft_weights = run(
        tmp_path / "asft", rows_file,
        {"name": "asft", "kl_coef": 0.0}, **training,
    )  # fmt: skip
    assert [r["loss"] for r in asft] == [r["loss"] for r in dft]
    assert dft[0]["loss"] != pytest.approx(dft[2]["loss"], abs=1e-4)  # the model did move
    assert asft_weights.keys() == dft_weights.keys()
    assert all(torch.equal(asft_weights[k], dft_weights[k]) for k in dft_weights)


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_asft_anchor_is_zero_when_the_reference_is_the_policy_start(
    tmp_path, run, rows_file, direction
):
    """With no reference path the anchor is the policy's own starting weights, so at
    step 1 p = r at every position: KL is 0 in either direction and the loss is DFT's."""
    (dft,), _ = run(tmp_path / "dft", rows_file, {"name": "dft"})
    (asft,), _ = run(
        tmp_path / "asft", rows_file,
        {"name": "asft", "kl_coef": 1.0, "kl_direction": direction},
    )  # fmt: skip
    assert asft["kl"] == pytest.approx(0.0, abs=1e-7)
    assert asft["loss"] == pytest.approx(dft["loss"], abs=1e-7)


def test_the_sharp_reference_tells_the_kl_directions_apart(distributions):
    """The data of the next test are worth something only if the two directions (and the
    KL and DFT terms) differ far beyond its 1e-5 tolerance."""
    policy, reference = distributions["policy"], distributions["reference"]
    forward = kl_terms(policy, reference, "forward").mean().item()
    reverse = kl_terms(policy, reference, "reverse").mean().item()
    assert forward > 0.1 and reverse > 0.1
    assert abs(forward - reverse) > 0.1


@pytest.mark.parametrize("direction", ["forward", "reverse"])
def test_asft_step_one_loss_matches_the_independent_computation(
    tmp_path, run, rows_file, sharp_reference_dir, distributions, direction
):
    """lr 0: the step-1 loss is mean_t [-p(y_t) log p(y_t) + kl_coef KL_t] over the 8 rows'
    trained tokens, and the logged kl is mean_t KL_t, from full float64 logits."""
    kl_coef = 0.3
    (record,), _ = run(
        tmp_path, rows_file,
        {"name": "asft", "kl_coef": kl_coef, "kl_direction": direction,
         "reference": {"path": str(sharp_reference_dir)}},
    )  # fmt: skip
    policy, reference = distributions["policy"], distributions["reference"]
    kl = kl_terms(policy, reference, direction)
    expected = (dft_terms(policy, distributions["targets"]) + kl_coef * kl).mean().item()
    assert record["kl"] == pytest.approx(kl.mean().item(), abs=1e-5)
    assert record["loss"] == pytest.approx(expected, abs=1e-5)
    assert record["ce_loss"] == pytest.approx(
        -policy.gather(1, distributions["targets"][:, None]).mean().item(), abs=1e-5
    )


def test_asft_eight_micro_batches_of_one_row_train_like_one_of_eight(
    tmp_path, run, rows_file, sharp_reference_dir
):
    """The anchor is a sum over trained tokens like the DFT term, normalised by the step's
    trained tokens, so 1 x 8 and 8 x 1 give the same losses and weights after 3 steps of
    lr 1e-3 (tolerances as for SFT in test_pt_train_math: float32 order, AdamW)."""
    objective = {"name": "asft", "kl_coef": 0.3, "reference": {"path": str(sharp_reference_dir)}}
    runs = {
        micro: run(
            tmp_path / f"micro{micro}",
            rows_file,
            objective,
            learning_rate=1e-3,
            micro_batch_size=micro,
            max_steps=3,
        )  # fmt: skip
        for micro in (8, 1)
    }
    (records_8, weights_8), (records_1, weights_1) = runs[8], runs[1]
    losses_8 = [r["loss"] for r in records_8]
    assert losses_8[0] != pytest.approx(losses_8[2], abs=1e-3)
    assert [r["loss"] for r in records_1] == pytest.approx(losses_8, abs=1e-5)
    for name, w in weights_8.items():
        torch.testing.assert_close(weights_1[name], w, atol=5e-5, rtol=0)


@pytest.mark.slow
def test_asft_on_two_ranks_zero3_trains_like_one_rank(
    tmp_path, run, tiny_run_config, rows_file, sharp_reference_dir
):
    """Under ZeRO-3 the reference is partitioned over the ranks and its LM head is applied
    inside the policy's chunked head (and again when the chunk is recomputed in the
    backward pass). 2 ranks must give the one-rank losses (1e-5) and weights (5e-5)."""
    import yaml

    objective = {"name": "asft", "kl_coef": 0.3, "reference": {"path": str(sharp_reference_dir)}}
    config = tiny_run_config(
        tmp_path / "runs", rows_file, objective,
        learning_rate=1e-3, micro_batch_size=4, max_steps=3,
    )  # fmt: skip
    (tmp_path / "asft.yaml").write_text(yaml.safe_dump(config))
    # The 2-rank job first: train() in this process would leave it RANK/WORLD_SIZE to
    # inherit (test_pt_train_in_process.py).
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "pt-train"), "run",
         str(tmp_path / "asft.yaml"), "launcher.nproc=2", "deepspeed.zero_stage=3",
         "training.micro_batch_size=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
    )  # fmt: skip
    try:
        _, err = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"2-rank ASFT did not finish in 400 s; stderr ends:\n{err[-3000:]}")
    assert proc.returncode == 0, err
    one, one_weights = run(
        tmp_path / "one", rows_file, objective,
        learning_rate=1e-3, micro_batch_size=4, max_steps=3,
    )  # fmt: skip
    run_dir = tmp_path / "runs" / "run"
    assert [r["loss"] for r in read_metrics(run_dir)] == pytest.approx(
        [r["loss"] for r in one], abs=1e-5
    )
    weights = load_file(run_dir / "inference" / "step-3" / "model.safetensors")
    for name, w in one_weights.items():
        torch.testing.assert_close(weights[name], w, atol=5e-5, rtol=0)
