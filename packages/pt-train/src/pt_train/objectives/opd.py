"""On-policy distillation (OPD): the student samples, a teacher scores, the student moves
toward the teacher on the tokens it produced.

    objective:
      name: opd
      loss: forward_kl        # reverse_kl | skewed_kl | jsd | token_kl | pg_reverse_kl
      support: teacher_topk   # student_topk | full (the teacher in-process)
      renormalize: false      # false: the mass outside a top-k is one more outcome
      alpha: 0.5              # skewed_kl
      beta: 0.5               # jsd
      clip_epsilon: 0.2       # pg_reverse_kl with importance_ratio
      importance_ratio: true  # pg_reverse_kl: ratio to the rollout log-probs
      advantage: rollout      # pg_reverse_kl: rollout | online
      reward_weight: 0.0      # > 0: add the task reward's policy gradient (online loop)
      teacher: {path: null, top_k: 8}

A key that the chosen loss does not read (``alpha`` without skewed_kl, ``beta`` without
jsd, the ``pg_reverse_kl`` keys with another loss, ``support``/``renormalize``/
``teacher.top_k`` with the sampled-token losses, ``teacher.top_k`` with ``support: full``)
is refused at start, when it is set to anything but its default.

Every loss is per completion token and the loss of a step is the mean over its completion
tokens, as in SFT. Notation at one position: ``T`` the teacher's and ``S`` the student's
next-token distribution, ``K`` the support, ``y`` the sampled token, ``O(y)`` its log-prob
under the policy that sampled it (the rollout's ``completion_logprobs``).

Temperature: in the online loop both distributions are taken at the temperature the
student sampled at (``rollout.temperature``, read once by the trainer): S by the token
head, T by the engine that scores (the HF engine; a generator process scores with it at a
temperature other than 1, since vLLM's prompt log-probs are at temperature 1 only), and
``O(y)`` is the log-prob of the distribution sampled from (the generator's processed
log-probs), so that the ratio and the advantage compare like with like. A loss that reads
``O(y)`` (pg_reverse_kl, a task reward) is refused with ``top_p`` < 1 or ``top_k`` > 0,
which truncate what was sampled from. Rollouts given as data (piped from ``pt-rollout
generate | pt-rollout score``) are trained at temperature 1: sample them at 1.

Over a support (``teacher_topk``: the teacher's k most likely tokens, from
``pt-rollout score --top-k``; ``student_topk``: the student's k most likely at rollout,
``pt-rollout generate --logprobs-top-k``, with the teacher's log-probs of them;
``full``: the whole vocabulary, the teacher run in-process):

- ``forward_kl``  ``KL(T || S) = sum T (log T - log S)`` (mode-covering);
- ``reverse_kl``  ``KL(S || T) = sum S (log S - log T)`` (mode-seeking);
- ``skewed_kl``   ``alpha * forward + (1 - alpha) * reverse``, the interpolation
  on-policy distillation trainers call skewed KL (after DistiLLM, Ko et al. 2024): alpha 1
  is forward, alpha 0 reverse;
- ``jsd``         ``beta KL(T || M) + (1 - beta) KL(S || M)``, ``M = beta T + (1 - beta) S``:
  the generalized Jensen-Shannon divergence of GKD (Agarwal et al. 2024, "On-Policy
  Distillation of Language Models: Learning from Self-Generated Mistakes", Eq. 6);
  ``0 < beta < 1`` (it vanishes at both ends; use forward_kl or reverse_kl there).

A top-k support K is part of the vocabulary, and a sum over K alone is not a divergence:
``sum_K S log(S/T)`` is lowest with ``T/e`` on each token of K and the rest of the
student's mass anywhere else, so it pushes the student off the teacher's top tokens even
where the student equals the teacher. Two ways close K into a distribution:

- ``renormalize: false`` (default), the tail bucket: the mass outside K, ``S_rest =
  1 - sum_K S`` and ``T_rest = 1 - sum_K T``, is one more outcome, so each mode above is
  the divergence of the (k + 1)-outcome distributions; reverse KL, for instance, is
  ``sum_K S log(S/T) + S_rest log(S_rest / T_rest)``. It keeps the teacher's confidence
  (how much of its mass K holds) and is at most the full-vocabulary divergence (the
  data-processing inequality). ``T_rest`` comes from the teacher's top-k log-probs,
  ``log T_rest = log(1 - exp(logsumexp_K log T))``, in float64 and floored at 1e-12 (a K
  that holds the whole vocabulary);
- ``renormalize: true``: S and T are conditioned on K (each divided by its mass there),
  the divergence of where each puts its mass within K, blind to how much K holds.

Either is 0, with gradient 0, when the student equals the teacher, and never negative.

On the sampled token alone:

- ``token_kl``    ``T(y) (log T(y) - log S(y))``: the sampled token's term of the forward
  KL, its gradient ``-T(y) grad log S(y)`` (a likelihood step weighted by the teacher);
- ``pg_reverse_kl`` a policy-gradient step on the reverse KL (Thinking Machines' on-policy
  distillation; Lu et al. 2025): the per-token advantage ``A = log T(y) - log O(y)``
  (``advantage: rollout``) or ``A = log T(y) - sg(log S(y))`` (``online``), and the loss
  ``-min(r A, clip(r, 1 - eps, 1 + eps) A)`` with ``r = exp(log S(y) - log O(y))``
  (``importance_ratio: true``), or ``-A log S(y)`` without it. On-policy (``O = S``) and
  unclipped its expected gradient is that of KL(S || T).

With a task reward (``reward_weight: w > 0``, the online loop, the run's ``reward:``
section: pt-eval's grader or a function, as GRPO's), each sample's reward ``R`` becomes a
group advantage ``A_R = (R - mean) / (std + 1e-4)`` over the samples of its prompt (GRPO's),
and every token of the sample adds ``-w * A_R * r``, ``r = exp(log S(y) - sg(log O(y)))``
(1 in value on-policy, where its gradient is REINFORCE's ``-w A_R grad log S(y)``), to the
distillation loss: the teacher says how to write, the grader what is right, for math
where the teacher is weaker than the grader. ``reward_loss`` logs that term per token;
``kl`` stays the divergence alone.

Each mode is 0 when the student equals the teacher. The teacher never gets a gradient:
its log-probs are data (from scoring) or computed without one (``support: full``).
Metrics: ``kl`` (the loss's divergence, per token), ``sampled_kl`` (``log S(y) - log T(y)``,
the single-sample estimate of KL(S || T) on the student's own tokens), for
``pg_reverse_kl`` ``advantage``, ``ratio`` and ``clip_fraction``, and in the online loop
``loss_fresh`` / ``loss_stale``: the per-token loss on samples generated by the weights of
their round's start and on older ones (``step_off`` and ``async`` schedules).

Stale samples (generated by weights some updates old). Every divergence above computes the
student's side, S, under the current weights at training time, over the positions of the
sampled completion: only the positions are stale. ``pg_reverse_kl`` with ``advantage:
rollout`` also reads ``log O(y)``, the sampler's log-prob, in its advantage: an estimate of
the reverse KL of the old policy, which grows wrong with staleness (AsyncOPD finds reverse KL
fragile to stale samples for this reason). ``advantage: online`` recomputes that side under
the current weights, ``A = log T(y) - sg(log S(y))``, while the importance ratio still
corrects for sampling from O; at staleness 0 (O = S) the two are the same loss and gradient.
So: with ``sync``, any mode; with ``step_off`` or ``async``, a divergence over a support, or
``pg_reverse_kl`` with ``advantage: online``.
"""

from __future__ import annotations

import math
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
    TeacherScores,
    mean_metric,
)

DIVERGENCES = ("forward_kl", "reverse_kl", "skewed_kl", "jsd")
# The least tail mass log_tail_mass gives: below it a top-k covers the vocabulary.
TAIL_FLOOR = 1e-12


class TeacherConfig(Section):
    """The teacher: ``path`` (a local directory or hub name) for the online loop and for
    ``support: full`` (run in-process); ``top_k``: the size of a top-k support, which the
    online loop asks its scoring engine (or, for ``student_topk``, its generator) for;
    on piped scored rollouts, when given, the first ``top_k`` of each position's list (an
    error where the lists are shorter), else the whole list."""

    path: str | None = None
    top_k: int = Field(default=8, ge=1)
    dtype: str | None = None


class OPDConfig(Section):
    name: Literal["opd"] = "opd"
    loss: Literal["forward_kl", "reverse_kl", "skewed_kl", "jsd", "token_kl", "pg_reverse_kl"] = (
        "forward_kl"
    )
    support: Literal["teacher_topk", "student_topk", "full"] = "teacher_topk"
    renormalize: bool = False
    alpha: float = Field(default=0.5, ge=0, le=1)
    beta: float = Field(default=0.5, gt=0, lt=1)
    clip_epsilon: float = Field(default=0.2, gt=0)
    importance_ratio: bool = True
    advantage: Literal["rollout", "online"] = "rollout"
    reward_weight: float = Field(default=0.0, ge=0)
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)

    @model_validator(mode="after")
    def _check(self):
        if self.support == "full" and self.loss in DIVERGENCES and self.teacher.path is None:
            raise ValueError(
                "support: full runs the teacher in-process: set objective.teacher.path"
            )
        if self.support == "full" and self.renormalize:
            raise ValueError("renormalize applies to a top-k support, not to support: full")
        # Keys at a value other than their default (a run's frozen config.yaml lists every
        # key, so "given" cannot mean "written by the user"; a default changes nothing).
        given = self.model_dump(exclude_defaults=True)
        pg = self.loss == "pg_reverse_kl"
        used = {
            "alpha": (self.loss == "skewed_kl", "loss: skewed_kl"),
            "beta": (self.loss == "jsd", "loss: jsd"),
            "clip_epsilon": (
                pg and self.importance_ratio,
                "loss: pg_reverse_kl with importance_ratio: true",
            ),
            "importance_ratio": (pg, "loss: pg_reverse_kl"),
            "advantage": (pg, "loss: pg_reverse_kl"),
            "support": (self.loss in DIVERGENCES, "the divergences " + ", ".join(DIVERGENCES)),
            "renormalize": (self.loss in DIVERGENCES, "the divergences on a top-k support"),
        }
        for key, (applies, where) in used.items():
            if key in given and not applies:
                raise ValueError(
                    f"objective.{key}={getattr(self, key)} has no effect with loss: "
                    f"{self.loss}{', importance_ratio: false' if pg else ''}: it applies "
                    f"to {where}; remove it"
                )
        if "top_k" in given.get("teacher", {}) and (
            self.loss not in DIVERGENCES or self.support == "full"
        ):
            raise ValueError(
                f"objective.teacher.top_k={self.teacher.top_k} has no effect with loss: "
                f"{self.loss}, support: {self.support}; remove it (it sizes a top-k support)"
            )
        if "dtype" in given.get("teacher", {}) and not (
            self.support == "full" and self.loss in DIVERGENCES
        ):
            raise ValueError(
                f"objective.teacher.dtype={self.teacher.dtype} has no effect with loss: "
                f"{self.loss}, support: {self.support}; remove it (it is the dtype of the teacher "
                "run in-process, support: full)"
            )
        return self


# --------------------------------------------------------------------------- pure losses


def log_tail_mass(logps: torch.Tensor) -> torch.Tensor:
    """[..., K] log-probs of K tokens -> [...] ``log(1 - sum_K p)``, the log-mass of every
    other token, in float64: where K holds nearly all the mass, ``1 - exp(logsumexp)``
    in float32 would be mostly rounding error. The mass is floored at ``TAIL_FLOOR`` so
    that a K that covers the vocabulary (or log-probs that sum to a hair over 1) gives a
    finite log of an empty tail instead of ``-inf`` or NaN."""
    covered = torch.logsumexp(logps.double(), dim=-1).clamp(max=math.log1p(-TAIL_FLOOR))
    # log(1 - e^x) for x <= 0: log(-expm1(x)) is exact near 0, log1p(-exp(x)) far below it
    near_one = covered > -math.log(2)
    tail = torch.where(
        near_one,
        torch.log(-torch.expm1(covered.clamp(min=-math.log(2)))),
        torch.log1p(-torch.exp(covered.clamp(max=-math.log(2)))),
    )
    return tail.to(logps.dtype)


def divergence(
    kind: str,
    student: torch.Tensor,
    teacher: torch.Tensor,
    *,
    alpha: float = 0.5,
    beta: float = 0.5,
    renormalize: bool = False,
    tail: bool = False,
) -> torch.Tensor:
    """[..., K] log-probs of the same K tokens under S and T -> [...] divergence.

    The K tokens are the whole vocabulary unless ``renormalize`` (S and T conditioned on
    K) or ``tail`` (the mass outside K as one more outcome) says they are a part of it:
    a sum over part of the vocabulary alone is not a divergence."""
    assert not (renormalize and tail), "renormalize and tail are two ways to close a support"
    if renormalize:
        student = student - torch.logsumexp(student, dim=-1, keepdim=True)
        teacher = teacher - torch.logsumexp(teacher, dim=-1, keepdim=True)
    elif tail:
        # [..., K] -> [..., K + 1]: the tail bucket is the last outcome
        student = torch.cat([student, log_tail_mass(student).unsqueeze(-1)], dim=-1)
        teacher = torch.cat([teacher, log_tail_mass(teacher).unsqueeze(-1)], dim=-1)
    teacher = teacher.detach()
    if kind == "forward_kl":
        return (teacher.exp() * (teacher - student)).sum(-1)
    if kind == "reverse_kl":
        return (student.exp() * (student - teacher)).sum(-1)
    if kind == "skewed_kl":
        forward = (teacher.exp() * (teacher - student)).sum(-1)
        reverse = (student.exp() * (student - teacher)).sum(-1)
        return alpha * forward + (1 - alpha) * reverse
    if kind == "jsd":
        mixture = torch.logaddexp(teacher + math.log(beta), student + math.log(1 - beta))
        return beta * (teacher.exp() * (teacher - mixture)).sum(-1) + (1 - beta) * (
            student.exp() * (student - mixture)
        ).sum(-1)
    raise ValueError(f"unknown divergence {kind!r}")


def token_kl(student_token: torch.Tensor, teacher_token: torch.Tensor) -> torch.Tensor:
    """[N] ``T(y) (log T(y) - log S(y))`` on the sampled tokens."""
    teacher_token = teacher_token.detach()
    return teacher_token.exp() * (teacher_token - student_token)


def pg_reverse_kl(
    student_token: torch.Tensor,
    teacher_token: torch.Tensor,
    rollout_token: torch.Tensor | None,
    *,
    clip_epsilon: float,
    importance_ratio: bool,
    advantage: str,
) -> tuple[torch.Tensor, dict]:
    """[N] per-token clipped policy-gradient loss with ``A = log T(y) - log O(y)`` (or
    ``- sg(log S(y))`` online); see the module docstring."""
    if advantage == "online" or rollout_token is None:
        baseline = student_token.detach()
    else:
        baseline = rollout_token
    adv = (teacher_token - baseline).detach()
    if not importance_ratio:
        return -adv * student_token, {"advantage": mean_metric(adv)}
    old = rollout_token if rollout_token is not None else student_token.detach()
    ratio = torch.exp(student_token - old)
    clipped = ratio.clamp(1 - clip_epsilon, 1 + clip_epsilon)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    # where the clipped term is the smaller one, the token's gradient is zero
    clip_hit = ((ratio > 1 + clip_epsilon) & (adv > 0)) | ((ratio < 1 - clip_epsilon) & (adv < 0))
    return loss, {
        "advantage": mean_metric(adv),
        "ratio": mean_metric(ratio.detach()),
        "clip_fraction": mean_metric(clip_hit.double()),
    }


# --------------------------------------------------------------------------- objective


class OPD(Objective):
    name = "opd"
    needs = Needs(data="rollouts")  # in full once configured

    def __init__(self, cfg: OPDConfig):
        super().__init__(cfg)
        # The size of a top-k support where the config gives one; else the data's width.
        given = cfg.teacher.model_dump(exclude_defaults=True)
        self.top_k = cfg.teacher.top_k if "top_k" in given else None

    def columns(self) -> dict[str, str]:
        """Row columns the rollouts must carry, and how to get each."""
        cfg = self.cfg
        need = {}
        if cfg.reward_weight > 0:
            need["completion_logprobs"] = "the online loop records them (rollout.prompts)"
        if cfg.loss in ("token_kl", "pg_reverse_kl"):
            need["teacher_token_logprobs"] = "score the rollouts: pt-rollout score --teacher T"
        elif cfg.support == "teacher_topk":
            need["teacher_topk_ids"] = "score with the teacher's top-k: pt-rollout score --top-k K"
            need["teacher_topk_logprobs"] = need["teacher_topk_ids"]
        elif cfg.support == "student_topk":
            how = (
                "generate with pt-rollout generate --logprobs-top-k K, then score with "
                "pt-rollout score --at-student-topk"
            )
            need["student_topk_ids"] = how
            need["teacher_student_topk_logprobs"] = how
        if cfg.loss == "pg_reverse_kl" and cfg.advantage == "rollout":
            need["completion_logprobs"] = "generate with pt-rollout generate --logprobs"
        need.setdefault(
            "teacher_token_logprobs", "score the rollouts: pt-rollout score --teacher T"
        )
        return need

    def reads_sampled_logps(self) -> bool:
        """Whether the loss reads ``log O(y)``, the sampled token's log-prob under the
        distribution it was drawn from: pg_reverse_kl's ratio and advantage, the task
        reward's ratio."""
        return self.cfg.loss == "pg_reverse_kl" or self.cfg.reward_weight > 0

    def declare(self, temperature: float = 1.0) -> Needs:
        """What the trainer and the online loop provide: the teacher's scores of every
        round (its top-k, or its log-probs of the student's top-k) at the sampling
        ``temperature``, or, with ``support: full``, the teacher in-process as the frozen
        model with its whole distribution; the sampled log-probs of the distribution
        sampled from, where the loss reads them."""
        from pt_train.objectives.reference import ReferenceConfig

        cfg = self.cfg
        columns = self.columns()
        dense = cfg.support == "full" and cfg.loss in DIVERGENCES
        return Needs(
            data="rollouts",
            frozen="dense" if dense else "none",
            frozen_model=ReferenceConfig(path=cfg.teacher.path, dtype=cfg.teacher.dtype),
            frozen_as="teacher",
            columns=columns,
            logprobs_mode="processed" if self.reads_sampled_logps() else "raw",
            student_top_k=cfg.teacher.top_k if cfg.support == "student_topk" else 0,
            teacher=TeacherScores(
                path=cfg.teacher.path,
                top_k=cfg.teacher.top_k if "teacher_topk_ids" in columns else 0,
                at_student_topk="teacher_student_topk_logprobs" in columns,
                temperature=temperature,
            ),
            reward=cfg.reward_weight > 0,
        )

    def prepare_round(self, rows: list[dict]) -> None:
        """With a task reward: each row's group advantage, GRPO's, over its prompt's samples."""
        if self.cfg.reward_weight <= 0:
            return
        from pt_train.objectives.grpo import _group_key, group_advantages

        rewards = np.array([r["reward"] for r in rows], dtype=np.float64)
        groups = np.array([_group_key(r) for r in rows])
        advantages, _ = group_advantages(rewards, groups, "group")
        for row, advantage in zip(rows, advantages, strict=True):
            row["advantage"] = float(advantage)

    def configure(self, train_cfg) -> None:
        """Declare the needs at the sampling temperature; refuse a truncated sampling where
        the loss reads the sampled log-probs; on scored rollouts given as data, refuse a
        ``teacher.top_k`` wider than their lists now, from the first row, rather than at
        the first step."""
        self.needs = self.declare(train_cfg.sampling_temperature)
        rollout = train_cfg.rollout
        if rollout.prompts is not None and rollout.temperature == 0 and self.reads_sampled_logps():
            why = (
                f"loss: {self.cfg.loss}" if self.cfg.loss == "pg_reverse_kl"
                else f"reward_weight={self.cfg.reward_weight}"
            )  # fmt: skip
            raise ConfigError(
                f"objective opd with {why} is a policy gradient over samples drawn from the "
                "student's distribution; rollout.temperature=0 is greedy and draws none",
                hint="set rollout.temperature > 0 (1.0 samples the model as it is), or use a "
                "divergence loss (forward_kl, reverse_kl, jsd)",
            )
        if rollout.prompts is not None and rollout.truncated and self.reads_sampled_logps():
            why = (
                f"loss: {self.cfg.loss}" if self.cfg.loss == "pg_reverse_kl"
                else f"reward_weight={self.cfg.reward_weight}"
            )  # fmt: skip
            raise ConfigError(
                f"objective opd with {why} divides the policy's log-probs by those of the "
                f"distribution the samples were drawn from; rollout.top_p={rollout.top_p} / "
                f"top_k={rollout.top_k} truncate it, and the trainer's log-probs are over the "
                "whole vocabulary",
                hint="set rollout.top_p: 1.0 and rollout.top_k: 0 (temperature alone is "
                "computed alike on both sides), or use a divergence loss",
            )
        if self.cfg.reward_weight > 0:
            if train_cfg.rollout.prompts is None:
                raise ConfigError(
                    f"objective.reward_weight={self.cfg.reward_weight} rewards the student's "
                    "own samples, graded as they are drawn: it needs the online loop",
                    hint="set rollout.prompts, or remove objective.reward_weight",
                )
            if train_cfg.rollout.samples_per_prompt < 2:
                raise ConfigError(
                    f"objective.reward_weight={self.cfg.reward_weight} with "
                    "rollout.samples_per_prompt=1: a reward's advantage is relative to the "
                    "other samples of its prompt, so one sample has advantage 0",
                    hint="set rollout.samples_per_prompt to 2 or more",
                )
        if train_cfg.data.path is None or train_cfg.rollout.prompts is not None:
            return
        from pt_core.files import iter_rows, split_path

        source = split_path(train_cfg.data.path, train_cfg.data.split)
        first = next(iter_rows(source), None) or {}
        self._check_scorer(first.get("teacher_model"), source)
        column = self._support_ids_column()
        if column is None or self.top_k is None:
            return
        lists = first.get(column)
        if lists:
            self._check_width(len(lists[0]), self.top_k, column, f"{source}: ")

    def _check_scorer(self, scored_by: str | None, source) -> None:
        """``teacher.path`` on scored rollouts names the model that scored them, or nothing:
        the run trains toward the scores in the rows, whatever the config says."""
        from pathlib import Path

        named = self.cfg.teacher.path
        if named is None or scored_by is None:
            return
        named_as = str(Path(named).resolve()) if Path(named).is_dir() else named
        if named_as != scored_by:
            raise ConfigError(
                f"{source}: objective.teacher.path={named}, but the rollouts were scored by "
                f"{scored_by}; the run would train toward that model, not {named}",
                hint="drop objective.teacher.path (the scores in the rows are used), or "
                f"score the rollouts with pt-rollout score --teacher {named}",
            )

    def _support_ids_column(self) -> str | None:
        if self.cfg.loss not in DIVERGENCES or self.cfg.support == "full":
            return None
        return "teacher_topk_ids" if self.cfg.support == "teacher_topk" else "student_topk_ids"

    def _check_width(self, width: int, top_k: int, column: str, where: str = "") -> None:
        if width < top_k:
            raise ConfigError(
                f"{where}objective.teacher.top_k={top_k}, but the rollouts' {column} hold "
                f"{width} tokens per position",
                hint=f"set objective.teacher.top_k to at most {width}, or score (generate) "
                f"the rollouts with a top-k of at least {top_k}",
            )

    def support_columns(self, batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """[N, K] ids and the teacher's [N, K] log-probs of a top-k support, cut to
        ``teacher.top_k`` where the config gives one (the lists are most likely first);
        None for the other losses and supports."""
        column = self._support_ids_column()
        if column is None:
            return None
        ids = batch.data[column]
        logps = batch.data[
            "teacher_topk_logps" if column == "teacher_topk_ids" else "teacher_student_topk_logps"
        ]
        if self.top_k is None:
            return ids, logps
        self._check_width(ids.shape[-1], self.top_k, column)
        return ids[..., : self.top_k], logps[..., : self.top_k]

    def head(self, batch) -> dict:
        support = self.support_columns(batch)
        return {"extra_ids": support[0] if support else None}

    def dense(self):
        cfg = self.cfg

        def fn(policy_logp, teacher_logp):
            return divergence(cfg.loss, policy_logp, teacher_logp, alpha=cfg.alpha, beta=cfg.beta)

        return fn

    def loss(self, out, batch, ref) -> LossOutput:
        cfg = self.cfg
        student_token = out.token_logps
        teacher_token = batch.data.get("teacher_token_logps")
        metrics = {}
        if teacher_token is not None:
            teacher_token = teacher_token.to(student_token.dtype)
            metrics["sampled_kl"] = mean_metric(student_token.detach() - teacher_token)
        if cfg.loss in DIVERGENCES:
            if cfg.support == "full":
                per_token = out.dense
                if per_token is None:  # declared frozen="dense": the head computes it
                    raise RuntimeError("support: full, but the head computed no dense term")
            else:
                support = self.support_columns(batch)
                assert support is not None  # a divergence on a top-k support
                per_token = divergence(
                    cfg.loss,
                    out.logps[:, 1:],
                    support[1].to(student_token.dtype),
                    alpha=cfg.alpha,
                    beta=cfg.beta,
                    renormalize=cfg.renormalize,
                    tail=not cfg.renormalize,
                )
            metrics["kl"] = mean_metric(per_token)
        elif cfg.loss == "token_kl":
            assert teacher_token is not None  # a column it requires (columns())
            per_token = token_kl(student_token, teacher_token)
            metrics["kl"] = mean_metric(per_token)
        else:
            assert teacher_token is not None  # a column it requires (columns())
            rollout = batch.data.get("rollout_logps")
            per_token, pg_metrics = pg_reverse_kl(
                student_token,
                teacher_token,
                rollout.to(student_token.dtype) if rollout is not None else None,
                clip_epsilon=cfg.clip_epsilon,
                importance_ratio=cfg.importance_ratio,
                advantage=cfg.advantage,
            )
            metrics.update(pg_metrics)
        if cfg.reward_weight > 0:
            advantage = batch.data["advantages"].to(student_token)[batch.token_sequence]
            rollout = batch.data.get("rollout_logps")
            old = rollout.to(student_token.dtype) if rollout is not None else student_token
            reward_term = -advantage * torch.exp(student_token - old.detach())
            metrics["reward_loss"] = mean_metric(reward_term)
            per_token = per_token + cfg.reward_weight * reward_term
        metrics.update(staleness_metrics(per_token, batch))
        return LossOutput(per_token.sum(), float(student_token.numel()), metrics)


def staleness_metrics(per_token: torch.Tensor, batch) -> dict:
    """The per-token loss of the step split by the staleness of the sample each token is of
    (the online loop's ``staleness``: updates between the weights that generated it and
    those at its round's start): ``loss_fresh`` on samples of staleness 0, ``loss_stale``
    on older ones (None in a step that has none). Both keys on every step of a run whose
    rows carry a staleness, so every rank reduces the same metrics."""
    staleness = batch.data.get("staleness")
    if staleness is None:
        return {}
    stale = staleness.to(per_token.device)[batch.token_sequence] > 0
    values = per_token.detach().double()
    return {
        "loss_fresh": (values[~stale].sum(), float((~stale).sum())),
        "loss_stale": (values[stale].sum(), float(stale.sum())),
    }


OBJECTIVE = (OPDConfig, OPD)
