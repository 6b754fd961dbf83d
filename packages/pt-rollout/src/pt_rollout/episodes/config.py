"""The ``environment`` section: which environment answers the policy's turns, and how long
an episode may run."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from pt_core.config import Section

TOOLS = "tools"  # the built-in tool environment's name (pt_rollout.episodes.tools)


class EnvironmentConfig(Section):
    """``name``: ``module:Class`` or ``path/to/file.py:Class`` (see
    :mod:`pt_rollout.episodes.environment`), or ``tools`` for the built-in tool environment
    (:mod:`pt_rollout.episodes.tools`); ``options``: its keyword arguments; ``max_turns``:
    the policy's turns in an episode at most; ``max_tokens``: the ids after the prompt at
    most (the policy's and the environment's); ``tools`` and ``tool_format``: with
    ``name: tools``, the tools it offers (``module:function``, ``file.py:function``,
    ``python``) and the format calls are read in (default: the chat template's);
    ``grade``: a training run adds its ``reward`` section's reward (pt-eval's grader on
    the last turn, or a function) to the environment's."""

    name: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)
    max_turns: int = Field(default=8, ge=1)
    max_tokens: int = Field(default=4096, ge=1)
    tools: list[str] = Field(default_factory=list)
    tool_format: str | None = None
    grade: bool = False

    @model_validator(mode="after")
    def _tools_are_the_tool_environments(self):
        if self.name == TOOLS and not self.tools:
            raise ValueError(
                "environment.name=tools offers no tools; list them in environment.tools "
                "(module:function, path/to/file.py:function, or python)"
            )
        if self.name is not None and self.name != TOOLS:
            for key in ("tools", "tool_format"):
                if getattr(self, key):
                    raise ValueError(
                        f"environment.{key} is read by the built-in tool environment only "
                        f"(name: tools), and {self.name} is not it; offer tools from the "
                        "environment's own tools attribute, or remove the key"
                    )
        return self
