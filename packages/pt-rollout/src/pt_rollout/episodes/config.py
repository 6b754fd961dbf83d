"""The ``environment`` section: which environment answers the policy's turns, and how long
an episode may run."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from pt_core.config import Section


class EnvironmentConfig(Section):
    """``name``: ``module:Class`` or ``path/to/file.py:Class`` (see
    :mod:`pt_rollout.episodes.environment`), or ``tools`` for the built-in tool environment
    (:mod:`pt_rollout.episodes.tools`); ``options``: its keyword arguments; ``max_turns``:
    the policy's turns in an episode at most; ``max_tokens``: the ids after the prompt at
    most (the policy's and the environment's); ``tools``: with ``name: tools``, the tools
    (``module:function``) it offers."""

    name: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    max_turns: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=4096, ge=1)
