"""Direct Preference Optimization and its family, on preference pairs.

    objective:
      name: dpo
      beta: 0.1
      loss_type: sigmoid            # or a list of loss types, mixed by loss_weights
      label_smoothing: 0.0          # conservative DPO (sigmoid) / robust DPO (robust)
      rpo_alpha: null               # + alpha x the chosen response's token-mean NLL
      reference: {path: null, precompute: false}   # not with simpo alone

``reference`` with only reference-free loss types (simpo), and ``simpo_gamma`` without
simpo, have no effect and are refused at start (when set to anything but the default).

Notation, per pair: ``pi_c``/``pi_r`` the policy's log-prob of the chosen / rejected
completion (summed over its trained tokens), ``ref_c``/``ref_r`` the reference's, and the
implicit reward log-ratios ``c = pi_c - ref_c``, ``r = pi_r - ref_r``, ``h = c - r``:

============  ==========================================================  =============
loss_type     per-pair loss                                               paper
============  ==========================================================  =============
sigmoid       -(1-e) log s(b h) - e log s(-b h)                           Rafailov 2023; cDPO (e)
robust        (-(1-e) log s(b h) + e log s(-b h)) / (1 - 2e)              Chowdhury 2024
hinge         max(0, 1 - b h)                                             Liu 2023 (RSO)
ipo           (h' - 1/(2b))^2, h' from token-mean log-probs               Azar 2023
bco_pair      -log s(b c - d) - log s(-(b r - d)), d = running mean reward   Jung 2024
sppo_hard     (c - 1/(2b))^2 + (r + 1/(2b))^2                             Wu 2024
apo_zero      (1 - s(b c)) + s(b r)                                       D'Oosterlinck 2024
simpo         -(1-e) log s(b (a_c - a_r) - g) - e log s(...), no reference  Meng 2024
============  ==========================================================  =============

``s`` is the logistic sigmoid, ``b`` = beta, ``e`` = label_smoothing, ``g`` = simpo_gamma,
``a_c``/``a_r`` the policy's token-mean log-probs. The loss of a step is the mean over its
pairs (a pair is never split between micro-batches or ranks). ``bco_pair``'s ``d`` is the
mean of every chosen and rejected reward of the steps before this one (0 at the first),
kept in the checkpoint, so the result does not depend on how a step is split.

At initialisation (policy = reference, ``h = 0``): sigmoid and robust give ``log 2``, hinge
1, ipo ``1/(4 b^2)``, bco_pair ``2 log 2``, sppo_hard ``1/(2 b^2)``, apo_zero 1.

Metrics (means over the step's pairs): ``rewards/chosen`` ``b c``, ``rewards/rejected``
``b r``, ``rewards/margins``, ``rewards/accuracies`` (chosen reward > rejected reward),
``logps/chosen``, ``logps/rejected``.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator

from pt_core.config import Section
from pt_train.objectives.base import (
    LossOutput,
    Needs,
    Objective,
    pair_logps,
    preference_metrics,
)
from pt_train.objectives.reference import ReferenceConfig

LossType = Literal[
    "sigmoid", "robust", "hinge", "ipo", "bco_pair", "sppo_hard", "apo_zero", "simpo"
]
REFERENCE_FREE = ("simpo",)
LENGTH_NORMALISED = ("ipo", "simpo")


class DPOConfig(Section):
    name: Literal["dpo"] = "dpo"
    beta: float = Field(default=0.1, gt=0)
    # one loss type, or several mixed by loss_weights (a string is read as a list of one)
    loss_type: list[LossType] = Field(default_factory=lambda: ["sigmoid"])
    loss_weights: list[float] | None = None
    label_smoothing: float = Field(default=0.0, ge=0, lt=0.5)
    rpo_alpha: float | None = Field(default=None, ge=0)
    simpo_gamma: float = 0.5
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)

    @field_validator("loss_type", mode="before")
    @classmethod
    def _one_or_many(cls, value):
        return [value] if isinstance(value, str) else value

    @property
    def loss_types(self) -> list[str]:
        return list(self.loss_type)

    @property
    def weights(self) -> list[float]:
        return self.loss_weights or [1.0] * len(self.loss_types)

    @model_validator(mode="after")
    def _check(self):
        if not self.loss_types:
            raise ValueError("loss_type: give at least one loss type")
        if self.loss_weights is not None and len(self.loss_weights) != len(self.loss_types):
            raise ValueError(
                f"loss_weights has {len(self.loss_weights)} values for "
                f"{len(self.loss_types)} loss types; give one weight per loss type"
            )
        if self.label_smoothing and not set(self.loss_types) & {"sigmoid", "robust", "simpo"}:
            raise ValueError(
                "label_smoothing applies to the sigmoid, robust and simpo losses only; "
                f"loss_type is {self.loss_type}"
            )
        # Keys at a value other than their default (a run's frozen config.yaml lists every
        # key, so that is what "given" can mean; a default changes nothing).
        given = self.model_dump(exclude_defaults=True)
        if "reference" in given and not self.needs_reference:
            raise ValueError(
                f"objective.reference={given['reference']} has no effect: loss_type "
                f"{'/'.join(self.loss_types)} compares no reference model; remove it"
            )
        if "simpo_gamma" in given and "simpo" not in self.loss_types:
            raise ValueError(
                f"objective.simpo_gamma={self.simpo_gamma} has no effect: it is the margin of "
                f"loss_type simpo, and loss_type is {'/'.join(self.loss_types)}; remove it"
            )
        return self

    @property
    def needs_reference(self) -> bool:
        return any(t not in REFERENCE_FREE for t in self.loss_types)


def pair_losses(
    loss_type: str,
    chosen_logratio: torch.Tensor,
    rejected_logratio: torch.Tensor,
    *,
    beta: float,
    label_smoothing: float = 0.0,
    simpo_gamma: float = 0.5,
    bco_delta: float = 0.0,
) -> torch.Tensor:
    """[P] per-pair losses of one loss type from the log-ratios ``c`` and ``r``.

    For ``ipo`` and ``simpo`` the caller passes token-mean log-probs (and, for simpo, the
    policy's alone: its log-ratios are the log-probs themselves).
    """
    c, r, b, e = chosen_logratio, rejected_logratio, beta, label_smoothing
    h = c - r
    if loss_type == "sigmoid":
        return -(1 - e) * F.logsigmoid(b * h) - e * F.logsigmoid(-b * h)
    if loss_type == "robust":
        return (-(1 - e) * F.logsigmoid(b * h) + e * F.logsigmoid(-b * h)) / (1 - 2 * e)
    if loss_type == "hinge":
        return torch.relu(1 - b * h)
    if loss_type == "ipo":
        return (h - 1 / (2 * b)) ** 2
    if loss_type == "bco_pair":
        return -F.logsigmoid(b * c - bco_delta) - F.logsigmoid(-(b * r - bco_delta))
    if loss_type == "sppo_hard":
        return (c - 1 / (2 * b)) ** 2 + (r + 1 / (2 * b)) ** 2
    if loss_type == "apo_zero":
        return (1 - torch.sigmoid(b * c)) + torch.sigmoid(b * r)
    if loss_type == "simpo":
        z = b * h - simpo_gamma
        return -(1 - e) * F.logsigmoid(z) - e * F.logsigmoid(-z)
    raise ValueError(f"unknown DPO loss type {loss_type!r}")


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor | None,
    reference_rejected: torch.Tensor | None,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    cfg: DPOConfig,
    bco_delta: float = 0.0,
) -> tuple[torch.Tensor, float, dict]:
    """The sum over pairs of ``sum_i w_i loss_i`` (+ ``rpo_alpha`` x chosen token-mean NLL),
    from [P] sequence log-prob sums and [P] trained-token counts; see the module docstring."""
    zeros = torch.zeros_like(policy_chosen)
    ref_c = reference_chosen if reference_chosen is not None else zeros
    ref_r = reference_rejected if reference_rejected is not None else zeros
    c_len = chosen_lengths.clamp(min=1).to(policy_chosen.dtype)
    r_len = rejected_lengths.clamp(min=1).to(policy_chosen.dtype)
    total = torch.zeros_like(policy_chosen)
    for loss_type, weight in zip(cfg.loss_types, cfg.weights, strict=True):
        if loss_type == "simpo":
            c, r = policy_chosen / c_len, policy_rejected / r_len
        elif loss_type == "ipo":
            c, r = (policy_chosen - ref_c) / c_len, (policy_rejected - ref_r) / r_len
        else:
            c, r = policy_chosen - ref_c, policy_rejected - ref_r
        total = total + weight * pair_losses(
            loss_type,
            c,
            r,
            beta=cfg.beta,
            label_smoothing=cfg.label_smoothing,
            simpo_gamma=cfg.simpo_gamma,
            bco_delta=bco_delta,
        )
    if cfg.rpo_alpha:
        total = total + cfg.rpo_alpha * (-policy_chosen / c_len)
    if cfg.needs_reference:
        chosen_rewards = cfg.beta * (policy_chosen - ref_c).detach()
        rejected_rewards = cfg.beta * (policy_rejected - ref_r).detach()
    else:
        chosen_rewards = cfg.beta * (policy_chosen / c_len).detach()
        rejected_rewards = cfg.beta * (policy_rejected / r_len).detach()
    metrics = preference_metrics(chosen_rewards, rejected_rewards, policy_chosen, policy_rejected)
    return total.sum(), float(policy_chosen.numel()), metrics


class DPO(Objective):
    name = "dpo"
    needs = Needs(data="pairs")  # with the reference's log-probs where the loss types need it

    def __init__(self, cfg: DPOConfig):
        super().__init__(cfg)
        if cfg.needs_reference:
            self.needs = Needs(data="pairs", frozen="logps", frozen_model=cfg.reference)
        # bco_pair's running mean of the rewards of every step so far
        self.reward_mean = 0.0
        self.reward_count = 0.0

    def count(self, batch) -> float:
        return float(batch.num_sequences // 2)

    def loss(self, out, batch, ref) -> LossOutput:
        chosen, rejected, chosen_lengths, rejected_lengths = pair_logps(out.token_logps, batch)
        ref_chosen = ref_rejected = None
        if "ref_logps" in batch.data:
            reference = batch.data["ref_logps"].to(chosen.device, chosen.dtype)
            ref_chosen, ref_rejected = reference[0::2], reference[1::2]
        elif ref is not None:
            ref_chosen, ref_rejected, _, _ = pair_logps(ref.token_logps.detach(), batch)
        total, count, metrics = dpo_loss(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            chosen_lengths,
            rejected_lengths,
            self.cfg,
            bco_delta=self.reward_mean,
        )
        return LossOutput(total, count, metrics)

    def end_step(self, sums: dict[str, tuple[float, float]]) -> None:
        if "bco_pair" not in self.cfg.loss_types:
            return
        added = sums["rewards/chosen"][0] + sums["rewards/rejected"][0]
        n = sums["rewards/chosen"][1] + sums["rewards/rejected"][1]
        self.reward_mean = (self.reward_mean * self.reward_count + added) / (self.reward_count + n)
        self.reward_count += n

    def state_dict(self) -> dict:
        return {"reward_mean": self.reward_mean, "reward_count": self.reward_count}

    def load_state_dict(self, state: dict) -> None:
        self.reward_mean = float(state.get("reward_mean", 0.0))
        self.reward_count = float(state.get("reward_count", 0.0))


OBJECTIVE = (DPOConfig, DPO)
