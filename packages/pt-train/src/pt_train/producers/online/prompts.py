"""The prompts an online run samples from, in the order it takes them, as requests.

Round ``r`` takes ``prompts_per_round`` prompts (epochs of a seeded permutation, as for
fixed data), ``samples_per_prompt`` requests each, each with its own sampler seed derived
from the run's seed, the round and the prompt's id (so a sample does not depend on the
generator, its batching or a resume). Prompts that top a round up after dynamic sampling
dropped some come from a stream of their own, counted by ``extra_position``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pt_train.data import StepSampler

if TYPE_CHECKING:
    from pt_rollout.engines import Request
    from pt_rollout.prompts import PromptRow


@dataclass(frozen=True)
class SampleRequest:
    """One sample to generate: its prompt row, its index among the prompt's samples, the
    engine request, its group (the samples of one prompt in one round) and the key its
    seeds derive from (with the prompt's id and the sample)."""

    prompt: PromptRow
    sample: int
    request: Request
    group: str
    seed_key: list


class PromptStream:
    def __init__(self, rollout, tokenizer, prompts_per_round: int):
        from pt_rollout.prompts import prompts_path, read_prompts

        self.rollout = rollout
        self.tokenizer = tokenizer
        source = prompts_path(rollout.prompts, rollout.split or "train")
        self.prompts = read_prompts(source, prompt_key=rollout.prompt_key, id_key=rollout.id_key)
        self.sampler = StepSampler(len(self.prompts), prompts_per_round, seed=rollout.seed,
                                   shuffle=True)  # fmt: skip
        self.extra_sampler = StepSampler(len(self.prompts), 1, seed=rollout.seed + 7919,
                                         shuffle=True)  # fmt: skip
        self.extra_position = 0
        self._token_ids: dict[int, list[int]] = {}

    def round(self, index: int) -> list[SampleRequest]:
        """Every sample of round ``index``."""
        return [
            request
            for position in self.sampler.global_batch(index)
            for request in self._of(position, [index])
        ]

    def extra(self, count: int) -> list[SampleRequest]:
        """The samples of ``count`` further prompts, the next of the extra stream."""
        requests = []
        for _ in range(count):
            position = self.extra_sampler.global_batch(self.extra_position)[0]
            self.extra_position += 1
            requests += self._of(position, ["extra", self.extra_position])
        return requests

    def _of(self, position: int, seed_key: list) -> list[SampleRequest]:
        from pt_rollout.engines import Request, sample_seed
        from pt_rollout.prompts import prompt_token_ids

        prompt = self.prompts[position]
        if position not in self._token_ids:
            self._token_ids[position] = prompt_token_ids(
                self.tokenizer, prompt.prompt, template=self.rollout.template,
                system=self.rollout.system,
            )  # fmt: skip
        key = [*seed_key, prompt.id]
        group = json.dumps(key, default=str)  # the samples of one prompt
        return [
            SampleRequest(prompt, sample,
                          Request(self._token_ids[position],
                                  sample_seed(self.rollout.seed, key, sample)), group, seed_key)
            for sample in range(self.rollout.samples_per_prompt)
        ]  # fmt: skip
