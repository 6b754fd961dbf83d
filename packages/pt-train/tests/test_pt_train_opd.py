"""On-policy distillation losses, against values and gradients worked out here."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pt_train.objectives.opd import (
    DIVERGENCES,
    OPDConfig,
    divergence,
    pg_reverse_kl,
    staleness_metrics,
    token_kl,
)
from pt_train.producers.rollouts import RolloutSample, rollout_batch


def _logp(*rows):
    return F.log_softmax(torch.tensor(rows, dtype=torch.float64), dim=-1)


@pytest.mark.parametrize("kind", DIVERGENCES)
@pytest.mark.parametrize("closure", [{"tail": True}, {"renormalize": True}])
def test_every_divergence_is_zero_when_the_student_is_the_teacher(kind, closure):
    p = _logp([0.3, -1.0, 2.0, 0.5], [1.0, 1.0, -3.0, 0.0])
    top2 = p.topk(2, dim=-1).values  # a top-k support, with its tail or renormalised
    torch.testing.assert_close(divergence(kind, p, p.clone()), torch.zeros(2, dtype=torch.float64))
    value = divergence(kind, top2, top2.clone(), **closure)
    torch.testing.assert_close(value, torch.zeros(2, dtype=torch.float64))


def test_forward_and_reverse_kl_over_the_whole_vocabulary_are_the_textbook_ones():
    s, t = _logp([0.0, 1.0, 2.0]), _logp([2.0, 0.0, -1.0])
    ps, pt = s.exp()[0], t.exp()[0]
    forward = sum(pt[i] * math.log(pt[i] / ps[i]) for i in range(3))
    reverse = sum(ps[i] * math.log(ps[i] / pt[i]) for i in range(3))
    assert divergence("forward_kl", s, t).item() == pytest.approx(float(forward), abs=1e-12)
    assert divergence("reverse_kl", s, t).item() == pytest.approx(float(reverse), abs=1e-12)


def test_skewed_kl_at_alpha_one_and_zero_is_forward_and_reverse():
    s, t = _logp([0.0, 1.0, 2.0, -1.0]), _logp([2.0, 0.0, -1.0, 0.5])
    for alpha, kind in ((1.0, "forward_kl"), (0.0, "reverse_kl")):
        torch.testing.assert_close(
            divergence("skewed_kl", s, t, alpha=alpha), divergence(kind, s, t)
        )


def test_jsd_is_the_gkd_generalized_jensen_shannon_divergence():
    s, t = _logp([0.0, 1.0, 2.0]), _logp([2.0, 0.0, -1.0])
    ps, pt = s.exp()[0].tolist(), t.exp()[0].tolist()
    beta = 0.3
    m = [beta * a + (1 - beta) * b for a, b in zip(pt, ps, strict=True)]
    expected = beta * sum(a * math.log(a / c) for a, c in zip(pt, m, strict=True)) + (
        1 - beta
    ) * sum(b * math.log(b / c) for b, c in zip(ps, m, strict=True))
    assert divergence("jsd", s, t, beta=beta).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_a_full_vocabulary_top_k_gives_the_dense_value(kind):
    """With k = vocabulary size the top-k support is the whole vocabulary, in another order:
    the sums are the dense divergence."""
    s, t = _logp([0.1, 1.0, -2.0, 0.7, 0.0]), _logp([1.5, 0.0, -1.0, 0.2, 2.0])
    order = t.argsort(dim=-1, descending=True)  # the teacher's "top-5", most likely first
    topk = divergence(kind, s.gather(-1, order), t.gather(-1, order), alpha=0.3, beta=0.4)
    torch.testing.assert_close(topk, divergence(kind, s, t, alpha=0.3, beta=0.4))


def test_token_kl_is_the_sampled_tokens_forward_kl_term():
    student, teacher = torch.tensor([math.log(0.2)]), torch.tensor([math.log(0.5)])
    assert token_kl(student, teacher).item() == pytest.approx(0.5 * math.log(0.5 / 0.2))
    assert token_kl(teacher, teacher).item() == 0.0


def test_expected_pg_reverse_kl_gradient_is_the_reverse_kl_gradient():
    """Enumerate a 4-token vocabulary at one position: with rollouts from the student itself
    (O = S) and no clipping, sum_y S(y) grad loss(y) = grad KL(S || T), for both the
    importance-ratio and the plain REINFORCE form, and for the online advantage."""
    logits = torch.tensor([0.4, -0.3, 1.2, 0.0], dtype=torch.float64, requires_grad=True)
    teacher = _logp([1.0, 0.5, -0.5, 0.2])[0]
    s = F.log_softmax(logits, -1)
    (want,) = torch.autograd.grad((s.exp() * (s - teacher)).sum(), logits)
    for importance_ratio, advantage in itertools.product((True, False), ("rollout", "online")):
        total = torch.zeros(4, dtype=torch.float64)
        for y in range(4):
            s = F.log_softmax(logits, -1)
            loss, _ = pg_reverse_kl(
                s[y : y + 1],
                teacher[y : y + 1],
                s[y : y + 1].detach(),  # O(y): the sampling policy is the student
                clip_epsilon=1e9,
                importance_ratio=importance_ratio,
                advantage=advantage,
            )
            (g,) = torch.autograd.grad(loss.sum(), logits)
            total += s[y].exp().detach() * g
        torch.testing.assert_close(total, want, atol=1e-12, rtol=0)


@pytest.mark.parametrize("importance_ratio", [True, False])
def test_the_online_advantage_at_staleness_zero_is_the_rollout_advantage(importance_ratio):
    """AsyncOPD's recomputation (``advantage: online``: the student's side of the advantage
    under the current weights) and the plain mode (the sampler's log-probs) on samples drawn
    by the current weights (O = S): the same per-token loss and the same gradient."""
    logits = torch.tensor([[0.4, -0.3, 1.2, 0.0], [1.0, 0.1, -0.7, 0.3]], dtype=torch.float64)
    teacher = torch.tensor([math.log(0.6), math.log(0.1)], dtype=torch.float64)
    y = torch.tensor([2, 1])
    results = {}
    for advantage in ("rollout", "online"):
        leaf = logits.clone().requires_grad_(True)
        student = F.log_softmax(leaf, -1).gather(-1, y[:, None])[:, 0]
        loss, _ = pg_reverse_kl(
            student,
            teacher,
            student.detach(),  # O(y) = S(y): staleness 0
            clip_epsilon=0.2,
            importance_ratio=importance_ratio,
            advantage=advantage,
        )
        (grad,) = torch.autograd.grad(loss.sum(), leaf)
        results[advantage] = (loss.detach(), grad)
    torch.testing.assert_close(results["online"], results["rollout"], atol=0, rtol=0)
    # and with an older sampler (O != S) they differ: the online mode reads S, not O
    stale = torch.log_softmax(logits, -1).gather(-1, y[:, None])[:, 0] - 0.5
    student = F.log_softmax(logits, -1).gather(-1, y[:, None])[:, 0]
    a, _ = pg_reverse_kl(student, teacher, stale, clip_epsilon=0.2, importance_ratio=importance_ratio,
                         advantage="rollout")  # fmt: skip
    b, _ = pg_reverse_kl(student, teacher, stale, clip_epsilon=0.2, importance_ratio=importance_ratio,
                         advantage="online")  # fmt: skip
    assert not torch.allclose(a, b)


def test_the_loss_is_logged_against_the_staleness_of_each_tokens_sample():
    """Three samples of staleness 0, 2 and 0 (tokens 0-1, 2-3 and 4): ``loss_fresh`` sums
    the fresh samples' tokens, ``loss_stale`` the stale one's, each with its own count."""
    per_token = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    batch = SimpleNamespace(
        data={"staleness": torch.tensor([0.0, 2.0, 0.0])},
        token_sequence=torch.tensor([0, 0, 1, 1, 2]),
    )
    got = {k: (float(v), c) for k, (v, c) in staleness_metrics(per_token, batch).items()}
    assert got == {"loss_fresh": (8.0, 3.0), "loss_stale": (7.0, 2.0)}
    none_stale = SimpleNamespace(
        data={"staleness": torch.zeros(3)}, token_sequence=batch.token_sequence
    )
    assert staleness_metrics(per_token, none_stale)["loss_stale"][1] == 0.0
    assert staleness_metrics(per_token, SimpleNamespace(data={})) == {}


def test_a_task_reward_adds_the_group_advantages_policy_gradient_to_the_distillation():
    """``reward_weight: w``: the per-token loss is the distillation term plus
    ``-w * A * exp(log S - sg(log O))`` with A the sample's group advantage: on-policy
    (O = S) its gradient is REINFORCE's ``-w * A`` per token's log-prob; ``kl`` stays the
    divergence alone, ``reward_loss`` logs the reward term."""
    from pt_train.logprobs import HeadOutput
    from pt_train.objectives.opd import OPD

    student = torch.log(torch.tensor([0.2, 0.5, 0.1, 0.4, 0.3], dtype=torch.float64))
    teacher = torch.log(torch.tensor([0.4, 0.5, 0.3, 0.2, 0.6], dtype=torch.float64))
    advantages = torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64)  # per sample
    sequence = torch.tensor([0, 0, 1, 1, 2])
    for older in (0.0, 0.3):  # O = S, then a sampler whose log-probs were 0.3 lower
        batch = SimpleNamespace(
            data={"teacher_token_logps": teacher, "advantages": advantages,
                  "rollout_logps": student - older},
            token_sequence=sequence,
        )  # fmt: skip
        results = {}
        for w in (0.0, 0.7):
            leaf = student.clone().requires_grad_(True)
            objective = OPD(OPDConfig(loss="token_kl", reward_weight=w))
            out = objective.loss(HeadOutput(logps=leaf[:, None]), batch, None)
            (grad,) = torch.autograd.grad(out.sum, leaf)
            results[w] = (out, grad)
        plain, mixed = results[0.0], results[0.7]
        a = advantages[sequence]
        ratio = torch.exp(torch.full((5,), older, dtype=torch.float64))
        torch.testing.assert_close(mixed[0].sum, plain[0].sum + 0.7 * (-a * ratio).sum())
        torch.testing.assert_close(mixed[1], plain[1] + 0.7 * (-a * ratio))
        assert float(mixed[0].metrics["kl"][0]) == pytest.approx(float(plain[0].metrics["kl"][0]))
        assert float(mixed[0].metrics["reward_loss"][0]) == pytest.approx(float((-a * ratio).sum()))
        assert "reward_loss" not in plain[0].metrics


def test_a_rounds_rewards_become_group_advantages():
    """GRPO's group advantage over each prompt's samples: rewards 1, 0, 0, 1 (mean 0.5,
    unbiased std 0.577) and 1, 1 (all equal: 0)."""
    from pt_train.objectives.opd import OPD

    rows = [{"group": g, "reward": r} for g, r in
            [("a", 1.0), ("a", 0.0), ("a", 0.0), ("a", 1.0), ("b", 1.0), ("b", 1.0)]]  # fmt: skip
    OPD(OPDConfig(reward_weight=1.0)).prepare_round(rows)
    std = math.sqrt(1 / 3)
    want = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4)] * 2
    want = [want[0], want[1], want[1], want[0], 0.0, 0.0]
    assert [r["advantage"] for r in rows] == pytest.approx(want)
    untouched = [{"group": "a", "reward": 1.0}]
    OPD(OPDConfig()).prepare_round(untouched)
    assert "advantage" not in untouched[0]


def test_clipping_stops_the_gradient_past_the_trust_region():
    # r = exp(log S - log O) = 1.5 > 1 + 0.2 with A > 0: the clipped term wins, no gradient
    student = torch.tensor([math.log(0.3)], requires_grad=True)
    rollout = torch.tensor([math.log(0.2)])
    teacher = torch.tensor([math.log(0.6)])  # A = log 0.6 - log 0.2 > 0
    loss, metrics = pg_reverse_kl(
        student, teacher, rollout, clip_epsilon=0.2, importance_ratio=True, advantage="rollout"
    )
    (g,) = torch.autograd.grad(loss.sum(), student)
    assert g.item() == 0.0 and metrics["clip_fraction"][0].item() == 1.0


def test_support_full_needs_a_teacher_path():
    with pytest.raises(ValueError, match="teacher.path"):
        OPDConfig(support="full")


def test_rollout_batch_lines_token_data_up_with_trained_tokens_packed_or_padded():
    """Per-token data follow the trained tokens in order, whether the sequences are padded
    rows or packed into one row."""
    samples = [
        RolloutSample(
            np.array([5, 6, 7]), np.array([8, 9]), {"teacher_token_logps": np.array([-1.0, -2.0])}
        ),
        RolloutSample(
            np.array([5]),
            np.array([10, 11, 12]),
            {"teacher_token_logps": np.array([-3.0, -4.0, -5.0])},
        ),
    ]
    for pack in (None, 64):
        batch = rollout_batch(samples, pad_token_id=0, pack_length=pack)
        assert batch.targets[batch.targets != -100].tolist() == [8, 9, 10, 11, 12]
        assert batch.data["teacher_token_logps"].tolist() == [-1.0, -2.0, -3.0, -4.0, -5.0]
        assert batch.token_sequence.tolist() == [0, 0, 1, 1, 1]
        assert batch.input_ids.shape[0] == (1 if pack else 2)


@pytest.mark.slow
@pytest.mark.parametrize("pack", [None, 64])
def test_every_kl_mode_is_zero_in_training_when_the_teacher_is_the_student(
    tmp_path, tiny_model_dir, tiny_tokenizer, pack
):
    """Rollouts of different lengths scored by the student itself (HF engine, top-8), trained
    with lr 0 through the real trainer, padded (one row per sequence) or packed into one row:
    every divergence and the token KL log 0 at step 1 (to float32 rounding), and the
    single-sample reverse-KL estimate too."""
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.hf import HFEngine
    from pt_train.config import TrainConfig
    from pt_train.metrics import read_metrics
    from pt_train.producers.fixed import FixedData
    from pt_train.trainer import train

    engine = HFEngine(str(tiny_model_dir))
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13, 14, 15, 16], [17, 18, 19]]
    completions = engine.generate(
        [Request(p, seed=i) for i, p in enumerate(prompts)], SamplingParams(max_tokens=9)
    )
    scores = engine.score(prompts, [c.token_ids for c in completions], top_k=8)
    samples = [
        RolloutSample(
            np.array(p),
            np.array(c.token_ids),
            {
                "teacher_token_logps": np.array(s.token_logprobs),
                "teacher_topk_ids": np.array(s.topk_ids),
                "teacher_topk_logps": np.array(s.topk_logprobs),
            },
        )
        for p, c, s in zip(prompts, completions, scores, strict=True)
    ]
    assert len({len(s.completion) for s in samples}) > 1 or len({len(p) for p in prompts}) > 1
    for loss in ("forward_kl", "reverse_kl", "skewed_kl", "jsd", "token_kl"):
        producer = FixedData(
            samples,
            lambda idx: rollout_batch(
                [samples[i] for i in idx], tiny_tokenizer.pad_token_id, "sdpa", pack
            ),
            global_batch_size=4, micro_batch_size=4, seed=0, shuffle=False, rank=0,
            world_size=1,
        )  # fmt: skip
        cfg = TrainConfig.model_validate(
            {
                "run_name": loss,
                "output_dir": str(tmp_path),
                "model": {"name_or_path": str(tiny_model_dir)},
                "objective": {"name": "opd", "loss": loss},
                "rollout": {},
                "training": {
                    "learning_rate": 0.0,
                    "global_batch_size": 4,
                    "micro_batch_size": 4,
                    "max_steps": 1,
                },
            }  # fmt: skip
        )
        train(cfg, producer=producer)
        record = read_metrics(tmp_path / loss)[0]
        assert abs(record["kl"]) < 1e-5, (loss, record["kl"])
        assert abs(record["sampled_kl"]) < 1e-5


@pytest.mark.parametrize(
    ("objective", "refused"),
    [
        ({"loss": "pg_reverse_kl"}, True),
        ({"loss": "forward_kl", "reward_weight": 0.5}, True),
        ({"loss": "forward_kl"}, False),  # the divergences read no sampled log-prob
    ],
)
def test_a_loss_that_reads_the_sampled_log_probs_refuses_a_truncated_sampling(objective, refused):
    """top_p < 1 samples from a truncated distribution whose log-probs the trainer, over
    the whole vocabulary, cannot reproduce: refused where the loss divides by them."""
    from pt_core.errors import ConfigError
    from pt_train.config import TrainConfig
    from pt_train.objectives import build_objective

    cfg = TrainConfig.model_validate({
        "run_name": "r", "model": {"init": {"tokenizer": "tok"}}, "training": {"max_steps": 1},
        "objective": {"name": "opd", "teacher": {"path": "t/"}, **objective},
        "reward": {"function": "m:f"} if "reward_weight" in objective else {},
        "rollout": {"prompts": "p.jsonl", "samples_per_prompt": 2, "top_p": 0.9},
    })  # fmt: skip
    opd = build_objective(cfg.objective)
    if not refused:
        opd.configure(cfg)
        assert opd.needs.logprobs_mode == "raw"
        return
    with pytest.raises(ConfigError, match=r"rollout.top_p=0.9 / top_k=0 truncate it"):
        opd.configure(cfg)
    untruncated = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"top_p": 1.0})})
    opd.configure(untruncated)
    assert opd.needs.logprobs_mode == "processed"  # O(y): the distribution sampled from
