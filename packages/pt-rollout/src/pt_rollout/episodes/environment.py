"""Environments: user Python that answers the policy's turns.

An environment is a class named ``module:Class`` or ``path/to/file.py:Class``, built once
per run with the keyword arguments of its config section (``environment.options``)::

    class Guess:
        def __init__(self, low: int = 1, high: int = 100): ...

        def reset(self, row: dict):
            # the prompt row (every column of it): the episode's opening messages, and
            # optionally a state that step() is given back
            return [{"role": "user", "content": "Guess my number"}], {"secret": 42}

        def step(self, messages: list[dict], state):
            # the conversation so far, the policy's last turn last: the messages to
            # append, a reward for this turn (or None) and whether the episode is over
            return Step(messages=[{"role": "user", "content": "higher"}], reward=0.0)

``step`` may return a :class:`Step`, a dict with those keys, or a tuple ``(messages,
reward, done)``. An environment may declare ``tools`` (JSON schemas the chat template
renders into the opening, see :mod:`pt_rollout.tools`) and ``counted`` (the names of the
counts its steps return: every episode carries them, 0 where no turn counted). An
exception in its code stops the run with one line naming the environment, the episode,
the turn and where in the environment's code it was raised.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

from pt_core.errors import ConfigError, RunFailure


@dataclass
class Step:
    """An environment's answer to one turn of the policy."""

    messages: list[dict] = field(default_factory=list)
    reward: float | None = None
    done: bool = False
    # counts the environment keeps of the turn (tool calls, tool errors, parse failures)
    counts: dict[str, int] = field(default_factory=dict)


def open_environment(cfg, tokenizer, *, key: str = "environment.name") -> Environment:
    """The environment ``cfg`` (an :class:`~pt_rollout.episodes.config.EnvironmentConfig`)
    names, built; the built-in tool environment reads its tool format off ``tokenizer``'s
    chat template."""
    from pt_rollout.episodes.config import TOOLS

    if cfg.name == TOOLS:
        from pt_core.chat import own_template

        options = {**cfg.options, "tools": cfg.tools, "tool_format": cfg.tool_format,
                   "chat_template": own_template(tokenizer) or ""}  # fmt: skip
        return Environment("pt_rollout.episodes.tools:ToolEnvironment", options, key=key,
                           name=TOOLS)  # fmt: skip
    return Environment(cfg.name, cfg.options, key=key)


class Environment:
    """A loaded environment: the user's object and how to call it, so that its errors
    come back as one line naming the episode and the turn."""

    def __init__(self, spec: str, options: dict | None = None, *, key: str = "environment.name",
                 name: str | None = None):  # fmt: skip
        from pt_core.objects import load_object

        self.spec = name or spec
        cls = load_object(spec, key=key, what="class")
        try:
            self.obj = cls(**(options or {}))
        except TypeError as exc:
            raise ConfigError(
                f"{key}={spec!r} cannot be built from environment.options: {exc}",
                hint=f"give {cls.__name__}'s keyword arguments in environment.options",
            ) from None
        except ConfigError:
            raise
        except Exception as exc:
            raise self._failure("__init__", None, None, exc) from None
        for method in ("reset", "step"):
            if not callable(getattr(self.obj, method, None)):
                raise ConfigError(
                    f"{key}={spec!r} has no {method}() method",
                    hint="an environment has reset(row) and step(messages, state)",
                )

    def close(self) -> None:
        """Release what the environment holds (a tool environment's worker processes)."""
        close = getattr(self.obj, "close", None)
        if callable(close):
            close()

    @property
    def counted(self) -> tuple[str, ...]:
        """The counts each of the environment's episodes carries, 0 until a turn adds to
        them (its ``counted`` attribute, if any)."""
        return tuple(getattr(self.obj, "counted", ()))

    @property
    def tools(self) -> list[dict] | None:
        """The JSON schemas of the tools the environment offers, if any."""
        tools = getattr(self.obj, "tools", None)
        return list(tools) if tools else None

    def reset(self, row: dict, episode: str) -> tuple[list[dict], Any]:
        try:
            opened = self.obj.reset(row)
        except Exception as exc:
            raise self._failure("reset", episode, 0, exc) from None
        messages, state = opened if isinstance(opened, tuple) else (opened, None)
        self._check_messages(messages, "reset", episode, 0)
        if not messages:
            raise RunFailure(
                f"environment {self.spec}: reset of episode {episode} returned no messages",
                hint="reset(row) returns the episode's opening messages (a list of dicts)",
            )
        return list(messages), state

    def step(self, messages: list[dict], state: Any, episode: str, turn: int) -> Step:
        try:
            answer = self.obj.step(messages, state)
        except Exception as exc:
            raise self._failure("step", episode, turn, exc) from None
        if isinstance(answer, Step):
            step = answer
        elif isinstance(answer, dict):
            unknown = set(answer) - {"messages", "reward", "done", "counts"}
            if unknown:
                raise RunFailure(
                    f"environment {self.spec}: step of episode {episode}, turn {turn} "
                    f"returned unknown keys {sorted(unknown)}",
                    hint="return messages, reward, done (and counts)",
                )
            step = Step(**answer)
        elif isinstance(answer, tuple) and len(answer) == 3:
            step = Step(list(answer[0] or []), answer[1], bool(answer[2]))
        else:
            raise RunFailure(
                f"environment {self.spec}: step of episode {episode}, turn {turn} returned "
                f"{type(answer).__name__}",
                hint="return a Step, a dict with messages/reward/done, or (messages, reward, done)",
            )
        self._check_messages(step.messages, "step", episode, turn)
        if step.reward is not None and not isinstance(step.reward, int | float):
            raise RunFailure(
                f"environment {self.spec}: step of episode {episode}, turn {turn} returned "
                f"the reward {step.reward!r}",
                hint="a reward is a number, or None",
            )
        return step

    def _check_messages(self, messages, method: str, episode: str | None, turn: int) -> None:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
        ):
            raise RunFailure(
                f"environment {self.spec}: {method} of episode {episode}, turn {turn} "
                "returned messages that are not a list of {role, content} dicts",
                hint="return messages as [{'role': 'user', 'content': '...'}, ...]",
            )

    def _failure(self, method: str, episode: str | None, turn: int | None, exc: Exception):
        where = ""
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if "pt_rollout" not in f.filename
        ]
        if frames:
            where = f" at {frames[-1].filename}:{frames[-1].lineno}"
        of = f" of episode {episode}, turn {turn}" if episode is not None else ""
        return RunFailure(
            f"environment {self.spec}: {method}{of} raised {type(exc).__name__}: {exc}{where}",
            hint="fix the environment's code; the episode and turn above reproduce it",
        )
