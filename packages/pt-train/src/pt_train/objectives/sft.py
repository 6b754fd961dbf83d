"""Supervised fine-tuning: maximum likelihood on the demonstrations.

objective: {name: sft}
"""

from __future__ import annotations

from typing import Literal

import torch

from pt_core.config import Section
from pt_train.objectives.base import LossOutput, Objective


class SFTConfig(Section):
    name: Literal["sft"] = "sft"


def sft_loss(token_logps: torch.Tensor) -> tuple[torch.Tensor, float, dict]:
    """``sum_t -log p(y_t | y_<t, x)`` over the trained tokens ([N] log-probs in).

    Divided by the step's trained tokens, this is the usual token-mean cross-entropy.
    """
    nll = -token_logps
    return nll.sum(), float(token_logps.numel()), {}


class SFT(Objective):
    name = "sft"

    def loss(self, out, batch, ref) -> LossOutput:
        total, count, metrics = sft_loss(out.token_logps)
        return LossOutput(total, count, metrics)


OBJECTIVE = (SFTConfig, SFT)
