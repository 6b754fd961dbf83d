"""Odds Ratio Preference Optimization (ORPO; Hong, Lee and Thorne 2024), on preference
pairs, with no reference model.

    objective:
      name: orpo
      beta: 0.1        # lambda of the paper (TRL's ``beta``): the weight of the odds-ratio term

Per pair, with ``a_c``/``a_r`` the policy's token-mean log-probs of the chosen / rejected
completion (``P = exp(a)`` the paper's length-normalised likelihood) and
``log odds(y) = a - log(1 - exp(a))``::

    L = -a_c  -  beta * log s(log odds(y_c) - log odds(y_r))

the chosen completion's token-mean NLL (the paper's L_SFT, Eq. 2) plus lambda times the
odds-ratio loss (Eq. 6-7). The loss of a step is the mean over its pairs. When the policy
gives both completions the same token-mean log-prob (e.g. the same completion), the
odds-ratio term is ``beta log 2``.

Metrics (means over the step's pairs), under TRL's names for TRL's quantities: ``nll``
(``-a_c``), ``log_odds_chosen`` (the log odds ratio ``log odds(y_c) - log odds(y_r)``),
``log_odds_ratio`` (its ``log s``, the odds-ratio term before beta), ``rewards/chosen``
``beta a_c``, ``rewards/rejected`` ``beta a_r``, ``rewards/margins``,
``rewards/accuracies``, ``logps/chosen``, ``logps/rejected`` (summed log-probs).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from pt_core.config import Section
from pt_train.objectives.base import (
    LossOutput,
    Needs,
    Objective,
    mean_metric,
    pair_logps,
    preference_metrics,
)


class ORPOConfig(Section):
    name: Literal["orpo"] = "orpo"
    beta: float = Field(default=0.1, gt=0)


def log_odds(mean_logps: torch.Tensor) -> torch.Tensor:
    """``log(P / (1 - P))`` of ``P = exp(mean_logps)`` (< 1), computed as
    ``a - log(-expm1(a))`` so that it stays finite as P approaches 0 or 1.

    A completion whose every trained token has log-prob exactly 0 (a certain token in
    float32, or no trained token at all) has ``a = 0``, where the log odds are infinite:
    ``a`` is clamped at ``-tiny`` (the dtype's smallest normal number, unchanged for every
    other value), so the loss stays finite and its gradient is not 0 x inf = nan."""
    a = mean_logps.clamp(max=-torch.finfo(mean_logps.dtype).tiny)
    return a - torch.log(-torch.expm1(a))


def orpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    *,
    beta: float,
) -> tuple[torch.Tensor, float, dict]:
    """The sum over pairs of ORPO's loss (see the module docstring), from [P] summed
    log-probs of the chosen and rejected completions and their [P] trained-token counts."""
    a_c = policy_chosen / chosen_lengths.clamp(min=1).to(policy_chosen.dtype)
    a_r = policy_rejected / rejected_lengths.clamp(min=1).to(policy_rejected.dtype)
    ratio = log_odds(a_c) - log_odds(a_r)
    odds_term = F.logsigmoid(ratio)
    per_pair = -a_c - beta * odds_term
    metrics = {
        "nll": mean_metric(-a_c),
        # TRL's names: log_odds_chosen is the log odds ratio, log_odds_ratio its log s
        "log_odds_chosen": mean_metric(ratio),
        "log_odds_ratio": mean_metric(odds_term),
        **preference_metrics(beta * a_c, beta * a_r, policy_chosen, policy_rejected),
    }
    return per_pair.sum(), float(policy_chosen.numel()), metrics


class ORPO(Objective):
    name = "orpo"
    needs = Needs(data="pairs")

    def count(self, batch) -> float:
        return float(batch.num_sequences // 2)

    def loss(self, out, batch, ref) -> LossOutput:
        chosen, rejected, chosen_lengths, rejected_lengths = pair_logps(out.token_logps, batch)
        total, count, metrics = orpo_loss(
            chosen, rejected, chosen_lengths, rejected_lengths, beta=self.cfg.beta
        )
        return LossOutput(total, count, metrics)


OBJECTIVE = (ORPOConfig, ORPO)
