"""Chat templates: the tokenizer's own, a named one from pt-core's small registry
(:mod:`pt_core.chat`), or a Jinja file.

A template is rendered here with the same Jinja environment settings Hugging Face
uses (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``), compiled
once per template string, so rendering a million conversations does not re-parse it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from pt_core.chat import CHATML, PLAIN, TEMPLATES, resolve_template
from pt_core.errors import ConfigError, InputError

__all__ = ["CHATML", "PLAIN", "TEMPLATES", "Renderer", "compile_template", "resolve_template"]


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

    def render(
        self,
        messages: list[dict],
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
    ) -> str:
        """``tools`` (tool schemas) is passed as ``apply_chat_template`` passes it: always,
        None when there are none, so templates that test ``if tools`` see the same."""
        from jinja2.exceptions import TemplateError

        try:
            return self.template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **self.context,
            )
        except (TemplateError, TypeError) as exc:
            # TypeError: the template joined a value of the messages that is not text
            raise InputError(
                f"chat template failed to render a conversation: {exc}",
                hint="check the roles and order of the messages, or use another template",
            ) from None
