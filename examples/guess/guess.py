"""A number-guessing game as a pt environment: the policy guesses a secret number, and each
wrong guess is answered "higher" or "lower". An environment is a plain class (see
docs/environments.md): ``reset`` opens an episode from a prompt row, ``step`` answers the
policy's last turn. Named in a config as ``guess.py:Guess`` (looked up from the directory
pt runs in)."""

from __future__ import annotations

import re

from pt_rollout.episodes.environment import Step


class Guess:
    """Guess the row's ``secret`` from ``low`` to ``high``: a wrong guess is answered
    "higher" or "lower", a turn with no number "Say a number.", the right guess ends the
    episode with reward 1. An episode that runs out of turns ends with reward 0."""

    def __init__(self, low: int = 1, high: int = 10):
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
