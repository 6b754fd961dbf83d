"""Loss functions: pure, on logits and shifted targets, each returning a SUM over trained tokens.

The trainer divides that sum by the number of trained tokens in the whole
optimizer step (every micro-batch on every rank), so gradient accumulation and
data parallelism give exactly the gradient of one big batch (as in torchtitan).

Shapes: ``logits`` (..., vocab) and ``targets`` (...) with ``IGNORE_INDEX`` (-100)
where a position carries no loss; ``targets[t]`` is the token that follows
position ``t`` (already shifted).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from pt_core.contracts import IGNORE_INDEX


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-position negative log-likelihood ``-log p(y_t)`` in fp32; 0 where ignored."""
    vocab = logits.shape[-1]
    nll = F.cross_entropy(
        logits.reshape(-1, vocab).float(),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="none",
    )
    return nll.view(targets.shape)


def sft_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning: the cross-entropy ``-log p(y_t | y_<t, x)`` summed over
    trained tokens (maximum likelihood on the demonstrations)."""
    return token_nll(logits, targets).sum()


def dft_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Dynamic Fine-Tuning (DFT): each trained token's cross-entropy weighted by its own
    probability with the gradient stopped, ``-sg(p(y_t)) * log p(y_t)``, summed.

    Wu et al. 2025, "On the Generalization of SFT: A Reinforcement Learning
    Perspective with Reward Rectification" (arXiv:2508.05629), Eq. 9: the SFT
    gradient is a policy gradient with an implicit reward ``1/p``; multiplying
    by ``sg(p)`` rectifies it to a uniform reward. ``p`` is the model's
    probability of the target token, so ignored positions (nll 0, p 1) add 0.
    """
    nll = token_nll(logits, targets)
    prob = torch.exp(-nll).detach()
    return (prob * nll).sum()


LOSSES = {"sft": sft_loss, "dft": dft_loss}


def shift_targets(labels: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Targets for next-token prediction from labels aligned with the inputs.

    (batch, seq) -> (batch, seq - 1): ``targets[:, t] = labels[:, t + 1]``, except where
    token ``t + 1`` starts a new packed sequence (position 0): the last token of one
    sequence never learns to predict the first token of the next.
    """
    targets = labels[:, 1:].clone()
    targets[position_ids[:, 1:] == 0] = IGNORE_INDEX
    return targets
