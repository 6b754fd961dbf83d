"""Reading prompts and turning them into token ids.

A prompt row has an ``id`` and a ``prompt`` that is either a string (sent as one user
message through the model's chat template, or as raw text with ``template=False``) or a
list of ``{role, content}`` messages. Benchmark files name the question ``problem`` or
``question``; those are found too. Rows without an ``id`` are numbered by position.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from pt_core.errors import ConfigError, InputError
from pt_core.files import iter_rows, split_path
from pt_core.log import get_logger
from pt_core.manifest import resolve_input

log = get_logger(__name__)

PROMPT_KEYS = ("prompt", "problem", "question", "messages")


@dataclass
class PromptRow:
    id: object
    prompt: object  # str or list of messages, as given
    columns: dict  # the source row, carried into the output
    position: int  # the row's place in the input


def prompts_path(prompts: str | os.PathLike, split: str | None = None) -> Path:
    """The rows behind ``--prompts``: a file, ``-`` (upstream manifest), or a pt-data
    dataset directory, of which the ``test`` split is read when it has one, else ``train``."""
    path, _ = resolve_input(prompts, expected=("dataset", "rollouts", "grades", "scores"))
    if split is None:
        split = "test" if (Path(path) / "test").is_dir() else "train"
    return split_path(path, split)


def read_prompts(
    path: str | os.PathLike, *, prompt_key: str | None = None, id_key: str = "id"
) -> list[PromptRow]:
    rows = []
    seen: dict[str, int] = {}
    key = prompt_key
    for position, row in enumerate(iter_rows(path)):
        if key is None:
            key = next((k for k in PROMPT_KEYS if k in row), None)
            if key is None:
                raise InputError(
                    f"{path}: row 1 has no prompt column ({', '.join(PROMPT_KEYS)}); "
                    f"it has: {', '.join(map(repr, row))}",
                    hint="name the column with --prompt-key",
                )
        if key not in row:
            raise InputError(
                f"{path}: row {position + 1} has no column {key!r}",
                hint="every prompt row needs the prompt column",
            )
        prompt = row[key]
        if not isinstance(prompt, str | list):
            raise InputError(
                f"{path}: row {position + 1}: {key!r} is a {type(prompt).__name__}; "
                "expected a string or a list of messages"
            )
        row_id = row.get(id_key, position)
        marker = json.dumps(row_id, sort_keys=True, default=str)
        if marker in seen:
            raise InputError(
                f"{path}: rows {seen[marker] + 1} and {position + 1} share the id {row_id!r}",
                hint="ids must be unique: output rows are keyed by (id, sample) for resuming",
            )
        seen[marker] = position
        rows.append(PromptRow(row_id, prompt, row, position))
    if not rows:
        raise InputError(f"{path}: no prompt rows")
    warn_assistant_endings(rows, path)
    return rows


def warn_assistant_endings(rows: list[PromptRow], path) -> int:
    """Log one warning when prompts end with an assistant turn: the model would continue that
    answer rather than give its own. Returns how many do."""
    ending = [
        r
        for r in rows
        if isinstance(r.prompt, list)
        and r.prompt
        and isinstance(r.prompt[-1], dict)
        and r.prompt[-1].get("role") == "assistant"
    ]
    if ending:
        log.warning(
            "%s: %d of %d prompts end with an assistant turn (the first: id %r); the model "
            "would follow that answer rather than answer the user. Make prompts from conversations with "
            "pt-data's conversation_prompts transform, which drops the final answer",
            path,
            len(ending),
            len(rows),
            ending[0].id,
        )
    return len(ending)


def prompt_token_ids(
    tokenizer, prompt, *, template: bool = True, system: str | None = None
) -> list[int]:
    """Token ids of one prompt, through the tokenizer's chat template unless ``template`` is
    off; ``system`` becomes a system message (or a leading paragraph of a raw prompt)."""
    if not template:
        if not isinstance(prompt, str):
            raise InputError(
                "--no-template needs string prompts; this one is a list of messages",
                hint="drop --no-template to apply the chat template",
            )
        text = f"{system}\n\n{prompt}" if system else prompt
        return list(tokenizer(text).input_ids)
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system}, *messages]
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            "the model's tokenizer has no chat template",
            hint="give one with --chat-template NAME|FILE (chatml, plain, or a .jinja file), "
            "or pass --no-template to send prompts as raw text",
        )
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)


def use_chat_template(tokenizer, chat_template: str | None, *, key: str = "--chat-template"):
    """Prompt with ``chat_template`` (a name of :data:`pt_core.chat.TEMPLATES`, a .jinja
    file or Jinja source) instead of the tokenizer's own; ``None`` keeps the tokenizer's."""
    from pt_core.chat import resolve_template

    if chat_template is not None:
        tokenizer.chat_template = resolve_template(tokenizer, chat_template, key=key)
    return tokenizer


def stop_token_ids(
    model: str | os.PathLike, tokenizer, *, template: bool = True
) -> tuple[int, ...]:
    """The tokens that end a completion: the tokenizer's EOS, the generation config's, and,
    when prompts go through the chat template, the token the template ends a reply with (a
    base model's EOS is ``<|endoftext|>``; trained on ChatML it ends its turn with
    ``<|im_end|>`` and would otherwise run on past it)."""
    from pt_core.chat import end_of_turn_ids

    ids = set(end_of_turn_ids(tokenizer)) if template else set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model)).eos_token_id
    except OSError:  # a model without generation_config.json: the tokenizer's EOS alone
        eos = None
    ids.update([eos] if isinstance(eos, int) else eos or [])
    return tuple(sorted(ids))
