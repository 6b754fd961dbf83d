"""GRPO/DAPO's advantages and policy loss, against values and gradients worked out here,
and a GRPO run on the online loop."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_train.objectives.grpo import (
    aggregate,
    group_advantages,
    kl_penalty,
    overlong_penalty,
    policy_loss,
    rollout_kl,
)


def _two_sequences():
    """Two completions of 3 and 2 tokens, sequence ids per token."""
    token_sequence = torch.tensor([0, 0, 0, 1, 1])
    return token_sequence, 2


def test_advantages_are_group_normalised_and_zero_for_equal_rewards():
    rewards = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = np.array(["a", "a", "a", "a", "b", "b"])
    adv, equal = group_advantages(rewards, groups, "group")
    r = rewards[:4]
    expected = (r - r.mean()) / (r.std(ddof=1) + 1e-4)  # mean 0.5, unbiased std 0.577
    np.testing.assert_allclose(adv[:4], expected)
    assert adv[4:].tolist() == [0.0, 0.0] and equal.tolist() == [False] * 4 + [True, True]
    none, _ = group_advantages(rewards, groups, "none")
    np.testing.assert_allclose(none[:4], r - 0.5)
    batch, _ = group_advantages(rewards, groups, "batch")
    np.testing.assert_allclose(batch[:4], (r - 0.5) / (rewards.std(ddof=1) + 1e-4))


def test_overlong_shaping_ramps_over_the_last_buffer_tokens():
    # L_max 100, buffer 20: no penalty up to 80 tokens, half at 90, all at 100
    np.testing.assert_allclose(
        overlong_penalty(np.array([50, 80, 90, 100]), 100, 20, 1.0), [0, 0, -0.5, -1.0]
    )


def test_on_policy_grpo_loss_is_zero_and_its_gradient_is_reinforce():
    """r = 1 at the current weights: the loss value is -(1/B) sum_i A_i = 0 (advantages of a
    group sum to 0), and the gradient is -(1/B) sum_i A_i / |o_i| sum_t grad log pi."""
    token_sequence, sequences = _two_sequences()
    logits = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([1, 4, 2, 6, 0])
    logps = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    advantages = torch.tensor([0.7, -0.7], dtype=torch.float64)
    per_token, _ = policy_loss(
        logps, logps.detach(), advantages, token_sequence, sequences,
        epsilon_low=0.2, epsilon_high=0.2,
    )  # fmt: skip
    total, count = aggregate(per_token, token_sequence, sequences, "grpo", max_tokens=10)
    assert count == 2.0 and (total / count).item() == pytest.approx(0.0, abs=1e-12)
    (grad,) = torch.autograd.grad(total / count, logits, retain_graph=True)
    reinforce = -(0.7 / 3 * logps[:3].sum() - 0.7 / 2 * logps[3:].sum()) / 2
    (want,) = torch.autograd.grad(reinforce, logits)
    torch.testing.assert_close(grad, want)


def test_dapo_divides_by_tokens_and_dr_grpo_by_sequences_times_max_tokens():
    token_sequence, sequences = _two_sequences()
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    assert aggregate(per_token, token_sequence, sequences, "dapo", 10) == (15.0, 5.0)
    assert aggregate(per_token, token_sequence, sequences, "dr_grpo", 10)[1] == 20.0
    total, count = aggregate(per_token, token_sequence, sequences, "grpo", 10)
    assert (total.item(), count) == (pytest.approx(2.0 + 4.5), 2.0)  # token means 2 and 4.5


@pytest.mark.parametrize(
    ("log_ratio", "advantage", "gradient"),
    [
        (np.log(1.5), 1.0, False),  # r > 1 + eps_high with A > 0: clipped, no gradient
        (np.log(0.5), -1.0, False),  # r < 1 - eps_low with A < 0: clipped, no gradient
        (np.log(1.1), 1.0, True),  # inside the trust region
        (np.log(0.5), 1.0, True),  # r < 1 - eps with A > 0: min takes the unclipped term
    ],
)
def test_clipping_zeroes_the_gradient_outside_the_trust_region(log_ratio, advantage, gradient):
    logp = torch.tensor([-1.0], dtype=torch.float64, requires_grad=True)
    old = logp.detach() - log_ratio
    loss, metrics = policy_loss(
        logp, old, torch.tensor([advantage], dtype=torch.float64), torch.tensor([0]), 1,
        epsilon_low=0.2, epsilon_high=0.28,
    )  # fmt: skip
    (g,) = torch.autograd.grad(loss.sum(), logp)
    assert (g.item() != 0.0) == gradient


def test_equal_rewards_give_zero_gradient():
    logits = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    logps = torch.log_softmax(logits, -1)[:, 0]
    adv, _ = group_advantages(np.array([1.0, 1.0]), np.array(["g", "g"]))
    loss, _ = policy_loss(
        logps, logps.detach(), torch.tensor(adv), torch.tensor([0, 0, 1]), 2,
        epsilon_low=0.2, epsilon_high=0.2,
    )  # fmt: skip
    (g,) = torch.autograd.grad(loss.sum(), logits)
    assert torch.count_nonzero(g) == 0


def test_dual_clip_bounds_the_loss_of_negative_advantages():
    # r = 5 with A = -1: the surrogate loss 5 is capped at dual_clip * |A| = 3
    logp = torch.tensor([0.0], dtype=torch.float64)
    loss, _ = policy_loss(
        logp, logp - np.log(5.0), torch.tensor([-1.0], dtype=torch.float64), torch.tensor([0]), 1,
        epsilon_low=0.2, epsilon_high=0.2, dual_clip=3.0,
    )  # fmt: skip
    assert loss.item() == pytest.approx(3.0)


def test_k3_and_k1_estimators():
    logp, ref = torch.tensor([np.log(0.5)]), torch.tensor([np.log(0.25)])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(np.log(2))
    # k3 = r - log r - 1 with r = ref / pi = 0.5
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - np.log(0.5) - 1)


def test_rollout_kl_keeps_a_difference_at_rounding_level():
    """k3 of trainer and generator log-probs that differ by 3e-7 (float32, as a vLLM
    generator's and the trainer's do when they agree): about d**2/2 = 4.5e-14, not the 0 or
    the noise of exp(d) - d - 1 in float32; and the exact value for a large difference."""
    old = torch.tensor([-2.0, -0.5], dtype=torch.float32)
    rollout = old - torch.tensor([3e-7, -3e-7], dtype=torch.float32)
    d = old.double() - rollout.double()  # the float32 values' exact difference
    got = rollout_kl(old, rollout)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, d**2 / 2 + d**3 / 6, rtol=1e-6, atol=0)
    assert (got > 1e-14).all()
    naive = torch.exp(d.float()) - d.float() - 1  # what float32 gave
    assert not torch.allclose(naive.double(), got, rtol=0.5, atol=0)
    big = rollout_kl(torch.tensor([-1.0]), torch.tensor([-3.0]))
    assert big.item() == pytest.approx(math.exp(2.0) - 2.0 - 1.0, rel=1e-12)


def test_sequence_level_ratio_is_the_geometric_mean_of_token_ratios():
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    old = logp - torch.tensor([0.1, 0.3, -0.1], dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    loss, _ = policy_loss(
        logp, old, adv, torch.tensor([0, 0, 0]), 1, epsilon_low=0.5, epsilon_high=0.5,
        ratio_level="sequence",
    )  # fmt: skip
    ratio = np.exp((0.1 + 0.3 - 0.1) / 3)
    np.testing.assert_allclose(loss.numpy(), [-ratio] * 3)


# --------------------------------------------------------------------------- on the loop


@pytest.fixture(scope="module")
def grpo_world(tmp_path_factory, tiny_tokenizer):
    from pt_train.model import build_llama

    root = tmp_path_factory.mktemp("grpo")
    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.save_pretrained(root / "policy")
    tiny_tokenizer.save_pretrained(root / "policy")
    with open(root / "prompts.jsonl", "w") as fh:
        for i in range(10):
            fh.write(json.dumps({"id": i, "prompt": f"{i} + {i} =", "answer": str(2 * i)}) + "\n")
    (root / "lengthreward.py").write_text(
        "def reward(rows):\n"
        "    # a reward the untrained model can earn: short completions\n"
        "    return [1.0 if len(r['completion_token_ids']) < 8 else 0.0 for r in rows]\n"
    )
    return root


def grpo_config(root, name, steps=4):
    return {
        "run_name": name,
        "output_dir": str(root / "runs"),
        "model": {"name_or_path": str(root / "policy")},
        "objective": {"name": "grpo"},
        "reward": {"function": "lengthreward:reward"},
        "rollout": {
            "prompts": str(root / "prompts.jsonl"),
            "samples_per_prompt": 4,
            "max_tokens": 10,
            "updates_per_round": 2,
            # the trainer must take log-probs at the sampling temperature too (rollout_kl ~ 0)
            "temperature": 0.7,
        },
        "training": {
            "seed": 0,
            "learning_rate": 2e-3,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": steps,
        },
    }


def pt_train_run(root, name: str, config: dict) -> subprocess.CompletedProcess:
    """``pt-train run`` of ``config`` written to ``root/<name>.yaml``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    pt_train = os.path.join(os.path.dirname(sys.executable), "pt-train")
    return subprocess.run([pt_train, "run", path], capture_output=True, text=True, env=env)


def run_grpo(root, name: str, config: dict) -> Path:
    """A run of ``config`` that must succeed; its run directory."""
    done = pt_train_run(root, name, config)
    assert done.returncode == 0, done.stderr
    return root / "runs" / config["run_name"]


@pytest.mark.slow
def test_grpo_killed_mid_round_and_resumed_ends_with_the_uninterrupted_weights(grpo_world):
    """Two updates per round (the second uses the round's stored old log-probs); SIGTERM
    after step 3 (mid round 1) and a rerun end bit-identical to an uninterrupted run."""
    from safetensors.torch import load_file

    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(grpo_world)}
    paths = {}
    for name in ("reference", "resumed"):
        paths[name] = grpo_world / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(grpo_config(grpo_world, name, steps=6)))
    cmd = [os.path.join(bindir, "pt-train"), "run"]
    done = subprocess.run([*cmd, paths["reference"]], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    metrics = grpo_world / "runs" / "resumed" / "metrics.jsonl"
    proc = subprocess.Popen(
        [*cmd, paths["resumed"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    done = subprocess.run([*cmd, paths["resumed"]], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    runs = grpo_world / "runs"
    losses = [
        [json.loads(x)["loss"] for x in (runs / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("reference", "resumed")
    ]
    assert losses[0] == losses[1]
    a, b = (
        load_file(runs / n / "inference/step-6/model.safetensors") for n in ("reference", "resumed")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
    rounds = sorted((runs / "resumed" / "rounds").iterdir())
    assert (rounds[1] / "old-logps-rank0.pt").exists()
    records = [
        json.loads(x) for x in (runs / "reference" / "metrics.jsonl").read_text().splitlines()
    ]
    # the generator's log-probs (sampled at temperature 0.7) are the trainer's
    assert all(abs(r["rollout_kl"]) < 1e-6 for r in records)
    assert {"reward", "groups_all_equal", "entropy", "clip_low"} <= set(records[0])
    assert "accuracy" not in records[0]  # a reward function grades nothing


@pytest.mark.slow
def test_epochs_per_round_train_a_rounds_rows_again_against_its_starting_log_probs(grpo_world):
    """epochs_per_round=2: each round's rows are trained twice, in the same order (the
    same tokens, rewards and advantages at both steps), against the log-probs of the
    weights the round started from (kept in the round's directory); 8 steps are 4 rounds."""
    config = grpo_config(grpo_world, "epochs", steps=8)
    config["rollout"]["updates_per_round"] = 1
    config["rollout"]["epochs_per_round"] = 2
    run = run_grpo(grpo_world, "epochs", config)
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in records] == [0, 0, 1, 1, 2, 2, 3, 3]
    rounds = sorted((run / "rounds").iterdir())
    assert len(rounds) == 4
    assert all((d / "old-logps-rank0.pt").exists() for d in rounds)
    learned = 0
    for index, directory in enumerate(rounds):
        first, second = records[2 * index : 2 * index + 2]
        assert first["tokens"] == second["tokens"]
        rows = [json.loads(x) for x in (directory / "rollouts.jsonl").read_text().splitlines()]
        if any(r["advantage"] != 0 for r in rows):
            learned += 1
            assert first["loss"] != second["loss"]  # the second pass sees updated weights
    assert learned > 0
    # the first pass is on-policy: its ratio is 1, nothing is clipped
    assert records[0]["clip_low"] == records[0]["clip_high"] == 0.0
    # the round's rows, advantages and old log-probs are those the trainer read
    rows = [json.loads(x) for x in (rounds[0] / "rollouts.jsonl").read_text().splitlines()]
    old = [t.tolist() for t in torch.load(rounds[0] / "old-logps-rank0.pt")]
    assert len(old) == len(rows) == 4
    assert [len(o) for o in old] == [len(r["completion_token_ids"]) for r in rows]
    np.testing.assert_allclose(
        [v for o in old for v in o], [v for r in rows for v in r["completion_logprobs"]],
        atol=1e-4,
    )  # fmt: skip


def test_max_steps_must_be_whole_rounds_of_updates_and_epochs(grpo_world):
    config = grpo_config(grpo_world, "bad-epochs", steps=5)
    config["rollout"]["updates_per_round"] = 1
    config["rollout"]["epochs_per_round"] = 2
    done = pt_train_run(grpo_world, "bad-epochs", config)
    assert done.returncode == 2
    assert "epochs_per_round=2" in done.stderr and "max_steps" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (grpo_world / "runs" / "bad-epochs" / "rounds").exists()


@pytest.mark.slow
def test_groups_trained_in_shared_prompt_rows_give_the_row_per_sample_run(grpo_world):
    """The same seeded rounds trained with each group's prompt held once in a row
    (data.shared_prompt, the default) and with a row per sample: the same rewards, losses
    and weights after 4 steps, to float32 rounding (the sums run in another order)."""
    from safetensors.torch import load_file

    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(grpo_world)}
    for name, shared in (("shared", True), ("per-sample", False)):
        config = grpo_config(grpo_world, name)
        config["training"]["micro_batch_size"] = 4  # a whole group in a micro-batch
        config["data"] = {"shared_prompt": shared}
        path = grpo_world / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        done = subprocess.run(
            [os.path.join(bindir, "pt-train"), "run", path], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
    runs = grpo_world / "runs"
    records = {
        n: [json.loads(x) for x in (runs / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("shared", "per-sample")
    }
    for a, b in zip(records["shared"], records["per-sample"], strict=True):
        assert a.get("reward") == b.get("reward")
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["tokens"] < b["tokens"]  # the prompt is held once per group
    a, b = (load_file(runs / n / "inference/step-4/model.safetensors") for n in records)
    lr = grpo_config(grpo_world, "x")["training"]["learning_rate"]
    for key in a:
        # Adam divides each update by the root of the gradient's second moment, so a weight
        # whose gradient is at rounding level moves by a fraction of the learning rate
        # either way: all but a few weights agree to rounding, those few to a part of lr.
        close = torch.isclose(a[key], b[key], atol=1e-5, rtol=1e-4)
        assert close.float().mean() > 0.999, key
        torch.testing.assert_close(a[key], b[key], atol=0.05 * lr, rtol=1e-4)


@pytest.mark.slow
def test_dynamic_sampling_trains_on_groups_whose_rewards_differ(grpo_world):
    """DAPO's dynamic sampling on the real loop: a round keeps the groups whose rewards
    differ and tops up with groups of further prompts (at most max_tries times); only what
    is still short is filled with all-equal groups, and the counts say so. sampled_reward
    is the mean over every sample the round drew, dropped groups too."""
    config = grpo_config(grpo_world, "dynamic", steps=6)
    config["objective"]["dynamic_sampling"] = {"enabled": True, "max_tries": 2}
    config["rollout"]["updates_per_round"] = 1
    rounds = sorted((run_grpo(grpo_world, "dynamic", config) / "rounds").iterdir())
    assert len(rounds) == 6
    topped_up = 0
    for directory in rounds:
        metrics = json.loads((directory / "meta.json").read_text())["metrics"]
        rows = [json.loads(x) for x in (directory / "rollouts.jsonl").read_text().splitlines()]
        groups: dict[str, list[dict]] = {}
        for row in rows:
            groups.setdefault(row["group"], []).append(row)
        assert len(rows) == 4 and all(len(g) == 4 for g in groups.values())
        equal = [g for g in groups.values() if len({r["reward"] for r in g}) == 1]
        assert all(g[0]["group_all_equal"] for g in equal)
        assert len(equal) == metrics["dynamic_sampling_short"]
        assert metrics["dynamic_sampling_tries"] <= 2
        # a round that kept its first group drew nothing more
        if metrics["dynamic_sampling_tries"] == 0:
            assert metrics["sampled_reward"] == pytest.approx(np.mean([r["reward"] for r in rows]))
        else:
            topped_up += 1
            drawn = 4 * (1 + metrics["dynamic_sampling_tries"])
            assert 0.0 <= metrics["sampled_reward"] <= 1.0
            assert metrics["dynamic_sampling_dropped"] + len(groups) <= drawn // 4
    assert topped_up > 0  # the untrained model gives some groups equal rewards
