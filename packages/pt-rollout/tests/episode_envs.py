"""Environments for the tests of episodes (importable as ``episode_envs:Class``)."""

from __future__ import annotations

import re

from pt_rollout.episodes import Step


class Guess:
    """Guess the row's ``secret`` from ``low`` to ``high``: each wrong guess is answered
    "higher" or "lower" (reward 0), a turn with no number is asked for one, the right guess
    ends the episode with reward 1."""

    def __init__(self, low: int = 1, high: int = 20):
        self.low, self.high = low, high

    def reset(self, row: dict):
        opening = f"Guess my number from {self.low} to {self.high}."
        return [{"role": "user", "content": opening}], {"secret": int(row["secret"])}

    def step(self, messages: list[dict], state: dict) -> Step:
        numbers = re.findall(r"\d+", messages[-1]["content"])
        if not numbers:
            return Step([{"role": "user", "content": "Say a number."}], reward=0.0)
        guess = int(numbers[-1])
        if guess == state["secret"]:
            return Step(reward=1.0, done=True)
        hint = "higher" if guess < state["secret"] else "lower"
        return Step([{"role": "user", "content": hint}], reward=0.0)


class Broken:
    """Raises in its second step: what a bug in a user's environment looks like."""

    def reset(self, row: dict):
        return [{"role": "user", "content": "hello"}]

    def step(self, messages: list[dict], state) -> Step:
        if len(messages) > 3:
            raise KeyError("score")
        return Step([{"role": "user", "content": "again"}])
