"""Chat templates: the tokenizer's own, a named one from a small registry, or a Jinja file.

A template is rendered here with the same Jinja environment settings Hugging Face
uses (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``), compiled
once per template string, so rendering a million conversations does not re-parse it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pt_core.errors import ConfigError, InputError

# ChatML with one BOS at the start (the BOS is omitted by tokenizers that have none).
CHATML = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Plain "Role: text" turns for base models without special tokens; EOS ends each assistant turn.
PLAIN = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}"
    "{% else %}{{ 'Assistant: ' + message['content'] + eos_token + '\\n\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)

TEMPLATES: dict[str, str] = {"chatml": CHATML, "plain": PLAIN}


def resolve_template(tokenizer: Any, chat_template: str | None) -> str:
    """The Jinja source to use: ``None`` means the tokenizer's own template; a registered
    name (``chatml``, ``plain``); a path to a ``.jinja`` file; or a literal Jinja string."""
    if chat_template is None:
        own = getattr(tokenizer, "chat_template", None)
        if isinstance(own, dict):  # some tokenizers keep several named templates
            own = own.get("default") or next(iter(own.values()), None)
        if not own:
            raise ConfigError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template",
                hint=f"set data.tokenizer.chat_template to one of {', '.join(TEMPLATES)} "
                "or to a .jinja file",
            )
        return own
    if chat_template in TEMPLATES:
        return TEMPLATES[chat_template]
    if "{" not in chat_template:
        path = Path(chat_template)
        if path.is_file():
            return path.read_text(encoding="utf-8")
        raise ConfigError(
            f"chat_template {chat_template!r} is neither a known template nor a file",
            hint=f"use one of {', '.join(TEMPLATES)}, a path to a .jinja file, or leave it "
            "unset to use the tokenizer's own template",
        )
    return chat_template


def _raise(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _generation_extension():
    """``{% generation %}...{% endgeneration %}`` rendered as its plain body: masks come
    from incremental rendering here, so templates that carry the markers still work."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class GenerationTag(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_body", [])
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag


def _strftime_now(fmt: str) -> str:
    from datetime import datetime

    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=32)
def compile_template(source: str):
    """Compile with the settings Hugging Face's ``apply_chat_template`` uses."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.loopcontrols", _generation_extension()],
    )
    env.filters["tojson"] = lambda x, indent=None, separators=None, sort_keys=False, **_: (
        json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


class Renderer:
    """Renders message lists with one template and one tokenizer's special tokens."""

    def __init__(self, tokenizer: Any, chat_template: str | None = None):
        from jinja2.exceptions import TemplateSyntaxError

        self.source = resolve_template(tokenizer, chat_template)
        try:
            self.template = compile_template(self.source)
        except TemplateSyntaxError as exc:
            raise ConfigError(
                f"chat template {chat_template or 'of the tokenizer'}: line {exc.lineno}: "
                f"{exc.message}",
                hint="fix the Jinja syntax, or use a named template (chatml)",
            ) from None
        self.context = {
            "bos_token": getattr(tokenizer, "bos_token", None) or "",
            "eos_token": getattr(tokenizer, "eos_token", None) or "",
            "pad_token": getattr(tokenizer, "pad_token", None) or "",
            "unk_token": getattr(tokenizer, "unk_token", None) or "",
        }

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        from jinja2.exceptions import TemplateError

        try:
            return self.template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.context
            )
        except TemplateError as exc:
            raise InputError(
                f"chat template failed to render a conversation: {exc}",
                hint="check the roles and order of the messages, or use another template",
            ) from None
