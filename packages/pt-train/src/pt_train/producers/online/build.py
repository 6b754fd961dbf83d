"""A round's rows from what a generator gave: a rollouts row per sample
(:mod:`pt_rollout.columns`) with the round, its group and the weight versions that
sampled it, rewarded by the run's reward component and completed by the objective's
:meth:`~pt_train.objectives.Objective.prepare_round` (e.g. group advantages), and with
DAPO's dynamic sampling where the objective asks for it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pt_rollout.columns import TOKEN_WEIGHT_VERSION, score_columns
from pt_train.producers.online.generators import Generation
from pt_train.producers.online.prompts import PromptStream, SampleRequest


class RoundBuilder:
    def __init__(self, rollout, objective, rewards, tokenizer, prompts: PromptStream,
                 prompts_per_round: int, score: dict | None):  # fmt: skip
        self.rollout = rollout
        self.objective = objective
        self.rewards = rewards
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.prompts_per_round = prompts_per_round
        self.score = score

    def rows(self, index: int, requests: list[SampleRequest], made: Generation) -> list[dict]:
        scores = made.scores or [None] * len(requests)
        return [
            self._row(index, request, completion, score, made.version)
            for request, completion, score in zip(requests, made.completions, scores, strict=True)
        ]

    def _episode_row(self, index: int, request: SampleRequest, episode) -> dict:
        """An episode's row: the versions of its policy tokens (``token_weight_version``),
        ``weight_version`` that of its first."""
        from pt_rollout.episodes import episode_row

        row = episode_row(episode, extra={"round": index, "group": request.group})
        versions = [v for v, m in zip(episode.token_versions, episode.mask, strict=True) if m]
        row["weight_version"] = versions[0] if versions else episode.turns[0]["weight_version"]
        row[TOKEN_WEIGHT_VERSION] = versions
        return row

    def _row(self, index: int, request: SampleRequest, completion, score, version: int) -> dict:
        from pt_rollout.columns import field_of, rollout_row
        from pt_rollout.episodes import Episode

        if isinstance(completion, Episode):
            return self._scored(self._episode_row(index, request, completion), score)
        row = rollout_row(
            request.prompt, request.sample, request.request.prompt_token_ids, completion,
            self.tokenizer, list(self.rollout.stop), logprobs=True,
            extra={"round": index, "group": request.group},
        )  # fmt: skip
        row["weight_version"] = version
        token_versions = field_of(completion, "token_versions")
        if token_versions is not None:  # in-flight updates
            row[TOKEN_WEIGHT_VERSION] = token_versions
            if token_versions:  # the weights of its first token
                row["weight_version"] = token_versions[0]
        return self._scored(row, score)

    def _scored(self, row: dict, score) -> dict:
        if score is not None:
            assert self.score is not None  # scores come where the run asks for them
            row.update(score_columns(score, top_k=self.score["top_k"],
                                     at_student_topk=self.score["at_student_topk"]))  # fmt: skip
        return row

    def prepare(self, rows: list[dict]) -> dict:
        """Rewards (an episode's environment's, plus the reward component's where the run
        has one), then the objective's columns of the whole round."""
        metrics = self.rewards(rows) if self.rewards is not None else {}
        for row in rows:
            if "env_reward" in row:
                row["reward"] = row.get("reward", 0.0) + row["env_reward"]
        self.objective.prepare_round(rows)
        return metrics

    def dynamic_sampling(
        self, index: int, rows: list[dict], max_tries: int,
        generate: Callable[[list[SampleRequest]], Generation],
    ) -> tuple[list[dict], dict]:  # fmt: skip
        """DAPO's dynamic sampling: drop the groups whose rewards are all equal (they carry
        no gradient) and top the round up with groups of further prompts (``generate``d
        now), at most ``max_tries`` times; what is still missing is filled with dropped
        groups."""
        n = self.rollout.samples_per_prompt
        groups = [rows[i : i + n] for i in range(0, len(rows), n)]
        kept = [g for g in groups if not g[0]["group_all_equal"]]
        dropped = [g for g in groups if g[0]["group_all_equal"]]
        tries = 0
        while len(kept) < self.prompts_per_round and tries < max_tries:
            tries += 1
            requests = self.prompts.extra(self.prompts_per_round - len(kept))
            extra = self.rows(index, requests, generate(requests))
            self.prepare(extra)
            for i in range(0, len(extra), n):
                group = extra[i : i + n]
                (dropped if group[0]["group_all_equal"] else kept).append(group)
        short = max(0, self.prompts_per_round - len(kept))
        final = kept[: self.prompts_per_round] + dropped[:short]
        sampled = [row["reward"] for group in kept + dropped for row in group]
        return [row for group in final for row in group], {
            # every sample of the round, dropped groups too: the policy's success rate on
            # fresh prompts, where "reward" is that of the groups trained on
            "sampled_reward": float(np.mean(sampled)),
            "dynamic_sampling_tries": tries,
            "dynamic_sampling_dropped": len(dropped) - short,
            "dynamic_sampling_short": short,
        }
