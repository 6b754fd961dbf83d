"""What the generators that run in the trainer's process (local, colocate) share: a
generation made at once when it is asked for, and the teacher in this process (an HF
engine on ``objective.teacher.path``, loaded at its first use)."""

from __future__ import annotations

import time

import torch

from pt_core.errors import ConfigError
from pt_train.producers.online.generators import Generation


class InProcessTeacher:
    """Scores completions as the run asks (``score``: the teacher's top-k, its log-probs
    at the student's top-k), or does nothing where the run has no teacher."""

    def __init__(self, needs, score: dict | None):
        self.needs = needs
        self.request = score
        self._engine = None

    def score(self, requests, completions) -> tuple[list | None, float]:
        """The scores of ``completions`` (of ``requests``) and the seconds they took."""
        if self.request is None:
            return None, 0.0
        start = time.perf_counter()
        with torch.inference_mode():
            scores = self._teacher().score(
                [r.prompt_token_ids for r in requests],
                [c.token_ids for c in completions],
                top_k=self.request["top_k"],
                at_ids=[c.topk_ids for c in completions]
                if self.request["at_student_topk"]
                else None,
                temperature=self.request["temperature"],
            )
        return scores, time.perf_counter() - start

    def _teacher(self):
        if self._engine is None:
            from pt_rollout.engines.hf import HFEngine

            path = self.needs.teacher.path
            if path is None:
                raise ConfigError(
                    "the online loop scores with the teacher: set objective.teacher.path"
                )
            self._engine = HFEngine(path)
        return self._engine


class InProcessGenerator:
    """A generator in the trainer's process: :meth:`submit` generates at once (the trainer
    waits for it anyway) and :meth:`wait` hands the result over; a subclass makes a
    generation in ``_generate``."""

    def __init__(self, context):
        self.context = context
        self.teacher = InProcessTeacher(context.needs, context.score)
        self._done: dict[int, Generation] = {}
        self._next_key = 0

    def submit(self, requests: list) -> int:
        key = self._next_key
        self._next_key += 1
        self._done[key] = self._generate(requests)
        return key

    def wait(self, key: int) -> Generation:
        return self._done.pop(key)

    def _generate(self, requests: list) -> Generation:
        raise NotImplementedError
