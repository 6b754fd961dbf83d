"""What every objective is: a config section, a declaration of what it needs, and a loss
that is a pure function of log-probs and masks.

The trainer and the online loop read an objective's :class:`Needs` and nothing else
about it: which rows it trains on, which frozen model runs beside the policy and what
that model must compute, what the online loop must add to each round (a teacher's
scores, rewards). No objective is known to them by name; a new objective that needs no
new data kind is its own module and one line in the registry
(:mod:`pt_train.objectives`).

The trainer back-propagates ``loss_sum * world_size / global_count`` for every
micro-batch, where ``global_count`` is the sum of :meth:`Objective.count` over every
micro-batch of the step on every rank (known before any forward pass). So the gradient
is that of ``(sum of the step's losses) / (step's count)`` however the step is split into
micro-batches and ranks: tokens for SFT, pairs for DPO, sequences for GRPO.

Metrics come back as ``name -> (sum, count)`` so that the trainer adds them up over
micro-batches and ranks in one all-reduce before dividing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from pt_train.logprobs import HeadOutput


@dataclass(frozen=True)
class TeacherScores:
    """What the online loop asks a teacher model for, for every sampled token: its
    log-prob of the token, and its ``top_k`` most likely tokens with their log-probs, or
    its log-probs of the student's own top-k (``at_student_topk``), all under its
    distribution at ``temperature`` (the one the student sampled at)."""

    path: str | None
    top_k: int = 0
    at_student_topk: bool = False
    temperature: float = 1.0


@dataclass(frozen=True)
class Needs:
    """An objective's declaration: what the trainer and the online loop must provide."""

    # The rows it trains on: "tokens" (sequences with labels, packed or not), "pairs"
    # (preference pairs: chosen, rejected), "rollouts" (sampled completions with their data;
    # the online loop makes them when ``rollout.prompts`` is set).
    data: Literal["tokens", "pairs", "rollouts"] = "tokens"
    # The frozen model beside the policy, and what it computes at the trained positions:
    # "none"; "logps": its log-probs of the same tokens; "dense": its whole distribution
    # (the loss reads it through :meth:`Objective.dense`).
    frozen: Literal["none", "logps", "dense"] = "none"
    # The frozen model's config (path, precompute, dtype) and the name logs and errors
    # give it (DPO's "reference", ASFT's "anchor", OPD's "teacher").
    frozen_model: Any = None
    frozen_as: str = "reference"
    # Rollouts: the row columns the loss reads, and how a user gets each.
    columns: Mapping[str, str] = field(default_factory=dict)
    # Rollouts: which log-probs of the sampled tokens the generator records ("raw": the
    # model's distribution; "processed": the one sampled from, after temperature).
    logprobs_mode: Literal["raw", "processed"] = "raw"
    # Rollouts trained by several updates per round: the log-probs of the weights each
    # round starts from ("old_logps", computed by the online loop).
    old_logps: bool = False
    # The online loop: the student's top-k at every sampled position, recorded by the
    # generator (0: none); a teacher's scores; rewards from the run's reward component.
    student_top_k: int = 0
    teacher: TeacherScores | None = None
    reward: bool = False
    # The online loop's dynamic sampling (DAPO): groups of equal reward are dropped and the
    # round topped up from further prompts, at most this many times (0: off).
    regroup_tries: int = 0


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


def preference_metrics(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
) -> dict:
    """The figures every preference objective logs, as TRL names them: the [P] implicit
    rewards of the chosen and rejected completions, their margin and how often the chosen
    one's is higher, and the [P] summed log-probs of each."""
    chosen_rewards, rejected_rewards = chosen_rewards.detach(), rejected_rewards.detach()
    return {
        "rewards/chosen": mean_metric(chosen_rewards),
        "rewards/rejected": mean_metric(rejected_rewards),
        "rewards/margins": mean_metric(chosen_rewards - rejected_rewards),
        "rewards/accuracies": mean_metric((chosen_rewards > rejected_rewards).double()),
        "logps/chosen": mean_metric(policy_chosen),
        "logps/rejected": mean_metric(policy_rejected),
    }


def pair_logps(token_logps: torch.Tensor, batch):
    """A batch of preference pairs (sequences laid out chosen, rejected, chosen, ...): the
    [P] summed log-probs of the chosen and of the rejected completions, and their [P]
    trained-token counts."""
    sequences = batch.num_sequences
    lengths = torch.bincount(batch.token_sequence, minlength=sequences)
    sums = segment_sum(token_logps, batch.token_sequence, sequences)
    return sums[0::2], sums[1::2], lengths[0::2], lengths[1::2]


class Objective:
    """Base class: a subclass sets ``name`` and ``needs`` (or declares its needs from its
    config in ``__init__`` / :meth:`configure`) and implements :meth:`loss`;
    :meth:`count` and :meth:`head` have token-level defaults."""

    name: ClassVar[str]
    needs: Needs = Needs()

    def __init__(self, cfg: Any):
        self.cfg = cfg

    def configure(self, train_cfg) -> None:  # noqa: B027 (optional hook)
        """Read what the objective needs from the rest of the run's config (and declare
        it in ``self.needs``); refuse combinations that cannot work."""

    def head(self, batch) -> dict:
        """Keyword arguments of :class:`HeadRequest` beyond the targets and temperature."""
        return {}

    def dense(self):
        """For ``needs.frozen == "dense"``: the function of (policy, frozen) log-probs."""
        return None

    def count(self, batch) -> float:
        """This micro-batch's share of the step's normalizer: trained tokens by default."""
        return float(batch.num_trained)

    def loss(self, out: HeadOutput, batch, ref: HeadOutput | None) -> LossOutput:
        raise NotImplementedError

    def prepare_round(self, rows: list[dict]) -> None:  # noqa: B027 (optional hook)
        """The online loop, once a round's rows are generated, scored and rewarded: add the
        columns the loss reads that follow from the whole round (GRPO's group
        advantages), in place."""

    # Objectives with state that changes over training (a running mean) keep it here, so
    # that it is saved in full checkpoints and a resumed run continues exactly.
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        pass

    def end_step(self, metrics: dict[str, tuple[float, float]]) -> None:  # noqa: B027 (optional hook)
        """Called once per optimizer step with the step's reduced metrics, ``name -> (sum,
        count)``."""
