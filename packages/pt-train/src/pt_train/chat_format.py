"""The chat format a run trains, checked at start and written into every checkpoint.

A model learns the format of its training rows: the chat template they were rendered
with, and the token that closes each reply (labels cover the reply and that token). The
inference checkpoints must carry both, or pt-rollout and pt-eval serve the model a format
it never saw and let it run past the end of its turn:

- the template is the one the data were built with (``dataset.json`` of a pt-data
  dataset), else ``data.chat_template``, else the tokenizer's own; it replaces the
  tokenizer's own for prompting (online loop, evaluation) and in the checkpoints;
- the end-of-turn token of that template becomes the checkpoint's EOS, and leads the
  generation config's EOS list (a base Qwen2.5 names ``<|endoftext|>``; trained on
  ChatML, the checkpoint names ``<|im_end|>`` and keeps ``<|endoftext|>`` as a second
  stop, as Qwen2.5-Instruct does);
- token rows made by another tokenizer are refused (their ids would mean other text).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pt_core.chat import end_of_turn_ids, own_template, resolve_template, tokenizer_fingerprint
from pt_core.errors import ConfigError
from pt_core.files import read_dataset_info
from pt_core.log import get_logger

log = get_logger(__name__)


@dataclass
class ChatFormat:
    template: str | None  # what prompts and checkpoints use; None: the tokenizer has none
    origin: str  # where it was set, for the log and errors
    end_of_turn: tuple[int, ...]  # the token(s) a reply ends with in that template
    checkpoint_tokenizer: Any  # the tokenizer written into checkpoints (EOS = end of turn)

    def generation_eos(self, model) -> list[int]:
        """The generation config's EOS ids: the end of turn first, then what the model had."""
        config = getattr(model, "generation_config", None)
        had = getattr(config, "eos_token_id", None) if config is not None else None
        had = [had] if isinstance(had, int) else list(had or [])
        eos = self.checkpoint_tokenizer.eos_token_id
        ids = [*self.end_of_turn, *had, *([eos] if eos is not None else [])]
        return list(dict.fromkeys(int(i) for i in ids))

    def apply_to(self, model) -> None:
        """Set the model's generation config to stop where its replies end."""
        from transformers import GenerationConfig

        if getattr(model, "generation_config", None) is None:
            model.generation_config = GenerationConfig()
        eos = self.generation_eos(model)
        model.generation_config.eos_token_id = eos[0] if len(eos) == 1 else eos


def dataset_info(path: str | None) -> tuple[dict, Path] | None:
    """``dataset.json`` of the pt-data dataset at ``path`` (or of the dataset a split
    directory or file of it belongs to), and its path."""
    if not path or path == "-":
        return None
    here = Path(path)
    for directory in (here, here.parent, here.parent.parent):
        info = read_dataset_info(directory)
        if info is not None:
            return info, directory / "dataset.json"
    return None


def check_data_tokenizer(data: dict, where: Path, tokenizer) -> None:
    """Refuse token rows whose tokenizer is not the model's (one line, both named)."""
    recorded = data.get("fingerprint")
    if not recorded or recorded == tokenizer_fingerprint(tokenizer):
        return
    theirs = data.get("name_or_path", "another tokenizer")
    size = data.get("vocab_size")
    raise ConfigError(
        f"{where}: the rows were tokenized by {theirs}"
        f"{f' ({size} tokens)' if size else ''}, the model's tokenizer is "
        f"{getattr(tokenizer, 'name_or_path', '?')} ({len(tokenizer)} tokens): their ids would "
        "mean other text to this model",
        hint="rebuild the data with the model's tokenizer (pt-data build with "
        f"data.tokenizer.name_or_path={getattr(tokenizer, 'name_or_path', 'MODEL')}), or train "
        "the model the data were built for",
    )


def run_chat_format(cfg, tokenizer, *, announce: bool = True) -> ChatFormat:
    """Check the data's tokenizer against the model's, set the run's chat template on
    ``tokenizer`` (prompts rendered here use it), and return what checkpoints carry;
    ``announce`` logs the changes (rank 0)."""
    found = dataset_info(cfg.data.path)
    data, where = found if found else ({}, None)
    data_tokenizer = data.get("tokenizer") or {}
    if where is not None:
        check_data_tokenizer(data_tokenizer, where, tokenizer)
    own = own_template(tokenizer)
    built_with = data_tokenizer.get("template")
    if built_with is None and data_tokenizer.get("chat_template") is not None:
        # dataset.json of an older pt-data: the template's name, not its source
        try:
            built_with = resolve_template(tokenizer, data_tokenizer["chat_template"])
        except ConfigError as exc:
            log.warning("%s: the rows' chat template cannot be found again (%s)", where, exc)
    template, origin = own, "the tokenizer's own"
    if cfg.data.chat_template is not None:
        template = resolve_template(tokenizer, cfg.data.chat_template, key="data.chat_template")
        origin = "data.chat_template"
        if built_with is not None and built_with != template:
            raise ConfigError(
                f"data.chat_template={cfg.data.chat_template!r} is not the template {where} "
                "says the rows were built with",
                hint="drop data.chat_template (the rows' template is used), or rebuild the "
                "data with it",
            )
    elif built_with is not None:
        template, origin = built_with, str(where)
    if template is not None and template != own and announce:
        log.info(
            "chat template: %s's (the tokenizer's own %s); prompts and checkpoints use it",
            origin,
            "differs" if own else "is missing",
        )
    if template is not None:
        tokenizer.chat_template = template
    end_of_turn = end_of_turn_ids(tokenizer) if template else ()
    checkpoint_tokenizer = tokenizer
    if end_of_turn and end_of_turn[0] != tokenizer.eos_token_id:
        checkpoint_tokenizer = copy.deepcopy(tokenizer)
        checkpoint_tokenizer.eos_token = tokenizer.convert_ids_to_tokens(end_of_turn[0])
    if checkpoint_tokenizer is not tokenizer and announce:
        log.info(
            "checkpoints: EOS %s (the template's end of turn; the tokenizer's is %s)",
            checkpoint_tokenizer.eos_token,
            tokenizer.eos_token,
        )
    return ChatFormat(template, origin, end_of_turn, checkpoint_tokenizer)
