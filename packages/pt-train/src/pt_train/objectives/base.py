"""What every objective is: a config section, what the token head must compute, the
normalizer of the step, and a loss that is a pure function of log-probs and masks.

The trainer back-propagates ``loss_sum * world_size / global_count`` for every
micro-batch, where ``global_count`` is the sum of :meth:`Objective.count` over every
micro-batch of the step on every rank (known before any forward pass). So the gradient
is that of ``(sum of the step's losses) / (step's count)`` however the step is split into
micro-batches and ranks: tokens for SFT, pairs for DPO, sequences for GRPO.

Metrics come back as ``name -> (sum, count)`` so that the trainer adds them up over
micro-batches and ranks in one all-reduce before dividing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from pt_train.logprobs import HeadOutput, HeadRequest


@dataclass
class LossOutput:
    """A micro-batch's loss SUM, its count (the normalizer's share) and metric sums."""

    sum: torch.Tensor
    count: float
    metrics: dict[str, tuple[torch.Tensor | float, float]] = field(default_factory=dict)


def segment_sum(values: torch.Tensor, segments: torch.Tensor, num: int) -> torch.Tensor:
    """[N] values summed per segment id ([N], in ``0..num-1``) -> [num]."""
    out = values.new_zeros((num,), dtype=values.dtype)
    return out.index_add(0, segments, values)


def mean_metric(values: torch.Tensor) -> tuple[torch.Tensor, float]:
    """A metric that is the mean of ``values`` over the whole step."""
    return values.detach().double().sum(), float(values.numel())


class Objective:
    """Base class: subclasses set ``name``, ``data`` and ``reference`` and implement
    :meth:`loss`; :meth:`count` and :meth:`head` have token-level defaults."""

    name: ClassVar[str]
    # The rows the objective trains on: "tokens" (packed or single sequences with labels),
    # "pairs" (preference pairs), "rollouts" (sampled completions with their data).
    data: ClassVar[str] = "tokens"
    # "none"; "logps": the reference's log-probs of the same tokens; "dense": the
    # reference's whole distribution at every trained position. (An instance may set it
    # from its config.)
    reference: str = "none"
    # Objectives on rollouts: which log-probs of the sampled tokens the generator records
    # ("raw": the model's distribution, "processed": the one sampled from).
    logprobs_mode: str = "raw"

    def __init__(self, cfg: Any):
        self.cfg = cfg

    # Objectives on rollouts that update several times per round need the log-probs of the
    # weights each round starts from ("old_logps", computed by the producer).
    needs_old_logps: bool = False

    def configure(self, train_cfg) -> None:  # noqa: B027 (optional hook)
        """Read what the objective needs from the rest of the run's config."""

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the objective started (worker pools)."""

    def head(self, batch) -> dict:
        """Keyword arguments of :class:`HeadRequest` beyond the targets."""
        return {}

    def dense(self):
        """For ``reference == "dense"``: the function of (policy, reference) log-probs."""
        return None

    def frozen(self):
        """The frozen model beside the policy (a :class:`ReferenceConfig`), when
        ``reference`` is not "none": DPO's reference, ASFT's anchor, OPD's teacher."""
        return getattr(self.cfg, "reference", None)

    def required_columns(self) -> dict[str, str]:
        """For objectives on rollouts: the row columns they need, and how to get each."""
        return {}

    def process_round(self, rows: list[dict], round_index: int) -> dict:
        """For objectives on rollouts, in the online loop: add what the objective needs to a
        round's rows once they are generated (rewards, advantages), in place; return the
        round's metrics."""
        return {}

    def round_metrics(self, rows: list[dict]) -> dict:
        """Figures of a round's rows as they are trained on."""
        return {}

    def count(self, batch) -> float:
        """This micro-batch's share of the step's normalizer: trained tokens by default."""
        return float(batch.num_trained)

    def loss(self, out: HeadOutput, batch, ref: HeadOutput | None) -> LossOutput:
        raise NotImplementedError

    # Objectives with state that changes over training (a running mean) keep it here, so
    # that it is saved in full checkpoints and a resumed run continues exactly.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        pass

    def end_step(self, metrics: dict[str, float]) -> None:  # noqa: B027 (optional hook)
        """Called once per optimizer step with the step's reduced metrics."""


def request_for(objective: Objective, batch, *, chunk_mb: int) -> HeadRequest:
    return HeadRequest(targets=batch.targets, chunk_mb=chunk_mb, **objective.head(batch))
