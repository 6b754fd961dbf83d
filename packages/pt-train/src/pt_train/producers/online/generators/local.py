"""``rollout.generator: local``: the HF engine generates with the policy module being
trained, in the trainer's process, between steps: the weights are always the current
ones, nothing is copied or pushed."""

from __future__ import annotations

import time

from pt_train.producers.online.generators import Generation, GeneratorContext
from pt_train.producers.online.generators.inprocess import InProcessGenerator


class LocalGenerator(InProcessGenerator):
    def __init__(self, context: GeneratorContext):
        super().__init__(context)
        self.engine = None  # built at the first generation
        self.version = 0

    def push(self, version: int) -> None:
        self.version = version  # the module is the policy: its weights are the current ones

    def _generate(self, requests: list) -> Generation:
        from pt_rollout.engines import SamplingParams

        if self.engine is None:
            r = self.context.rollout
            self.engine = self.context.weights.policy.sampler(
                self.context.tokenizer, seed=r.seed, decoder=r.decoder
            )
        start = time.perf_counter()
        completions = self.engine.generate(requests, SamplingParams(**self.context.sampling))
        generated = Generation(completions, self.version, generate_s=time.perf_counter() - start)
        return self._scored(requests, completions, generated)

    def round_metrics(self) -> dict:
        return {"weight_push_s": 0.0}

    def close(self) -> None:
        pass
