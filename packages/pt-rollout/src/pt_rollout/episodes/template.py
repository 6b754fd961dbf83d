"""An episode's tokens grow by appending, never by rendering the conversation again.

A chat template renders a whole conversation, and rendering it again after each turn can
change the tokens of earlier turns (templates that drop the ``<think>`` blocks of earlier
assistant turns, a newline that moves at a turn boundary, a reply whose text tokenizes
otherwise than the ids that were sampled). The policy would then be trained on tokens it
did not produce. So an episode keeps the ids the policy sampled as they are, and what the
template puts between turns is appended after them as ids of its own
(:meth:`TurnTemplate.append`): the rest of the template's closing of an assistant turn
after its end-of-turn token (``"\\n"`` after ChatML's ``<|im_end|>``), the messages the
environment answers with, and the generation prompt of the next assistant turn. These are
read off the template by rendering a small conversation of its own, once with and once
without the new messages: the earlier turns of the episode are never rendered again.

A template whose rendering of a conversation is not a prefix of its rendering of that
conversation with messages added cannot be continued this way; it is refused at start
(:meth:`TurnTemplate.check`), naming the messages it cannot add.
"""

from __future__ import annotations

from typing import Any

from pt_core.chat import end_of_turn_ids
from pt_core.errors import ConfigError

# The conversation the template's continuations are read from: a user turn and an
# assistant reply that is a placeholder (never part of an episode's tokens).
_USER = {"role": "user", "content": "pt-probe-question"}
_REPLY = "pt-probe-reply"
_CALL = {"type": "function", "function": {"name": "pt_probe", "arguments": {}}}


class TurnTemplate:
    """``tokenizer``'s chat template, as an episode's turns are appended with it;
    ``tools``: the tools' JSON schemas, rendered into the opening as the template does."""

    def __init__(self, tokenizer: Any, *, tools: list[dict] | None = None):
        self.tokenizer = tokenizer
        self.tools = tools or None
        eot = end_of_turn_ids(tokenizer)
        if not eot:
            raise ConfigError(
                "the chat template ends an assistant turn with no special token, so an "
                "episode cannot tell where a turn of the policy ends",
                hint="use a template that closes each assistant turn with one (chatml, the "
                "model's own), e.g. --chat-template chatml",
            )
        self.end_of_turn = eot[0]
        # the ids that may close a turn of the policy (its end-of-turn, end of text)
        self.closing_ids = set(eot) | {
            i for i in [getattr(tokenizer, "eos_token_id", None)] if isinstance(i, int)
        }
        self.end_text = tokenizer.decode([self.end_of_turn])
        opened = self.render([_USER], generation=True)
        replied = self.render([_USER, {"role": "assistant", "content": _REPLY}])
        closing = replied[len(opened) + len(_REPLY) :]
        if not replied.startswith(opened + _REPLY) or not closing.startswith(self.end_text):
            raise ConfigError(
                "the chat template does not render an assistant reply as its generation "
                f"prompt, the reply and {self.end_text!r}, so an episode's turns cannot be "
                "appended after the sampled ids",
                hint="use a template that does (chatml, or the model's own)",
            )
        # what the template writes after the end-of-turn token the policy samples
        self.after_turn = closing[len(self.end_text) :]
        self._rendered: dict[bool, str] = {}
        if self.tools and self.render([_USER]) == self.render([_USER], tools=None):
            # the model would be asked to call tools it was never shown
            raise ConfigError(
                "the chat template does not render the tools offered (its rendering is the "
                "same with and without them), so the policy would never see their schemas",
                hint="use a template with tool support (the model's own Qwen2.5 or Llama "
                "3.1 template, or chatml)",
            )

    _OWN = object()

    def render(self, messages: list[dict], *, generation: bool = False, tools: Any = _OWN) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools if tools is TurnTemplate._OWN else tools,
            tokenize=False, add_generation_prompt=generation,
        )  # fmt: skip

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def opening(self, messages: list[dict]) -> list[int]:
        """The ids of an episode's opening messages and the first generation prompt."""
        return self.ids(self.render(messages, generation=True))

    def append(self, messages: list[dict]) -> list[int]:
        """The ids that follow an assistant turn the policy ended with its end-of-turn
        token, when the environment answers with ``messages``: the rest of the turn's
        closing, the messages, the next generation prompt."""
        calls = any(m.get("role") == "tool" for m in messages)
        if calls not in self._rendered:
            self._rendered[calls] = self.render([_USER, self._reply(calls)])
        before = self._rendered[calls]
        after = self.render([_USER, self._reply(calls), *messages], generation=True)
        if not after.startswith(before):
            roles = ", ".join(sorted({str(m.get("role")) for m in messages}))
            raise ConfigError(
                f"the chat template renders the turns before a {roles} message otherwise "
                "once it is added, so the episode's earlier tokens would change",
                hint="use a template that only appends (chatml, or the model's own)",
            )
        return self.ids(self.after_turn + after[len(before) :])

    @staticmethod
    def _reply(calls: bool) -> dict:
        """The placeholder reply the new messages follow (a tool's answer follows a turn
        that called it)."""
        reply: dict = {"role": "assistant", "content": _REPLY}
        if calls:
            reply["tool_calls"] = [_CALL]
        return reply

    def check(self, roles: tuple[str, ...] = ("user", "tool")) -> None:
        """Refuse, at start, a template that cannot append a message of each of ``roles``."""
        for role in roles:
            text = self.tokenizer.decode(
                self.append([{"role": role, "content": "pt-probe-answer"}])
            )
            if "pt-probe-answer" not in text:
                raise ConfigError(
                    f"the chat template drops the content of a {role} message, so the "
                    f"policy would never read what the environment answers as {role}",
                    hint="use a template that renders every role (chatml, or the model's own)",
                )
