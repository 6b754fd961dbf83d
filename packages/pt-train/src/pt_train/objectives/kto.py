"""Kahneman-Tversky Optimization (KTO; Ethayarajh et al. 2024), on completions labelled
desirable or undesirable, against a frozen reference.

    objective:
      name: kto
      beta: 0.1
      desirable_weight: 1.0      # lambda_D
      undesirable_weight: 1.0    # lambda_U
      kl: batch                  # batch | none: the reference point z0
      reference: {path: null, precompute: false}

KTO reads preference pairs as two labelled completions each: the chosen one desirable,
the rejected one undesirable (as TRL's KTOTrainer unpairs a paired dataset); nothing in
the loss couples the two. Per completion y of prompt x, with ``r = log pi(y|x) -
log ref(y|x)`` (summed over its trained tokens) and the reference point ``z0``::

    v = lambda_D s(beta (r - z0))     for a desirable y
    v = lambda_U s(beta (z0 - r))     for an undesirable y
    L = lambda_y - v

(Eq. 8 of the paper). The loss of a step is the mean over its completions (two per pair).
``z0`` estimates KL(pi || ref); it carries no gradient. The paper estimates it on
mismatched prompt/completion pairs of the batch; here (``kl: batch``) it is the mean of
``r`` over every completion of the micro-batch, clamped at 0, which needs no second
forward pass; ``kl: none`` sets it to 0 (TRL's ``calculate_KL=False``).

At initialisation (policy = reference: r = 0, z0 = 0) every completion's loss is
``lambda / 2``: 0.5 at the default weights. With unequal class counts the paper advises
``lambda_D n_D / (lambda_U n_U)`` in [1, 4/3].

Metrics: ``kl`` (z0), ``rewards/chosen`` ``beta r`` of the desirable completions,
``rewards/rejected`` of the undesirable ones, ``rewards/margins``,
``rewards/accuracies`` (desirable reward > undesirable reward, per pair),
``logps/chosen``, ``logps/rejected``.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from pt_core.config import Section
from pt_train.objectives.base import (
    LossOutput,
    Needs,
    Objective,
    pair_logps,
    preference_metrics,
)
from pt_train.objectives.reference import ReferenceConfig


class KTOConfig(Section):
    name: Literal["kto"] = "kto"
    beta: float = Field(default=0.1, gt=0)
    desirable_weight: float = Field(default=1.0, gt=0)
    undesirable_weight: float = Field(default=1.0, gt=0)
    kl: Literal["batch", "none"] = "batch"
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)


def kto_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    reference_chosen: torch.Tensor,
    reference_rejected: torch.Tensor,
    *,
    beta: float,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    kl: str = "batch",
) -> tuple[torch.Tensor, float, dict]:
    """The sum over completions of KTO's loss (see the module docstring), from [P] summed
    log-probs of the desirable (chosen) and undesirable (rejected) completions under the
    policy and the reference; the count is the number of completions, ``2P``."""
    r_d = policy_chosen - reference_chosen
    r_u = policy_rejected - reference_rejected
    if kl == "batch":
        z0 = torch.cat([r_d, r_u]).detach().mean().clamp(min=0)
    else:
        z0 = torch.zeros((), dtype=r_d.dtype, device=r_d.device)
    loss_d = desirable_weight * (1 - torch.sigmoid(beta * (r_d - z0)))
    loss_u = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r_u)))
    metrics = {
        "kl": (z0.detach().double(), 1.0),
        **preference_metrics(beta * r_d, beta * r_u, policy_chosen, policy_rejected),
    }
    return loss_d.sum() + loss_u.sum(), float(2 * policy_chosen.numel()), metrics


class KTO(Objective):
    name = "kto"

    def __init__(self, cfg: KTOConfig):
        super().__init__(cfg)
        self.needs = Needs(data="pairs", frozen="logps", frozen_model=cfg.reference)

    def count(self, batch) -> float:
        return float(batch.num_sequences)

    def loss(self, out, batch, ref) -> LossOutput:
        chosen, rejected, _, _ = pair_logps(out.token_logps, batch)
        if "ref_logps" in batch.data:
            reference = batch.data["ref_logps"].to(chosen.device, chosen.dtype)
            ref_chosen, ref_rejected = reference[0::2], reference[1::2]
        else:
            assert ref is not None  # the trainer runs the reference where none is stored
            ref_chosen, ref_rejected, _, _ = pair_logps(ref.token_logps.detach(), batch)
        cfg = self.cfg
        total, count, metrics = kto_loss(
            chosen,
            rejected,
            ref_chosen,
            ref_rejected,
            beta=cfg.beta,
            desirable_weight=cfg.desirable_weight,
            undesirable_weight=cfg.undesirable_weight,
            kl=cfg.kl,
        )
        return LossOutput(total, count, metrics)


OBJECTIVE = (KTOConfig, KTO)
