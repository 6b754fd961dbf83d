"""The built-in tool environment (``environment: {name: tools, tools: [...]}``): the policy
calls tools in its turns, and each call is answered with the tool's result.

The tools are plain Python functions (``module:function``, ``path/to/file.py:function``,
or ``python``: model-written code run in the sandbox), offered to the chat template as
JSON schemas (:mod:`pt_rollout.tools`). Each turn of the policy is read for calls in the
format of the template's family (Qwen/Hermes ``<tool_call>`` tags, Llama 3.1 JSON): a turn
with calls is answered with a tool message per call (an error message where a call could
not be read or run), a turn without is the final answer and ends the episode. Each turn
counts its ``tool_calls``, ``tool_errors`` (a tool that raised, timed out, was unknown or
given wrong arguments) and ``parse_failures`` (what was meant as a call but could not be
read). Rewards come from the run's reward section (``grade: true``: pt-eval's grader on
the final answer against the row's answer, or a function).
"""

from __future__ import annotations

from pt_rollout.episodes.environment import Step


class ToolEnvironment:
    """``tools``: the specs of the tools offered; ``chat_template``: the template's source,
    which says how calls are written (``tool_format`` overrides it); ``system``: a system
    message before each row's prompt (where the row has none); ``timeout_seconds``: each
    call's time limit; ``workers``: the calls of a turn run side by side."""

    counted = ("tool_calls", "tool_errors", "parse_failures")

    def __init__(self, tools: list[str], chat_template: str, *, tool_format: str | None = None,
                 system: str | None = None, timeout_seconds: float = 30.0,
                 workers: int = 1):  # fmt: skip
        from pt_rollout.tools import Toolbox, resolve_tool_format

        # the format first: a template without tool calls is refused before workers start
        self.format = resolve_tool_format(chat_template, tool_format)
        self.toolbox = Toolbox(tools, key="environment.tools", timeout_seconds=timeout_seconds,
                               workers=workers)  # fmt: skip
        self.tools = self.toolbox.schemas
        self.system = system

    def reset(self, row: dict):
        """The row's prompt (its first column of prompt, problem, question, messages, as
        the prompts are read), after the system message where one is set and the prompt
        has none."""
        from pt_rollout.prompts import PROMPT_KEYS

        key = next((k for k in PROMPT_KEYS if k in row), None)
        if key is None:
            raise ValueError(f"the row has none of the columns {', '.join(PROMPT_KEYS)}")
        prompt = row[key]
        messages = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        )
        if self.system and not any(m.get("role") == "system" for m in messages):
            messages = [{"role": "system", "content": self.system}, *messages]
        return messages

    def step(self, messages: list[dict], state) -> Step:
        from pt_rollout.tools import parse_tool_calls

        reply = parse_tool_calls(messages[-1]["content"], self.format)
        counts = {"tool_calls": len(reply.calls), "parse_failures": len(reply.failures),
                  "tool_errors": 0}  # fmt: skip
        if not reply.calls and not reply.failures:
            return Step(done=True, counts=counts)  # no call: the final answer
        answers = []
        for result in self.toolbox.call_many(reply.calls):
            counts["tool_errors"] += result.error is not None
            answers.append(result.message())
        for failure in reply.failures:
            answers.append({"role": "tool", "content": failure.message()})
        return Step(answers, counts=counts)

    def close(self) -> None:
        self.toolbox.close()
