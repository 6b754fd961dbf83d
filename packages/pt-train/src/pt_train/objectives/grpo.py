"""Group Relative Policy Optimization (GRPO) and DAPO, on the online loop's rewards.

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
      policy_loss: clip           # clip (PPO's clipped surrogate) | cispo
      rollout_correction: {level: token, mode: truncate, cap: 2.0, low: 0.5, high: 2.0}
      overlong: {buffer: 0, penalty: 1.0}
      dynamic_sampling: {enabled: false, max_tries: 3}

It runs on the online loop (``rollout:``; ``samples_per_prompt`` is the group size G),
whose reward component (:mod:`pt_train.rewards`, the run's ``reward:`` section) gives
each completion its reward; ``kl_estimator`` and ``reference`` are refused with beta 0.
GRPO shapes the reward with DAPO's overlong penalty,
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

``policy_loss: cispo`` (MiniMax-M1, 2025) keeps every token's gradient instead of
clipping it away: ``l_t = -sg(clip(r, 1 - epsilon_low, 1 + epsilon_high)) A_i log pi(y_t)``,
the REINFORCE term weighted by the clipped, stopped-gradient ratio (its gradient is
``-clip(r) A_i grad log pi(y_t)``); ``dual_clip`` is refused with it.

Every token's loss is multiplied by the rollout correction ``w_t``, from the importance
ratio ``rho_t = exp(log pi_old(y_t) - log mu(y_t))`` with ``mu`` the log-probs the
generator recorded: sampling engines and trainers compute slightly different log-probs
(kernels, precision), and a stale sample was drawn from older weights. ``level`` says
which ratio: ``token`` (``rho_t``), ``sequence`` (the product over the sequence, for every
token), ``geometric`` (the geometric mean over the sequence, ``exp(mean_t log rho_t)``, for
every token); ``mode`` what is done with it:

- ``truncate``: ``w = min(rho, cap)`` (truncated IS, Yao et al. 2025, "Your efficient RL
  framework secretly brings you off-policy RL training");
- ``mask``: ``w = rho`` where ``low <= rho <= high``, else 0: a token (or, at sequence and
  geometric level, a whole sequence) whose trainer/generator ratio is out of bounds on
  either side gives no gradient (two-sided masking as IcePop, Ling Team 2025; the
  geometric-mean sequence mask does not grow with length as the product does).

The step's loss (``aggregation``):

- ``grpo``: the mean over sequences of each sequence's token mean;
- ``dapo``: the sum over every token divided by the step's tokens;
- ``dr_grpo``: the sum over every token divided by (sequences x ``rollout.max_tokens``).

On-policy (``r = 1``, ``w = 1``), with beta 0 and no clipping, the ``grpo`` loss is 0
(advantages sum to 0 in each group) and its gradient is the REINFORCE estimator
``-(1/B) sum_i A_i / |o_i| sum_t grad log pi(y_t)``.

Metrics: ``reward``, ``reward_std``, ``accuracy`` (graded correct), ``groups_all_equal``,
``advantage`` mean and ``advantage_abs``, ``clip_low`` / ``clip_high`` fractions,
``completion_length``, ``entropy``, ``rollout_kl`` (k3 estimate of the KL between the
generator's and the trainer's distributions on the sampled tokens), ``correction_masked``
(the fraction of tokens masked, ``mode: mask``), ``kl`` (to the reference, with beta);
the online loop adds the reward component's figures.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from pt_core.config import Section
from pt_core.errors import ConfigError
from pt_train.objectives.base import (
    LossOutput,
    Needs,
    Objective,
    mean_metric,
    segment_sum,
)
from pt_train.objectives.reference import ReferenceConfig

STD_EPS = 1e-4


class OverlongConfig(Section):
    buffer: int = Field(default=0, ge=0)  # 0: no shaping
    penalty: float = Field(default=1.0, ge=0)


class DynamicSamplingConfig(Section):
    enabled: bool = False
    max_tries: int = Field(default=3, ge=1)


class RolloutCorrectionConfig(Section):
    level: Literal["token", "sequence", "geometric", "none"] = "token"
    mode: Literal["truncate", "mask"] = "truncate"
    cap: float = Field(default=2.0, gt=0)  # truncate
    low: float = Field(default=0.5, ge=0)  # mask
    high: float = Field(default=2.0, gt=0)  # mask

    @model_validator(mode="after")
    def _check(self):
        given = self.model_dump(exclude_defaults=True)
        unread = ("low", "high") if self.mode == "truncate" else ("cap",)
        if self.level == "none":
            unread = ("mode", "cap", "low", "high")
        for key in unread:
            if key in given:
                raise ValueError(
                    f"objective.rollout_correction.{key}={getattr(self, key)} has no effect "
                    f"with level {self.level} and mode {self.mode}; remove it"
                )
        if self.mode == "mask" and not self.low < 1 < self.high:
            raise ValueError(
                f"objective.rollout_correction: mask bounds [{self.low}, {self.high}] must hold "
                "1 (an on-policy token is never masked)"
            )
        return self


class GRPOConfig(Section):
    name: Literal["grpo"] = "grpo"
    epsilon_low: float = Field(default=0.2, ge=0, lt=1)
    epsilon_high: float = Field(default=0.28, ge=0)
    dual_clip: float | None = Field(default=None, gt=1)
    policy_loss: Literal["clip", "cispo"] = "clip"
    beta: float = Field(default=0.0, ge=0)
    kl_estimator: Literal["k1", "k3"] = "k3"
    aggregation: Literal["grpo", "dapo", "dr_grpo"] = "dapo"
    scale_rewards: Literal["group", "batch", "none"] = "group"
    ratio_level: Literal["token", "sequence"] = "token"
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
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
        if self.policy_loss == "cispo" and "dual_clip" in given:
            raise ValueError(
                "objective.dual_clip has no effect with policy_loss cispo (no clipped "
                "surrogate to bound); remove it"
            )
        if self.beta == 0:
            for key in ("kl_estimator", "reference"):
                if key in given:
                    raise ValueError(
                        f"objective.{key} has no effect with beta 0 (no KL term, no reference "
                        "model); set beta > 0 or remove it"
                    )
        for section, key, off, why in (
            ("overlong", "penalty", self.overlong.buffer == 0, "buffer 0 (no shaping)"),
            ("dynamic_sampling", "max_tries", not self.dynamic_sampling.enabled, "enabled false"),
        ):
            if key in given.get(section, {}) and off:
                raise ValueError(
                    f"objective.{section}.{key}={getattr(getattr(self, section), key)} has no "
                    f"effect with {section}.{why}; remove it"
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
    policy: str = "clip",
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
    if policy == "cispo":
        loss = -clipped.detach() * adv * logps
    else:
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


def rollout_correction(
    log_rho: torch.Tensor, token_sequence: torch.Tensor, num_sequences: int, cfg
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """[N] per-token correction weights from the [N] log importance ratios ``log pi_old -
    log mu`` (see the module docstring), and the [N] bool "masked" (``mode: mask``), or
    None for what does not apply."""
    if cfg.level == "none":
        return None, None
    if cfg.level == "token":
        log_w = log_rho
    else:
        per_sequence = segment_sum(log_rho, token_sequence, num_sequences)
        if cfg.level == "geometric":
            lengths = torch.bincount(token_sequence, minlength=num_sequences).clamp(min=1)
            per_sequence = per_sequence / lengths
        log_w = per_sequence[token_sequence]
    rho = torch.exp(log_w)
    if cfg.mode == "truncate":
        return rho.clamp(max=cfg.cap), None
    masked = (rho < cfg.low) | (rho > cfg.high)
    return rho.masked_fill(masked, 0.0), masked


def kl_penalty(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimates on samples of pi: k1 ``log pi - log ref``, k3
    ``exp(ref - log pi) - (ref - log pi) - 1`` (Schulman 2020), both unbiased, k3 >= 0."""
    if estimator == "k1":
        return logps - ref_logps
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1


def rollout_kl(old: torch.Tensor, rollout: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(generator || trainer) on the generator's samples,
    ``exp(d) - d - 1`` with ``d = old - rollout``, computed as ``expm1(d) - d`` in float64:
    a difference at rounding level keeps its ``d**2 / 2`` (3e-7 gives 4.5e-14) where
    float32's ``exp(d) - d - 1`` gives 0 or rounding noise."""
    d = old.detach().double() - rollout.detach().double()
    return torch.expm1(d) - d


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
    needs = Needs(data="rollouts", reward=True)  # in full once configured

    def __init__(self, cfg: GRPOConfig):
        super().__init__(cfg)
        self.max_tokens = 1  # rollout.max_tokens, for dr_grpo and the overlong shaping

    def configure(self, train_cfg) -> None:
        rollout = train_cfg.rollout
        if rollout.temperature <= 0:
            raise ConfigError(
                "GRPO samples its groups: rollout.temperature must be > 0 (0 is greedy, so "
                "every sample of a group would be the same)",
                hint="use a temperature around 1",
            )
        if rollout.truncated:
            raise ConfigError(
                f"GRPO's importance ratios divide log-probs of the distribution the samples were "
                f"drawn from; rollout.top_p={rollout.top_p} / top_k={rollout.top_k} truncate "
                "it, and the trainer's log-probs are over the whole vocabulary",
                hint="set rollout.top_p: 1.0 and rollout.top_k: 0 (temperature alone is "
                "computed alike on both sides)",
            )
        self.max_tokens = rollout.max_tokens
        cfg = self.cfg
        if train_cfg.environment.name is not None and cfg.overlong.buffer > 0:
            raise ConfigError(
                f"objective.overlong.buffer={cfg.overlong.buffer} shapes the reward by a "
                "completion's length against rollout.max_tokens, and an episode's ids are "
                "several turns and an environment's answers: it has no meaning there",
                hint="remove objective.overlong (cap an episode with environment.max_tokens)",
            )
        if rollout.updates_per_round * rollout.epochs_per_round == 1:
            # The weights a round's samples are trained against are the current ones: the
            # ratio is 1, nothing is clipped.
            given = cfg.model_dump(exclude_defaults=True)
            for key in ("epsilon_low", "epsilon_high", "dual_clip", "ratio_level"):
                if key in given:
                    raise ConfigError(
                        f"objective.{key}={getattr(cfg, key)} has no effect with one optimizer "
                        "step per round (rollout.updates_per_round x epochs_per_round = 1): "
                        "the policy ratio is 1 at every token",
                        hint="remove it, or train each round in several steps "
                        "(rollout.updates_per_round or epochs_per_round > 1)",
                    )
        self.needs = Needs(
            data="rollouts",
            frozen="logps" if cfg.beta > 0 else "none",
            frozen_model=cfg.reference,
            columns={
                "advantage": "GRPO trains on the online loop's rounds (rollout.prompts)",
                "completion_logprobs": "the generator records them",
            },
            logprobs_mode="processed",
            old_logps=rollout.updates_per_round * rollout.epochs_per_round > 1,
            reward=True,
            regroup_tries=cfg.dynamic_sampling.max_tries if cfg.dynamic_sampling.enabled else 0,
        )

    def head(self, batch) -> dict:
        return {"entropy": True}

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
        weights, masked = rollout_correction(
            (old - rollout).detach(),
            batch.token_sequence,
            batch.num_sequences,
            cfg.rollout_correction,
        )
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
            policy=cfg.policy_loss,
            weights=weights,
            kl=kl,
            beta=cfg.beta,
        )
        total, count = aggregate(
            per_token, batch.token_sequence, batch.num_sequences, cfg.aggregation, self.max_tokens
        )
        metrics["rollout_kl"] = mean_metric(rollout_kl(old, batch.data["rollout_logps"]))
        if masked is not None:
            metrics["correction_masked"] = mean_metric(masked.double())
        assert out.entropy is not None  # head() asks for it
        metrics["entropy"] = mean_metric(out.entropy)
        if kl is not None:
            metrics["kl"] = mean_metric(kl.detach())
        return LossOutput(total, count, metrics)

    def prepare_round(self, rows: list[dict]) -> None:
        """Shape the rewards (overlong) and set each row's group advantage."""
        lengths = np.array([len(r["completion_token_ids"]) for r in rows])
        rewards = np.array([r["reward"] for r in rows], dtype=np.float64)
        rewards = rewards + overlong_penalty(
            lengths, self.max_tokens, self.cfg.overlong.buffer, self.cfg.overlong.penalty
        )
        groups = np.array([_group_key(r) for r in rows])
        advantages, all_equal = group_advantages(rewards, groups, self.cfg.scale_rewards)
        for row, reward, advantage, equal in zip(rows, rewards, advantages, all_equal, strict=True):
            row["reward"] = float(reward)
            row["advantage"] = float(advantage)
            row["group_all_equal"] = bool(equal)


def _group_key(row: dict) -> str:
    """The samples of one prompt in one round (the online loop names them ``group``)."""
    return row["group"] if "group" in row else f"{row.get('round')}:{row['id']}"


OBJECTIVE = (GRPOConfig, GRPO)
