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

    def score(self, items: list) -> tuple[list | None, float]:
        """The scores of given completions (``items``: ``(prompt ids, completion ids, the
        student's top-k ids or None)``) and the seconds they took."""
        if self.request is None:
            return None, 0.0
        start = time.perf_counter()
        with torch.inference_mode():
            scores = self._teacher().score(
                [p for p, _, _ in items],
                [c for _, c, _ in items],
                top_k=self.request["top_k"],
                at_ids=[a for _, _, a in items] if self.request["at_student_topk"] else None,
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

    def score(self, items: list) -> tuple[list | None, float]:
        return self.teacher.score(items)

    def _scored(self, requests: list, completions: list, generated: Generation) -> Generation:
        """``generated`` with the teacher's scores of its completions, where the run asks."""
        generated.scores, generated.score_s = self.teacher.score(
            [
                (r.prompt_token_ids, c.token_ids, c.topk_ids)
                for r, c in zip(requests, completions, strict=True)
            ]
        )
        return generated

    def _generate(self, requests: list) -> Generation:
        raise NotImplementedError
