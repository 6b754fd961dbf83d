"""Where the online loop's samples come from (``rollout.generator``), behind one protocol:

    generator.push(version)      the policy's current weights, as that version, unless it has them
    key = generator.submit(reqs) generate (and score) with the weights pushed last
    generator.wait(key)          -> Generation: completions, scores, the weight version
    generator.score(items)       the teacher's scores of given completions (an episode's)
    generator.round_metrics()    the cost since the last call (weight_push_s, ...)
    generator.close()

- ``local`` (:class:`LocalGenerator`): the HF engine on the policy module itself;
- ``colocate`` (:class:`ColocatedGenerator`): a vLLM engine in the trainer's process;
- ``server`` (:class:`ServerGenerator`): generator processes, started or listening.

A new kind is one module here and one entry in :data:`KINDS`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from pt_train.producers.online.push import CurrentWeights

# rollout.generator -> the module and class of that kind
KINDS = {
    "local": ("local", "LocalGenerator"),
    "colocate": ("colocated", "ColocatedGenerator"),
    "server": ("server", "ServerGenerator"),
}


@dataclass
class Generation:
    """What one :meth:`Generator.submit` gave: a completion per request (engine
    :class:`~pt_rollout.engines.Completion`\\ s or their dicts), the teacher's scores of
    them where the run scores, the weight version that generated them, and the seconds."""

    completions: list
    version: int
    scores: list | None = None
    generate_s: float = 0.0
    score_s: float = 0.0


@dataclass
class GeneratorContext:
    """What every kind is built from: the run's config and the objective's needs, the
    tokenizer, the policy's current weights, and how the run samples and scores (fixed for
    the run: the sampling parameters as they cross a socket, the teacher's request)."""

    cfg: Any
    needs: Any
    tokenizer: Any
    weights: CurrentWeights
    sampling: dict
    score: dict | None = None
    extra: dict = field(default_factory=dict)

    @property
    def rollout(self):
        return self.cfg.rollout

    @property
    def max_logprobs(self) -> int:
        """The most log-probs per position a generator returns: the student's and the
        teacher's top-k, at least vLLM's default 20."""
        teacher = self.needs.teacher
        return max(20, self.needs.student_top_k, teacher.top_k if teacher else 0)


def score_request(needs) -> dict | None:
    """What the teacher must add to each round (its top-k, its log-probs at the student's
    top-k, at the sampling temperature), or None where the objective declares no teacher."""
    teacher = needs.teacher
    if teacher is None:
        return None
    return {
        "top_k": teacher.top_k,
        "at_student_topk": teacher.at_student_topk,
        "temperature": teacher.temperature,
    }


class Generator(Protocol):
    def push(self, version: int) -> None: ...

    def submit(self, requests: list) -> int: ...

    def wait(self, key: int) -> Generation: ...

    def score(self, items: list) -> tuple[list | None, float]: ...

    def round_metrics(self) -> dict: ...

    def close(self) -> None: ...


def make_generator(context: GeneratorContext) -> Generator:
    """The generator of ``rollout.generator``."""
    module, name = KINDS[context.rollout.generator]
    cls = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    return cls(context)
