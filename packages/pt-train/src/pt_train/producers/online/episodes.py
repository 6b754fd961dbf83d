"""The online loop's rounds as episodes of an environment (the ``environment`` section).

A round's samples are episodes (:mod:`pt_rollout.episodes`): the first turn of each is
asked for when the schedule asks for the round (under ``step_off`` and ``async``, ahead of
its training), and the later turns when the round is wanted, each after the newest weights
were pushed; every turn records the weight version that sampled it (the row's ``turns``
and ``token_weight_version``), so an episode whose turns came from several versions says
so. The teacher, where the objective has one, scores the whole episode once it is over;
only the policy's tokens are trained on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pt_train.producers.online.generators import Generation
from pt_train.producers.online.prompts import SampleRequest


@dataclass
class EpisodeJob:
    """A round's (or a top-up's) episodes while they are generated: the key of the turn
    asked for."""

    requests: list[SampleRequest]
    episodes: list
    key: int


class EpisodeRounds:
    def __init__(self, cfg, tokenizer):
        from pt_rollout.episodes import EpisodeRunner, TurnTemplate
        from pt_rollout.episodes.environment import open_environment

        env = cfg.environment
        self.environment = open_environment(env, tokenizer)
        template = TurnTemplate(tokenizer, tools=self.environment.tools)
        template.check()  # a template that cannot be continued: refused before any turn
        self.runner = EpisodeRunner(
            self.environment, template, max_turns=env.max_turns, max_tokens=env.max_tokens,
            seed=cfg.rollout.seed, stop=cfg.rollout.stop,
        )  # fmt: skip

    def submit(self, generator, requests: list[SampleRequest]) -> EpisodeJob:
        """Open an episode per request and ask for its first turn."""
        episodes = [self.runner.start(s.prompt, s.sample, s.seed_key) for s in requests]
        return EpisodeJob(requests, episodes, generator.submit(self.runner.requests(episodes)))

    def finish(self, job: EpisodeJob, generator, version: Callable[[], int]) -> Generation:
        """The episodes to their end: the turn asked for, then each later turn with the
        weights of ``version()`` pushed first; the teacher's scores of them, where the run
        has a teacher. The generation's version is that of the first turns."""
        made = generator.wait(job.key)
        first, generate_s = made.version, made.generate_s
        self.runner.advance(job.episodes, made.completions, made.version)
        while any(not e.done for e in job.episodes):
            generator.push(version())
            made = generator.wait(generator.submit(self.runner.requests(job.episodes)))
            generate_s += made.generate_s
            self.runner.advance(job.episodes, made.completions, made.version)
        started = time.perf_counter()
        scores, score_s = generator.score([self._scored(e) for e in job.episodes])
        return Generation(
            list(job.episodes), first, scores=scores, generate_s=generate_s,
            score_s=score_s if scores is not None else time.perf_counter() - started,
        )  # fmt: skip

    @staticmethod
    def _scored(episode) -> tuple[list[int], list[int], list[list[int]] | None]:
        """What the teacher scores of an episode: every id after the prompt (the
        environment's too, as context; only the policy's are trained), and at each the
        student's top-k where it was recorded (the environment's positions get the first
        k ids, which nothing reads)."""
        width = next((len(t) for t in episode.topk_ids if t is not None), None)
        at = None
        if width is not None:
            at = [t if t is not None else list(range(width)) for t in episode.topk_ids]
        return episode.prompt_ids, episode.ids, at
