"""Anchored Supervised Fine-Tuning (ASFT): DFT's reweighting plus a KL anchor to a
frozen reference model.

    objective: {name: asft, kl_coef: 0.1, kl_direction: forward, reference: {path: null}}

Zhu et al. 2025, "Anchored Supervised Fine-Tuning" (arXiv:2509.23753, ICLR 2026). DFT
tightens the RL lower bound of SFT but has no anchor, so the policy drifts from where it
started; ASFT adds a token-level KL to the reference. Per trained token t::

    loss_t = -sg(p(y_t)) log p(y_t) + kl_coef * KL_t
    KL_t   = sum_v r(v) (log r(v) - log p(v))     kl_direction: forward (the authors' code)
           = sum_v p(v) (log p(v) - log r(v))     kl_direction: reverse (the paper's text)

with p the policy's and r the reference's next-token distribution over the whole
vocabulary, and the mean over the step's trained tokens. The KL is computed chunk by chunk
(:mod:`pt_train.logprobs`), never for the whole batch at once. With ``kl_coef: 0`` the
reference is not loaded and the loss is DFT's.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from pt_core.config import Section
from pt_train.objectives.base import LossOutput, Needs, Objective, mean_metric
from pt_train.objectives.dft import dft_loss
from pt_train.objectives.reference import ReferenceConfig


class ASFTConfig(Section):
    name: Literal["asft"] = "asft"
    kl_coef: float = Field(default=0.1, ge=0)  # the authors' train.sh default
    kl_direction: Literal["forward", "reverse"] = "forward"
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)

    @model_validator(mode="after")
    def _check(self):
        if self.reference.precompute:
            raise ValueError(
                "objective.reference.precompute: ASFT's anchor needs the reference's whole "
                "distribution at every token, which is not stored; set it to false"
            )
        # Keys at a value other than their default (a run's frozen config.yaml lists every
        # key, so that is what "given" can mean; a default changes nothing).
        given = self.model_dump(exclude_defaults=True)
        if self.kl_coef == 0:
            for key in ("kl_direction", "reference"):
                if key in given:
                    raise ValueError(
                        f"objective.{key} has no effect with kl_coef 0 (no KL anchor, no "
                        "reference model); set kl_coef > 0 or remove it"
                    )
        return self


def forward_kl(policy_logp: torch.Tensor, reference_logp: torch.Tensor) -> torch.Tensor:
    """[C, V] log-probs -> [C]: ``KL(r || p) = sum_v r (log r - log p)``."""
    return (reference_logp.exp() * (reference_logp - policy_logp)).sum(-1)


def reverse_kl(policy_logp: torch.Tensor, reference_logp: torch.Tensor) -> torch.Tensor:
    """[C, V] log-probs -> [C]: ``KL(p || r) = sum_v p (log p - log r)``."""
    return (policy_logp.exp() * (policy_logp - reference_logp)).sum(-1)


def asft_loss(
    token_logps: torch.Tensor, token_kl: torch.Tensor | None, kl_coef: float
) -> tuple[torch.Tensor, float, dict]:
    """``sum_t [-sg(p(y_t)) log p(y_t) + kl_coef * KL_t]`` over the trained tokens."""
    total, count, metrics = dft_loss(token_logps)
    if token_kl is not None and kl_coef:
        total = total + kl_coef * token_kl.sum()
        metrics["kl"] = mean_metric(token_kl)
    return total, count, metrics


class ASFT(Objective):
    name = "asft"

    def __init__(self, cfg: ASFTConfig):
        super().__init__(cfg)
        self.needs = Needs(
            frozen="dense" if cfg.kl_coef > 0 else "none",
            frozen_model=cfg.reference,
            frozen_as="anchor",
        )

    def dense(self):
        return forward_kl if self.cfg.kl_direction == "forward" else reverse_kl

    def loss(self, out, batch, ref) -> LossOutput:
        total, count, metrics = asft_loss(out.token_logps, out.dense, self.cfg.kl_coef)
        return LossOutput(total, count, metrics)


OBJECTIVE = (ASFTConfig, ASFT)
