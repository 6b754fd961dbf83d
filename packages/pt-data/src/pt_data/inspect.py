"""Show rows at every stage, so a wrong mask or template is seen before training.

Stages: ``raw`` (as read), ``transformed`` (the row schema), ``formatted`` (the chat
template's text), ``tokenized`` (the text again, trained tokens highlighted, with
token counts and the number of BOS tokens). A built tokenized dataset can be shown
too: its packed rows are decoded sequence by sequence.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError

STAGES = ("raw", "transformed", "formatted", "tokenized")

TRAINED_STYLE = "bold black on green"
PROMPT_STYLE = "dim"


def masked_text(tokenizer, input_ids: list[int], labels: list[int]):
    """A rich Text of the decoded ids: runs of trained tokens highlighted."""
    from rich.text import Text

    text = Text()
    start = 0
    for i in range(1, len(input_ids) + 1):
        if i == len(input_ids) or (labels[i] != IGNORE_INDEX) != (labels[start] != IGNORE_INDEX):
            piece = tokenizer.decode(input_ids[start:i])
            text.append(
                piece, style=TRAINED_STYLE if labels[start] != IGNORE_INDEX else PROMPT_STYLE
            )
            start = i
    return text


def inspect_config(cfg, stage: str, n: int = 3, dataset: int | None = None) -> list[dict[str, Any]]:
    """The first ``n`` rows of each dataset (or of ``dataset``) at ``stage``, as records that
    :func:`show` prints."""
    from pt_data.mix import Mixer

    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    mixer = Mixer(cfg)
    indices = range(len(cfg.datasets)) if dataset is None else [dataset]
    if dataset is not None and not 0 <= dataset < len(cfg.datasets):
        raise InputError(f"--dataset {dataset}: the config has {len(cfg.datasets)} dataset(s)")
    ct = None
    if stage in ("formatted", "tokenized"):
        ct = _conversation_tokenizer(cfg)
    records = []
    for i in indices:
        for raw, row in mixer.transformed(i, limit=n):
            rec: dict[str, Any] = {"source": mixer.names[i]}
            if stage == "raw":
                rec["row"] = raw
            elif stage == "transformed":
                rec["row"] = row
            elif row is None:
                rec["row"] = None
            else:
                messages = _messages(row)
                if stage == "formatted":
                    rec["text"] = ct.renderer.render(messages)
                else:
                    ids, labels = ct.encode(messages)
                    rec["input_ids"], rec["labels"] = ids, labels
                    rec["tokenizer"] = ct.tokenizer
            records.append(rec)
    return records


def _messages(row: dict) -> list[dict]:
    if "messages" in row:
        return row["messages"]
    if "chosen" in row:
        return row["prompt"] + row["chosen"]
    prompt = row["prompt"]
    return prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]


def _conversation_tokenizer(cfg):
    from pt_data.build import load_tokenizer
    from pt_data.tokenize import ConversationTokenizer

    if cfg.tokenizer is None:
        raise InputError(
            "the formatted and tokenized stages need data.tokenizer (for the chat template)",
            hint="add data.tokenizer.name_or_path, or pass data.tokenizer.name_or_path=DIR",
        )
    tok = load_tokenizer(cfg.tokenizer.name_or_path)
    return ConversationTokenizer(
        tok, chat_template=cfg.tokenizer.chat_template, train_on=cfg.tokenizer.train_on
    )


def inspect_dataset(path: str | Path, n: int = 3, split: str = "train", tokenizer=None):
    """The first ``n`` rows of a built dataset; tokenized rows with their tokenizer."""
    from pt_core.files import iter_rows, split_path
    from pt_data.build import load_tokenizer

    p = Path(path)
    records = []
    info = json.loads((p / "dataset.json").read_text()) if (p / "dataset.json").exists() else {}
    for k, row in enumerate(iter_rows(split_path(p, split))):
        if k >= n:
            break
        if "input_ids" in row:
            if tokenizer is None:
                name = (info.get("tokenizer") or {}).get("name_or_path")
                if not name:
                    raise InputError(
                        f"{p}: tokenized rows but no tokenizer recorded in dataset.json",
                        hint="pass --tokenizer DIR",
                    )
                tokenizer = load_tokenizer(name)
            records.append({"source": f"{split} row {k}", **row, "tokenizer": tokenizer})
        else:
            records.append({"source": f"{split} row {k}", "row": row})
    return records, tokenizer


def show(records: list[dict[str, Any]], tokenizer=None) -> None:
    from rich.panel import Panel
    from rich.text import Text

    from pt_core.log import console

    for rec in records:
        title = rec["source"]
        if "row" in rec:
            body: Any = Text(json.dumps(rec["row"], ensure_ascii=False, indent=2, default=str))
        elif "text" in rec:
            body = Text(rec["text"])
        else:
            tok = rec.get("tokenizer") or tokenizer
            ids, labels = rec["input_ids"], rec["labels"]
            trained = sum(1 for x in labels if x != IGNORE_INDEX)
            bos = tok.bos_token_id
            seq_lens = rec.get("seq_lens") or [len(ids)]
            body = Text()
            start = 0
            for j, length in enumerate(seq_lens):
                if len(seq_lens) > 1:
                    body.append(f"[sequence {j}: {length} tokens]\n", style="bold cyan")
                body.append_text(
                    masked_text(tok, ids[start : start + length], labels[start : start + length])
                )
                body.append("\n")
                start += length
            bos_count = sum(1 for x in ids if x == bos) if bos is not None else 0
            title += (
                f" — {len(ids)} tokens, {trained} trained (highlighted), "
                f"{len(seq_lens)} sequence(s), BOS x{bos_count}"
            )
        console.print(Panel(body, title=title, title_align="left"))
