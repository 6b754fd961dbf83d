"""On-policy distillation (OPD): the student samples, a teacher scores, the student moves
toward the teacher on the tokens it produced.

    objective:
      name: opd
      loss: forward_kl        # reverse_kl | skewed_kl | jsd | token_kl | pg_reverse_kl
      support: teacher_topk   # student_topk | full (the teacher in-process)
      renormalize: false
      alpha: 0.5              # skewed_kl
      beta: 0.5               # jsd
      clip_epsilon: 0.2       # pg_reverse_kl
      importance_ratio: true  # pg_reverse_kl: ratio to the rollout log-probs
      advantage: rollout      # pg_reverse_kl: rollout | online
      teacher: {path: null, top_k: 8}

Every loss is per completion token and the loss of a step is the mean over its completion
tokens, as in SFT. Notation at one position: ``T`` the teacher's and ``S`` the student's
next-token distribution (both at the sampling temperature), ``K`` the support, ``y`` the
sampled token, ``O(y)`` its log-prob under the policy that sampled it (the rollout's
``completion_logprobs``).

Over a support (``teacher_topk``: the teacher's k most likely tokens, from
``pt-rollout score --top-k``; ``student_topk``: the student's k most likely at rollout,
``pt-rollout generate --logprobs-top-k``, with the teacher's log-probs of them;
``full``: the whole vocabulary, the teacher run in-process):

- ``forward_kl``  ``sum_K T (log T - log S)``: KL(T || S) restricted to K (mode-covering);
- ``reverse_kl``  ``sum_K S (log S - log T)``: KL(S || T) restricted to K (mode-seeking);
- ``skewed_kl``   ``alpha * forward + (1 - alpha) * reverse``, the interpolation
  on-policy distillation trainers call skewed KL (after DistiLLM, Ko et al. 2024): alpha 1
  is forward, alpha 0 reverse;
- ``jsd``         ``beta KL(T || M) + (1 - beta) KL(S || M)``, ``M = beta T + (1 - beta) S``:
  the generalized Jensen-Shannon divergence of GKD (Agarwal et al. 2024, "On-Policy
  Distillation of Language Models: Learning from Self-Generated Mistakes", Eq. 6);
  ``0 < beta < 1`` (it vanishes at both ends; use forward_kl or reverse_kl there).

With ``renormalize: true`` T and S are first renormalised over K (each sums to 1 there);
by default they are not, so the sums are the part of each divergence that K carries.

On the sampled token alone:

- ``token_kl``    ``T(y) (log T(y) - log S(y))``: the sampled token's term of the forward
  KL, its gradient ``-T(y) grad log S(y)`` (a likelihood step weighted by the teacher);
- ``pg_reverse_kl`` a policy-gradient step on the reverse KL (Thinking Machines' on-policy
  distillation; Lu et al. 2025): the per-token advantage ``A = log T(y) - log O(y)``
  (``advantage: rollout``) or ``A = log T(y) - sg(log S(y))`` (``online``), and the loss
  ``-min(r A, clip(r, 1 - eps, 1 + eps) A)`` with ``r = exp(log S(y) - log O(y))``
  (``importance_ratio: true``), or ``-A log S(y)`` without it. On-policy (``O = S``) and
  unclipped its expected gradient is that of KL(S || T).

Each mode is 0 when the student equals the teacher. The teacher never gets a gradient:
its log-probs are data (from scoring) or computed without one (``support: full``).
Metrics: ``kl`` (the loss's divergence, per token), ``sampled_kl`` (``log S(y) - log T(y)``,
the single-sample estimate of KL(S || T) on the student's own tokens), and for
``pg_reverse_kl`` ``advantage``, ``ratio`` and ``clip_fraction``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator

from pt_core.config import Section
from pt_train.objectives.base import LossOutput, Objective, mean_metric

DIVERGENCES = ("forward_kl", "reverse_kl", "skewed_kl", "jsd")


class TeacherConfig(Section):
    """The teacher: ``path`` (a local directory or hub name) for the online loop and for
    ``support: full`` (run in-process); ``top_k`` of its log-probs that the online loop
    asks its scoring engine for."""

    path: str | None = None
    top_k: int = Field(8, ge=1)
    dtype: str | None = None


class OPDConfig(Section):
    name: Literal["opd"] = "opd"
    loss: Literal["forward_kl", "reverse_kl", "skewed_kl", "jsd", "token_kl", "pg_reverse_kl"] = (
        "forward_kl"
    )
    support: Literal["teacher_topk", "student_topk", "full"] = "teacher_topk"
    renormalize: bool = False
    alpha: float = Field(0.5, ge=0, le=1)
    beta: float = Field(0.5, gt=0, lt=1)
    clip_epsilon: float = Field(0.2, gt=0)
    importance_ratio: bool = True
    advantage: Literal["rollout", "online"] = "rollout"
    teacher: TeacherConfig = Field(default_factory=TeacherConfig)

    @model_validator(mode="after")
    def _check(self):
        if self.support == "full" and self.loss in DIVERGENCES and self.teacher.path is None:
            raise ValueError(
                "support: full runs the teacher in-process: set objective.teacher.path"
            )
        if self.support == "full" and self.renormalize:
            raise ValueError("renormalize applies to a top-k support, not to support: full")
        return self


# --------------------------------------------------------------------------- pure losses


def divergence(
    kind: str,
    student: torch.Tensor,
    teacher: torch.Tensor,
    *,
    alpha: float = 0.5,
    beta: float = 0.5,
    renormalize: bool = False,
) -> torch.Tensor:
    """[..., K] log-probs of the same K tokens under S and T -> [...] divergence."""
    if renormalize:
        student = student - torch.logsumexp(student, dim=-1, keepdim=True)
        teacher = teacher - torch.logsumexp(teacher, dim=-1, keepdim=True)
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
    data = "rollouts"

    def __init__(self, cfg: OPDConfig):
        super().__init__(cfg)
        # support: full needs the teacher's whole distribution: it runs as the "reference"
        # (the frozen model beside the policy) with the dense term of the token head.
        self.reference = "dense" if cfg.support == "full" and cfg.loss in DIVERGENCES else "none"
        self.temperature = 1.0

    def frozen(self):
        from pt_train.objectives.reference import ReferenceConfig

        return ReferenceConfig(path=self.cfg.teacher.path, dtype=self.cfg.teacher.dtype)

    def required_columns(self) -> dict[str, str]:
        """Row columns the rollouts must carry, and how to get each."""
        cfg = self.cfg
        need = {}
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

    def head(self, batch) -> dict:
        extra = None
        if self.cfg.loss in DIVERGENCES and self.cfg.support == "teacher_topk":
            extra = batch.data["teacher_topk_ids"]
        elif self.cfg.loss in DIVERGENCES and self.cfg.support == "student_topk":
            extra = batch.data["student_topk_ids"]
        return {"extra_ids": extra, "temperature": self.temperature}

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
            else:
                key = (
                    "teacher_topk_logps"
                    if cfg.support == "teacher_topk"
                    else ("teacher_student_topk_logps")
                )
                per_token = divergence(
                    cfg.loss,
                    out.logps[:, 1:],
                    batch.data[key].to(student_token.dtype),
                    alpha=cfg.alpha,
                    beta=cfg.beta,
                    renormalize=cfg.renormalize,
                )
            metrics["kl"] = mean_metric(per_token)
        elif cfg.loss == "token_kl":
            per_token = token_kl(student_token, teacher_token)
            metrics["kl"] = mean_metric(per_token)
        else:
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
        return LossOutput(per_token.sum(), float(student_token.numel()), metrics)
