"""Episodes: turns of the policy and answers of an environment, kept as the token ids the
policy sampled with the environment's tokens appended after them.

An episode opens with the environment's messages rendered through the chat template with a
generation prompt (``prompt_token_ids``). Each turn, every open episode is one request
(token in: the prompt and the episode's ids so far; its own seed); the policy's sampled ids
(token out) are appended with mask 1 and their log-probs, and the environment's answer is
appended as ids with mask 0 (:class:`~pt_rollout.episodes.template.TurnTemplate`), so that
the ids trained are the ids sampled, id for id, and the environment's take no part in the
loss, the KL or the ratios. An episode ends when the environment says so, after
``max_turns`` turns of the policy, when its ids would pass ``max_tokens``, or when a turn
of the policy does not end with the template's end-of-turn token (cut at the turn's
``max_tokens``, or ended by another stop).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pt_rollout.columns import field_of
from pt_rollout.episodes.environment import Environment
from pt_rollout.episodes.template import TurnTemplate


@dataclass
class Episode:
    """One episode: its prompt row and sample, the ids after its prompt and for each id
    whether the policy sampled it, with what the policy recorded per sampled id (None on
    the environment's), the turns' spans, the conversation and the rewards."""

    row: Any  # pt_rollout.prompts.PromptRow
    sample: int
    seed_key: list
    prompt_ids: list[int]
    messages: list[dict]
    state: Any = None
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    topk_ids: list[list[int] | None] = field(default_factory=list)
    topk_logprobs: list[list[float] | None] = field(default_factory=list)
    token_versions: list[int | None] = field(default_factory=list)
    turns: list[dict] = field(default_factory=list)
    rewards: list[float | None] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    stop_reason: str | None = None

    @property
    def name(self) -> str:
        return f"{self.row.id!r} (sample {self.sample})"

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def policy_turns(self) -> int:
        return sum(1 for t in self.turns if t["role"] == "policy")


@dataclass
class RunnerCost:
    """Seconds an episode batch spent outside generation: the environment's code, and the
    template's appends (rendering and tokenizing)."""

    environment_s: float = 0.0
    append_s: float = 0.0


class EpisodeRunner:
    """Runs episodes of ``environment`` with ``template``; ``seed``: the run's sampling seed,
    from which each turn of each episode derives its own."""

    def __init__(self, environment: Environment, template: TurnTemplate, *, max_turns: int,
                 max_tokens: int, seed: int, stop: Sequence[str] = ()):  # fmt: skip
        self.environment = environment
        self.template = template
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.seed = seed
        self.stop = list(stop)
        self.cost = RunnerCost()

    def start(self, row, sample: int, seed_key: list | None = None) -> Episode:
        """Episode ``sample`` of prompt row ``row`` (a :class:`PromptRow`), opened."""
        started = time.perf_counter()
        key = [*(seed_key or []), row.id]
        messages, state = self.environment.reset(dict(row.columns), f"{row.id!r}")
        self.cost.environment_s += time.perf_counter() - started
        started = time.perf_counter()
        prompt = self.template.opening(messages)
        self.cost.append_s += time.perf_counter() - started
        return Episode(row, sample, key, prompt, list(messages), state,
                       counts=dict.fromkeys(self.environment.counted, 0))  # fmt: skip

    def requests(self, episodes: Sequence[Episode]) -> list:
        """A request for each open episode's next turn, with the turn's own seed."""
        from pt_rollout.engines import Request, sample_seed

        return [
            Request(
                e.prompt_ids + e.ids,
                sample_seed(self.seed, [*e.seed_key, "turn", e.policy_turns], e.sample),
            )
            for e in episodes
            if not e.done
        ]

    def advance(self, episodes: Sequence[Episode], completions: Sequence, version: int) -> None:
        """Give the open episodes (in order) their sampled turns, and the environment's
        answers to them."""
        open_episodes = [e for e in episodes if not e.done]
        assert len(open_episodes) == len(completions), "a completion per open episode"
        for episode, completion in zip(open_episodes, completions, strict=True):
            self._take_turn(episode, completion, version)
            if not episode.done:
                self._answer(episode)

    def run(
        self, episodes: Sequence[Episode], generate: Callable[[list], tuple[list, int]]
    ) -> None:
        """Turn after turn until every episode is over; ``generate(requests)`` gives the
        completions and the weight version that sampled them."""
        while any(not e.done for e in episodes):
            completions, version = generate(self.requests(episodes))
            self.advance(episodes, completions, version)

    # ------------------------------------------------------------------ one turn

    def turn_text(self, sampled: list[int]) -> str:
        """A turn's text as the environment reads it: its special tokens kept (a tool call's
        ``<tool_call>`` is one in Qwen's vocabulary), but not the end-of-turn or end of text
        token that closed it; cut before the first stop string."""
        end = len(sampled)
        while end and sampled[end - 1] in self.template.closing_ids:
            end -= 1
        text = self.template.tokenizer.decode(sampled[:end], skip_special_tokens=False)
        cuts = [text.find(s) for s in self.stop if s and s in text]
        return text[: min(cuts)] if cuts else text

    def _take_turn(self, episode: Episode, completion, version: int) -> None:
        sampled = list(field_of(completion, "token_ids"))
        n = len(sampled)
        start = len(episode.ids)
        episode.ids += sampled
        episode.mask += [1] * n
        logprobs = field_of(completion, "logprobs")
        episode.logprobs += list(logprobs) if logprobs is not None else [None] * n
        top_ids, top_logprobs = (
            field_of(completion, "topk_ids"),
            field_of(completion, "topk_logprobs"),
        )
        episode.topk_ids += list(top_ids) if top_ids is not None else [None] * n
        episode.topk_logprobs += list(top_logprobs) if top_logprobs is not None else [None] * n
        versions = field_of(completion, "token_versions")
        episode.token_versions += list(versions) if versions is not None else [version] * n
        episode.turns.append({"role": "policy", "start": start, "end": start + n,
                              "weight_version": version})  # fmt: skip
        episode.messages.append({"role": "assistant", "content": self.turn_text(sampled)})
        if not sampled or sampled[-1] != self.template.end_of_turn:
            reason = field_of(completion, "finish_reason")
            episode.stop_reason = "turn_length" if reason == "length" else "stop"
        elif len(episode.ids) >= self.max_tokens:
            episode.stop_reason = "max_tokens"

    def _answer(self, episode: Episode) -> None:
        started = time.perf_counter()
        step = self.environment.step(
            list(episode.messages), episode.state, episode.name, episode.policy_turns
        )
        self.cost.environment_s += time.perf_counter() - started
        episode.rewards.append(None if step.reward is None else float(step.reward))
        for name, count in step.counts.items():
            episode.counts[name] = episode.counts.get(name, 0) + int(count)
        if step.done:
            episode.messages += step.messages
            episode.stop_reason = "done"
            return
        if episode.policy_turns >= self.max_turns:
            episode.messages += step.messages
            episode.stop_reason = "max_turns"
            return
        started = time.perf_counter()
        appended = self.template.append(step.messages)
        self.cost.append_s += time.perf_counter() - started
        if len(episode.ids) + len(appended) >= self.max_tokens:
            episode.messages += step.messages
            episode.stop_reason = "max_tokens"
            return
        start = len(episode.ids)
        episode.ids += appended
        n = len(appended)
        episode.mask += [0] * n
        episode.logprobs += [None] * n
        episode.topk_ids += [None] * n
        episode.topk_logprobs += [None] * n
        episode.token_versions += [None] * n
        episode.turns.append({"role": "environment", "start": start, "end": start + n})
        episode.messages += step.messages


def episode_row(episode: Episode, *, extra: dict | None = None) -> dict:
    """The rollouts row of an episode (:mod:`pt_rollout.columns`): the completion is every
    id after the prompt, ``completion_mask`` 1 on the policy's; ``completion`` is the text
    of its last turn (what a grader reads); the turns, the conversation, the rewards."""
    from pt_rollout.columns import COMPLETION_LOGPROBS, STUDENT_TOPK_IDS, STUDENT_TOPK_LOGPROBS

    last = next((m["content"] for m in reversed(episode.messages) if m["role"] == "assistant"), "")
    rewards = [r for r in episode.rewards if r is not None]
    record = {
        "id": episode.row.id,
        "sample": episode.sample,
        **(extra or {}),
        "prompt": episode.row.prompt,
        "completion": last,
        "prompt_token_ids": list(episode.prompt_ids),
        "completion_token_ids": list(episode.ids),
        "completion_mask": list(episode.mask),
        "finish_reason": episode.stop_reason,
        COMPLETION_LOGPROBS: list(episode.logprobs),
        "turns": episode.turns,
        "num_turns": episode.policy_turns,
        "messages": episode.messages,
        "env_reward": float(sum(rewards)),
        "turn_rewards": episode.rewards,
        **{name: count for name, count in sorted(episode.counts.items())},
    }
    if any(t is not None for t in episode.topk_ids):
        record[STUDENT_TOPK_IDS] = episode.topk_ids
        record[STUDENT_TOPK_LOGPROBS] = episode.topk_logprobs
    return {**record, **{k: v for k, v in episode.row.columns.items() if k not in record}}
