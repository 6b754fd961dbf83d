"""The chat format a model is trained and served in: named templates, the end-of-turn token
a template closes an assistant reply with, and a tokenizer's fingerprint.

Every stage must agree on these. pt-data renders training rows with a template; pt-train
writes that template and the end-of-turn token into the checkpoints it saves;
pt-rollout and the online loop prompt with the same template and stop at the same token;
and token rows are only trained by a model whose tokenizer made them. A base model's
tokenizer (EOS ``<|endoftext|>``) trained on ChatML ends its replies with ``<|im_end|>``:
a stop set made of the tokenizer's EOS alone would let it run past its turn.

These functions take a Hugging Face tokenizer but import nothing heavy, so pt-rollout's
side environment (vLLM's) and pt-core's users can call them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pt_core.errors import ConfigError
from pt_core.log import get_logger

log = get_logger(__name__)

# ChatML with one BOS at the start (the BOS is omitted by tokenizers that have none). Tool
# use as Qwen2.5's ChatML writes it (and vLLM's hermes tool parser reads it): the tools in a
# system turn (after the conversation's own system text), each call of an assistant turn in
# <tool_call> tags as {"name": ..., "arguments": {...}}, a tool's output as a user turn in
# <tool_response> tags. A conversation without tools renders as plain ChatML.
CHATML = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    'and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message['content'] "
    "+ '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') }}"
    "{% for call in message['tool_calls'] or [] %}"
    "{% set function = call['function'] if call['function'] is defined else call %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n{\"name\": \"' + function['name'] + '\", \"arguments\": ' "
    "+ (function['arguments'] | tojson) + '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
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


def own_template(tokenizer: Any) -> str | None:
    """The tokenizer's own template (the default one of a tokenizer that keeps several)."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, dict):
        own = own.get("default") or next(iter(own.values()), None)
    return own or None


def resolve_template(
    tokenizer: Any, chat_template: str | None, *, key: str = "data.tokenizer.chat_template"
) -> str:
    """The Jinja source to use: ``None`` means the tokenizer's own template; a registered
    name (``chatml``, ``plain``); a path to a ``.jinja`` file; or a literal Jinja string.
    ``key`` is the setting the user writes it in, named in errors."""
    if chat_template is None:
        own = own_template(tokenizer)
        if not own:
            raise ConfigError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '?')!r} has no chat template",
                hint=f"set {key} to one of {', '.join(TEMPLATES)} or to a .jinja file",
            )
        return own
    if chat_template in TEMPLATES:
        return TEMPLATES[chat_template]
    if "{" not in chat_template:
        path = Path(chat_template)
        if path.is_file():
            return path.read_text(encoding="utf-8")
        raise ConfigError(
            f"{key} {chat_template!r} is neither a known template nor a file",
            hint=f"use one of {', '.join(TEMPLATES)}, a path to a .jinja file, or leave it "
            "unset to use the tokenizer's own template",
        )
    return chat_template


def special_token_ids(tokenizer: Any) -> set[int]:
    """Ids of every special token: the named ones and the added tokens marked special."""
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False):
            ids.add(int(token_id))
    return ids


_PROBE = "pt-end-of-turn-probe"


def end_of_turn_ids(tokenizer: Any, template: str | None = None) -> tuple[int, ...]:
    """The special token the template closes an assistant reply with (``<|im_end|>`` for
    ChatML, ``<|eot_id|>`` for Llama 3, the EOS for ``plain``), found by rendering a reply
    and reading the first special token after it; ``()`` when the template ends replies
    with plain text only, or when there is no template."""
    template = template if template is not None else own_template(tokenizer)
    if not template:
        return ()
    messages = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False)
    except Exception as exc:  # a template's own raise_exception, or one it cannot render
        log.warning(
            "the chat template cannot render a user turn and a reply (%s); the stop tokens "
            "are the EOS ids alone",
            exc,
        )
        return ()
    at = text.rfind(_PROBE)
    if at < 0:
        return ()
    after = text[at + len(_PROBE) :]
    specials = special_token_ids(tokenizer)
    for token_id in tokenizer(after, add_special_tokens=False)["input_ids"]:
        if token_id in specials:
            return (int(token_id),)
        if tokenizer.decode([token_id]).strip():
            break  # text before any special token: the reply ends with text, not a token
    return ()


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short digest of what token ids mean to ``tokenizer``: its vocabulary, added tokens
    included. Two tokenizers with the same fingerprint turn the same ids into the same text;
    the chat template and which token is called EOS are not part of it (a checkpoint
    trained on ChatML names ``<|im_end|>`` its EOS and still reads its base model's rows)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    digest = hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    return digest.hexdigest()[:16]
