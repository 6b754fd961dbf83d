"""Group Relative Policy Optimization (GRPO) and DAPO, rewarded by pt-eval's grader.

    objective:
      name: grpo
      epsilon_low: 0.2
      epsilon_high: 0.28          # clip-higher (DAPO); equal to epsilon_low for GRPO
      dual_clip: null             # c > 1: bound the loss of negative advantages (dual-clip PPO)
      beta: 0.0                   # KL to the reference (k1 or k3); 0: no reference loaded
      kl_estimator: k3
      aggregation: dapo           # grpo | dapo | dr_grpo
      scale_rewards: group        # group | batch | none
      ratio_level: token          # token | sequence (GSPO)
      rollout_correction: {level: token, cap: 2.0}
      reward: {answer_key: answer, format_reward: 0.0, function: null}
      overlong: {buffer: 0, penalty: 1.0}
      dynamic_sampling: {enabled: false, max_tries: 3}

It runs on the online loop (``rollout:``; ``samples_per_prompt`` is the group size G).

Rewards (per completion): 1 when pt-eval grades it correct against the prompt's gold answer,
else 0 (a grading timeout or error is 0 and counted), ``+ format_reward`` when the
completion has a ``\\boxed{...}``, or whatever ``function`` (``"module:function"`` taking
the round's rows and returning one float per row) gives (alone: ``format_reward``,
``answer_key``, ``timeout`` and ``workers`` are for grading and are refused beside it;
``kl_estimator`` and ``reference`` are refused with beta 0); then DAPO's overlong shaping,
``-penalty * (L - (L_max - buffer)) / buffer`` for a completion of L tokens within the
last ``buffer`` of ``L_max = rollout.max_tokens`` (and ``-penalty`` when cut at L_max).

Advantages, per group of the same prompt (Shao et al. 2024, DeepSeekMath): ``A_i = (R_i -
mean(R)) / (std(R) + 1e-4)`` with the group's std (``scale_rewards: group``), the round's
(``batch``) or none (``none``: Dr. GRPO, Liu et al. 2025); std is the unbiased one, as in
TRL. A group whose rewards are all equal has advantage 0; with ``dynamic_sampling`` such
groups are dropped and the round is topped up with other prompts (DAPO, Yu et al. 2025),
at most ``max_tries`` times (what is still missing is filled with dropped groups, counted).

Loss per completion token t of sample i, with ``r = exp(log pi(y_t) - log pi_old(y_t))``
(``pi_old``: the weights its round started training from; ``ratio_level: sequence`` uses
GSPO's length-normalised sequence ratio, Zheng et al. 2025, for every token)::

    l_t = -min(r A_i, clip(r, 1 - epsilon_low, 1 + epsilon_high) A_i)
    l_t = min(l_t, -dual_clip * A_i)   for A_i < 0 with dual_clip (Ye et al. 2020)
    l_t += beta * KL_t                 k1: log pi - log ref; k3: exp(ref - log pi) - (ref - log pi) - 1

times the rollout correction ``w_t = min(exp(log pi_old(y_t) - log mu(y_t)), cap)`` (or
the sequence's product, ``level: sequence``), with ``mu`` the log-probs the generator
recorded: sampling engines and trainers compute slightly different log-probs (kernels,
precision), and a stale sample was drawn from older weights; the truncated importance
weight corrects both (truncated IS as in Yao et al. 2025, "Your efficient RL framework
secretly brings you off-policy RL training"). The step's loss (``aggregation``):

- ``grpo``: the mean over sequences of each sequence's token mean;
- ``dapo``: the sum over every token divided by the step's tokens;
- ``dr_grpo``: the sum over every token divided by (sequences x ``rollout.max_tokens``).

On-policy (``r = 1``, ``w = 1``), with beta 0 and no clipping, the ``grpo`` loss is 0
(advantages sum to 0 in each group) and its gradient is the REINFORCE estimator
``-(1/B) sum_i A_i / |o_i| sum_t grad log pi(y_t)``.

Metrics: ``reward``, ``reward_std``, ``accuracy`` (graded correct), ``groups_all_equal``,
``advantage`` mean and ``advantage_abs``, ``clip_low`` / ``clip_high`` fractions,
``completion_length``, ``entropy``, ``rollout_kl`` (k3 estimate of the KL between the
generator's and the trainer's distributions on the sampled tokens), ``kl`` (to the
reference, with beta), ``reward_s`` and the grading counts.
"""

from __future__ import annotations

import importlib
import re
import time
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from pt_core.config import Section
from pt_core.errors import ConfigError
from pt_train.objectives.base import LossOutput, Objective, mean_metric, segment_sum
from pt_train.objectives.reference import ReferenceConfig

STD_EPS = 1e-4
BOXED = re.compile(r"\\boxed\s*\{")


class RewardConfig(Section):
    answer_key: str = "answer"
    format_reward: float = 0.0
    function: str | None = None  # "module:function": rows -> one float per row
    timeout: float = Field(5.0, gt=0)
    workers: int | None = Field(None, ge=1)


class OverlongConfig(Section):
    buffer: int = Field(0, ge=0)  # 0: no shaping
    penalty: float = Field(1.0, ge=0)


class DynamicSamplingConfig(Section):
    enabled: bool = False
    max_tries: int = Field(3, ge=1)


class RolloutCorrectionConfig(Section):
    level: Literal["token", "sequence", "none"] = "token"
    cap: float = Field(2.0, gt=0)


class GRPOConfig(Section):
    name: Literal["grpo"] = "grpo"
    epsilon_low: float = Field(0.2, ge=0, lt=1)
    epsilon_high: float = Field(0.28, ge=0)
    dual_clip: float | None = Field(None, gt=1)
    beta: float = Field(0.0, ge=0)
    kl_estimator: Literal["k1", "k3"] = "k3"
    aggregation: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    ratio_level: Literal["token", "sequence"] = "token"
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)

    @model_validator(mode="after")
    def _check(self):
        if self.reference.precompute:
            raise ValueError(
                "objective.reference.precompute: GRPO's samples are made during training; "
                "its reference runs live (set precompute to false)"
            )
        # Keys at a value other than their default (a run's frozen config.yaml lists every
        # key, so that is what "given" can mean; a default changes nothing).
        given = self.model_dump(exclude_defaults=True)
        for key in given.get("reward", {}) if self.reward.function is not None else ():
            if key in ("format_reward", "answer_key", "timeout", "workers"):
                fix = "add the bonus inside the function" if key == "format_reward" else "remove it"
                raise ValueError(
                    f"objective.reward.{key}={getattr(self.reward, key)} has no effect beside "
                    f"reward.function: the function's value is the whole reward and nothing is "
                    f"graded; {fix}"
                )
        if self.beta == 0:
            for key in ("kl_estimator", "reference"):
                if key in given:
                    raise ValueError(
                        f"objective.{key} has no effect with beta 0 (no KL term, no reference "
                        "model); set beta > 0 or remove it"
                    )
        return self


# --------------------------------------------------------------------------- pure functions


def group_advantages(
    rewards: np.ndarray, groups: np.ndarray, scale: str = "group"
) -> tuple[np.ndarray, np.ndarray]:
    """[n] rewards and group ids -> [n] advantages and [n] bool "group's rewards all equal".

    ``A = (R - mean_group) / (std + 1e-4)`` with the unbiased std of the group (``group``),
    of every reward given (``batch``), or no division (``none``)."""
    rewards = np.asarray(rewards, dtype=np.float64)
    advantages = np.zeros_like(rewards)
    all_equal = np.zeros(len(rewards), dtype=bool)
    batch_std = rewards.std(ddof=1) if len(rewards) > 1 else 0.0
    for g in np.unique(groups):
        members = groups == g
        r = rewards[members]
        centred = r - r.mean()
        equal = bool(np.all(r == r[0]))
        all_equal[members] = equal
        if equal:
            continue  # exactly 0, whatever the scaling
        if scale == "group":
            centred = centred / (r.std(ddof=1) + STD_EPS)
        elif scale == "batch":
            centred = centred / (batch_std + STD_EPS)
        advantages[members] = centred
    return advantages, all_equal


def overlong_penalty(lengths: np.ndarray, max_tokens: int, buffer: int, penalty: float):
    """DAPO's soft overlong punishment: 0 up to ``max_tokens - buffer`` tokens, then a
    linear ramp down to ``-penalty`` at ``max_tokens``."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer <= 0:
        return np.zeros_like(lengths)
    start = max_tokens - buffer
    return -penalty * np.clip((lengths - start) / buffer, 0.0, 1.0)


def policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    token_sequence: torch.Tensor,
    num_sequences: int,
    *,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    weights: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
    beta: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """[N] per-token clipped-surrogate losses (see the module docstring) from [N] log-probs
    under the policy and the old policy, [S] advantages, the [N] sequence of each token,
    optional [N] rollout-correction weights and [N] KL values."""
    adv = advantages[token_sequence].to(logps.dtype)  # [N]
    log_ratio = logps - old_logps
    if ratio_level == "sequence":
        lengths = torch.bincount(token_sequence, minlength=num_sequences).clamp(min=1)
        seq = segment_sum(log_ratio.detach(), token_sequence, num_sequences) / lengths
        # GSPO-token: the value of the sequence ratio, the gradient of each token's log-prob
        log_ratio = seq[token_sequence] + logps - logps.detach()
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - epsilon_low, 1 + epsilon_high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    if dual_clip is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    if kl is not None and beta:
        loss = loss + beta * kl
    if weights is not None:
        loss = loss * weights.to(loss.dtype)
    r = ratio.detach()
    metrics = {
        "clip_low": mean_metric(((r < 1 - epsilon_low) & (adv < 0)).double()),
        "clip_high": mean_metric(((r > 1 + epsilon_high) & (adv > 0)).double()),
    }
    return loss, metrics


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimates on samples of pi: k1 ``log pi - log ref``, k3
    ``exp(ref - log pi) - (ref - log pi) - 1`` (Schulman 2020), both unbiased, k3 >= 0."""
    if estimator == "k1":
        return logps - ref_logps
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def aggregate(
    per_token: torch.Tensor,
    token_sequence: torch.Tensor,
    num_sequences: int,
    aggregation: str,
    max_tokens: int,
) -> tuple[torch.Tensor, float]:
    """A micro-batch's (sum, count) for the step's normalizer: see the module docstring."""
    if aggregation == "grpo":
        lengths = torch.bincount(token_sequence, minlength=num_sequences).clamp(min=1)
        per_sequence = segment_sum(per_token, token_sequence, num_sequences) / lengths
        return per_sequence.sum(), float(num_sequences)
    if aggregation == "dapo":
        return per_token.sum(), float(per_token.numel())
    return per_token.sum(), float(num_sequences * max_tokens)


# --------------------------------------------------------------------------- objective


class GRPO(Objective):
    name = "grpo"
    data = "rollouts"
    logprobs_mode = "processed"

    def __init__(self, cfg: GRPOConfig):
        super().__init__(cfg)
        self.reference = "logps" if cfg.beta > 0 else "none"
        self.temperature = 1.0  # set to the sampling temperature by the trainer
        self.max_tokens = 1  # rollout.max_tokens, for dr_grpo
        self._pool = None
        self._function = None

    def configure(self, train_cfg) -> None:
        rollout = train_cfg.rollout
        if rollout.temperature <= 0:
            raise ConfigError(
                "GRPO samples its groups: rollout.temperature must be > 0 (0 is greedy, so "
                "every sample of a group would be the same)",
                hint="use a temperature around 1",
            )
        self.temperature = rollout.temperature
        self.max_tokens = rollout.max_tokens
        self.needs_old_logps = rollout.updates_per_round * rollout.epochs_per_round > 1

    def required_columns(self) -> dict[str, str]:
        return {
            "advantage": "GRPO trains on the online loop's rounds (rollout.prompts)",
            "completion_logprobs": "the generator records them",
        }

    def head(self, batch) -> dict:
        return {"temperature": self.temperature, "entropy": True}

    def count(self, batch) -> float:
        if self.cfg.aggregation == "dapo":
            return float(batch.num_trained)
        if self.cfg.aggregation == "grpo":
            return float(batch.num_sequences)
        return float(batch.num_sequences * self.max_tokens)

    def loss(self, out, batch, ref) -> LossOutput:
        cfg = self.cfg
        logps = out.token_logps
        rollout = batch.data["rollout_logps"].to(logps.dtype)
        old = batch.data.get("old_logps")
        old = old.to(logps.dtype) if old is not None else logps.detach()
        weights = None
        if cfg.rollout_correction.level == "token":
            weights = torch.exp(old - rollout).clamp(max=cfg.rollout_correction.cap)
        elif cfg.rollout_correction.level == "sequence":
            seq = segment_sum(old - rollout, batch.token_sequence, batch.num_sequences)
            weights = torch.exp(seq).clamp(max=cfg.rollout_correction.cap)[batch.token_sequence]
        kl = None
        if ref is not None:
            kl = kl_penalty(logps, ref.token_logps.to(logps.dtype).detach(), cfg.kl_estimator)
        per_token, metrics = policy_loss(
            logps,
            old,
            batch.data["advantages"],
            batch.token_sequence,
            batch.num_sequences,
            epsilon_low=cfg.epsilon_low,
            epsilon_high=cfg.epsilon_high,
            dual_clip=cfg.dual_clip,
            ratio_level=cfg.ratio_level,
            weights=weights,
            kl=kl,
            beta=cfg.beta,
        )
        total, count = aggregate(
            per_token, batch.token_sequence, batch.num_sequences, cfg.aggregation, self.max_tokens
        )
        delta = (old - rollout).detach()
        metrics["rollout_kl"] = mean_metric(torch.exp(delta) - delta - 1)
        metrics["entropy"] = mean_metric(out.entropy)
        if kl is not None:
            metrics["kl"] = mean_metric(kl.detach())
        return LossOutput(total, count, metrics)

    # ------------------------------------------------------------------ the round's rewards

    def process_round(self, rows: list[dict], round_index: int) -> dict:
        """Grade the round's completions, shape the rewards and set each row's advantage."""
        start = time.perf_counter()
        rewards, counts = self.rewards(rows)
        lengths = np.array([len(r["completion_token_ids"]) for r in rows])
        rewards = rewards + overlong_penalty(
            lengths, self.max_tokens, self.cfg.overlong.buffer, self.cfg.overlong.penalty
        )
        groups = np.array([_group_key(r) for r in rows])
        advantages, all_equal = group_advantages(rewards, groups, self.cfg.scale_rewards)
        for row, reward, advantage, equal in zip(rows, rewards, advantages, all_equal, strict=True):
            row["reward"] = float(reward)
            row["advantage"] = float(advantage)
            row["group_all_equal"] = bool(equal)
        return {"reward_s": round(time.perf_counter() - start, 3), **counts}

    def round_metrics(self, rows: list[dict]) -> dict:
        """The figures of a round as trained (after dynamic sampling)."""
        rewards = np.array([r["reward"] for r in rows])
        advantages = np.array([r["advantage"] for r in rows])
        equal = {_group_key(r): r["group_all_equal"] for r in rows}
        return {
            "reward": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "accuracy": float(np.mean([bool(r.get("correct")) for r in rows])),
            "groups_all_equal": float(np.mean(list(equal.values()))),
            "advantage": float(advantages.mean()),
            "advantage_abs": float(np.abs(advantages).mean()),
            "completion_length": float(np.mean([len(r["completion_token_ids"]) for r in rows])),
        }

    def rewards(self, rows: list[dict]) -> tuple[np.ndarray, dict]:
        """[n] rewards of the rows (and grading counts); writes ``correct``,
        ``grade_status`` and ``extracted`` into the rows when grading."""
        cfg = self.cfg.reward
        if cfg.function is not None:
            values = self._custom()(rows)
            if len(values) != len(rows):
                raise ConfigError(
                    f"objective.reward.function {cfg.function} returned {len(values)} rewards "
                    f"for {len(rows)} rows"
                )
            return np.asarray(values, dtype=np.float64), {}
        from pt_eval.grade import GradeOptions, grade_rows

        if any(cfg.answer_key not in r for r in rows):
            raise ConfigError(
                f"GRPO grades against each prompt's gold answer, but the prompts have no "
                f"{cfg.answer_key!r} column",
                hint="set objective.reward.answer_key, or a reward function",
            )
        graded, _ = grade_rows(
            # finish_reason: a completion cut at max_tokens gets no last-number fallback
            [{"id": i, "completion": r["completion"], "answer": r[cfg.answer_key],
              "finish_reason": r.get("finish_reason")}
             for i, r in enumerate(rows)],
            GradeOptions(pred_key="completion", gold_key="answer", id_key="id"),
            pool=self._grading_pool(),
            show_progress=False,  # a round's grading is part of the step the trainer's bar shows
        )  # fmt: skip
        statuses = {"timeout": 0, "error": 0, "no_answer": 0}
        rewards = np.zeros(len(rows))
        for i, (row, g) in enumerate(zip(rows, graded, strict=True)):
            row["correct"], row["grade_status"], row["extracted"] = (
                g["correct"], g["grade_status"], g["extracted"],
            )  # fmt: skip
            if g["grade_status"] in statuses:
                statuses[g["grade_status"]] += 1
            rewards[i] = 1.0 if g["correct"] else 0.0
            if self.cfg.reward.format_reward and BOXED.search(row["completion"] or ""):
                rewards[i] += self.cfg.reward.format_reward
        return rewards, {f"graded_{k}": v for k, v in statuses.items()}

    def _grading_pool(self):
        if self._pool is None:
            from pt_eval.worker import GradingPool

            self._pool = GradingPool(self.cfg.reward.workers, self.cfg.reward.timeout)
        return self._pool

    def _custom(self):
        if self._function is None:
            spec = self.cfg.reward.function
            module, _, name = spec.partition(":")
            try:
                self._function = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError) as exc:
                raise ConfigError(
                    f"objective.reward.function={spec!r} cannot be imported ({exc})",
                    hint="give module:function, importable from where pt-train runs",
                ) from None
        return self._function

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _group_key(row: dict) -> str:
    """The samples of one prompt in one round (the online loop names them ``group``)."""
    return row["group"] if "group" in row else f"{row.get('round')}:{row['id']}"
