"""Dynamic Fine-Tuning (DFT).

    objective: {name: dft}

Wu et al. 2025, "On the Generalization of SFT: A Reinforcement Learning Perspective with
Reward Rectification" (arXiv:2508.05629), Eq. 9.
"""

from __future__ import annotations

from typing import Literal

import torch

from pt_core.config import Section
from pt_train.objectives.base import LossOutput, Objective, mean_metric


class DFTConfig(Section):
    name: Literal["dft"] = "dft"


def dft_loss(token_logps: torch.Tensor) -> tuple[torch.Tensor, float, dict]:
    """``sum_t -sg(p(y_t)) log p(y_t)``: each trained token's cross-entropy weighted by its
    own probability with the gradient stopped.

    The SFT gradient is a policy gradient with an implicit reward ``1/p``; multiplying by
    ``sg(p)`` rectifies it to a uniform reward. Metrics: ``ce_loss``, the plain
    cross-entropy of the same tokens, to see what the reweighting hides.
    """
    weight = token_logps.detach().exp()
    loss = -(weight * token_logps)
    return loss.sum(), float(token_logps.numel()), {"ce_loss": mean_metric(-token_logps)}


class DFT(Objective):
    name = "dft"

    def loss(self, out, batch, ref) -> LossOutput:
        total, count, metrics = dft_loss(out.token_logps)
        return LossOutput(total, count, metrics)


OBJECTIVE = (DFTConfig, DFT)
