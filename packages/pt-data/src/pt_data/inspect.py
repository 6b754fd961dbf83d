"""Show rows at every stage, so a wrong mask or template is seen before training.

Stages: ``raw`` (as read), ``transformed`` (the row schema), ``formatted`` (the chat
template's text), ``tokenized`` (the text again, trained tokens highlighted, with
token counts and the number of BOS tokens). A built tokenized dataset can be shown
too: its packed rows are decoded sequence by sequence. Preference pairs show the
prompt once, then chosen and rejected side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_core.files import read_dataset_info

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


def inspect_config(
    cfg, stage: str, n: int = 3, dataset: int | None = None, *, skip_bad: bool | None = None
) -> list[dict[str, Any]]:
    """The first ``n`` rows of each dataset (or of ``dataset``) at ``stage``, as records that
    :func:`show` prints."""
    from pt_data.mix import Mixer

    if stage not in STAGES:
        raise InputError(f"unknown stage {stage!r}; stages: {', '.join(STAGES)}")
    mixer = Mixer(cfg, skip_bad=skip_bad or None)
    indices = range(len(cfg.datasets)) if dataset is None else [dataset]
    if dataset is not None and not 0 <= dataset < len(cfg.datasets):
        raise InputError(f"--dataset {dataset}: the config has {len(cfg.datasets)} dataset(s)")
    ct = None
    if stage in ("formatted", "tokenized"):
        ct = _conversation_tokenizer(cfg)
    records = []
    for i in indices:
        for k, (raw, row, dropped) in enumerate(mixer.transformed(i, limit=n)):
            rec: dict[str, Any] = {"source": mixer.names[i]}
            if stage == "raw":
                rec["row"] = raw
            elif row is None:
                rec["row"], rec["dropped"] = raw, dropped
            elif stage == "transformed":
                rec["row"] = row
            else:
                try:
                    rec.update(_template_record(ct, row, stage))
                except InputError as exc:
                    raise InputError(
                        f"{cfg.datasets[i].source} row {k + 1}: {exc.message}", hint=exc.hint
                    ) from None
            records.append(rec)
    return records


def _template_record(ct, row: dict, stage: str) -> dict[str, Any]:
    """A transformed row at the formatted or tokenized stage."""
    if "chosen" in row:
        return _pair_record(ct, row, stage)
    messages, tools = _messages(row), row.get("tools")
    if stage == "formatted":
        return {"text": ct.render(messages, tools)}
    ids, labels = ct.encode(messages, tools)
    return {"input_ids": ids, "labels": labels, "tokenizer": ct.tokenizer}


def _pair_record(ct, row: dict, stage: str) -> dict[str, Any]:
    """A preference row at the formatted stage (the prompt's text, each answer's text after
    it) or tokenized (the tokenized pair, or why it would be dropped)."""
    from pt_data.preferences import PairLimits, get_preference_tokenizer

    if stage == "formatted":
        from pt_data.preferences import normalize_preference_row

        norm, reason = normalize_preference_row(row)
        if norm is None:
            return {"row": row, "dropped": reason}
        render = ct.renderer.render
        prompt = render(norm["prompt"], add_generation_prompt=True)
        pair = {"prompt": prompt}
        for side in ("chosen", "rejected"):
            full = render(norm["prompt"] + norm[side])
            pair[side] = full[len(prompt) :] if full.startswith(prompt) else full
        return {"pair": pair}
    pt = get_preference_tokenizer(ct.tokenizer, ct.renderer.source)
    (result,) = pt.tokenize([row], PairLimits())
    if result.row is None:
        return {"row": row, "dropped": result.reason}
    return {"pair": result.row, "tokenizer": ct.tokenizer}


def _messages(row: dict) -> list[dict]:
    if "messages" in row:
        return row["messages"]
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


def inspect_dataset(
    path: str | Path, n: int = 3, split: str = "train", tokenizer=None, *, skip_bad: bool = False
):
    """The first ``n`` rows of a built dataset; tokenized rows with their tokenizer (pairs
    from rollouts, which record none, are shown from their text columns without one)."""
    from pt_core.files import iter_rows, split_path
    from pt_data.build import load_tokenizer

    p = Path(path)
    records = []
    info = read_dataset_info(p) or {}
    rows = iter_rows(split_path(p, split), skip_bad=skip_bad)
    for k, row in enumerate(rows):
        if k >= n:
            break
        pair = "prompt_input_ids" in row
        has_text = all(isinstance(row.get(c), str | list) for c in ("prompt", "chosen", "rejected"))
        if ("input_ids" in row or pair) and tokenizer is None and not (pair and has_text):
            name = (info.get("tokenizer") or {}).get("name_or_path")
            if not name:
                raise InputError(
                    f"{p}: tokenized rows but no tokenizer recorded in dataset.json",
                    hint="pass --tokenizer DIR (the model's tokenizer directory)",
                )
            if not Path(name).is_absolute() and (Path(p) / name).is_dir():
                name = str(Path(p) / name)  # older datasets kept the path as typed
            tokenizer = load_tokenizer(
                name,
                key=f"{Path(p) / 'dataset.json'}: tokenizer.name_or_path",
                hint="pass --tokenizer DIR (the model's tokenizer directory)",
            )
        if "completion_mask" in row:
            if tokenizer is None:
                raise InputError(
                    f"{p}: episode rows (completion_mask) record no tokenizer",
                    hint="pass --tokenizer DIR (the model's tokenizer directory)",
                )
            records.append(episode_record(row, f"{split} row {k}", tokenizer))
        elif pair:
            records.append({"source": f"{split} row {k}", "pair": row, "tokenizer": tokenizer})
        elif "input_ids" in row:
            records.append({"source": f"{split} row {k}", **row, "tokenizer": tokenizer})
        else:
            records.append({"source": f"{split} row {k}", "row": row})
    if not records:
        raise InputError(f"{p}: no rows to show", hint="check the path and the --split")
    return records, tokenizer


def episode_record(row: dict, source: str, tokenizer) -> dict[str, Any]:
    """An episode's row (pt-rollout generate --env) as token ids and labels: its prompt and
    every id after it, the policy's trained (highlighted), the environment's not."""
    prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
    labels = [IGNORE_INDEX] * len(prompt) + [
        t if m else IGNORE_INDEX for t, m in zip(completion, row["completion_mask"], strict=True)
    ]
    title = (
        f"{source}: episode {row.get('id')!r}, sample {row.get('sample')}, "
        f"{row.get('num_turns')} turns, ended {row.get('finish_reason')}"
    )
    return {"source": title, "input_ids": list(prompt) + list(completion), "labels": labels,
            "tokenizer": tokenizer}  # fmt: skip


def show(records: list[dict[str, Any]], tokenizer=None) -> None:
    from rich.panel import Panel
    from rich.text import Text

    from pt_core.log import console

    for rec in records:
        title = rec["source"]
        if "pair" in rec:
            body, title = _pair_view(rec["pair"], rec.get("tokenizer") or tokenizer, title)
        elif "row" in rec:
            body: Any = Text(json.dumps(rec["row"], ensure_ascii=False, indent=2, default=str))
            if rec.get("dropped"):
                title += f" — dropped ({rec['dropped']})"
        elif "text" in rec:
            body = Text(rec["text"])
        else:
            tok = rec.get("tokenizer") or tokenizer
            assert tok is not None, "token rows are shown with the tokenizer that made them"
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


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt)
    return str(prompt)


def _pair_view(pair: dict, tok, title: str):
    """The prompt once, then a table with chosen and rejected side by side."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(expand=True, show_lines=False)
    parts = []
    ids = "prompt_input_ids" in pair
    if ids and tok is not None:
        prompt = Text(tok.decode(pair["prompt_input_ids"]), style=PROMPT_STYLE)
    else:
        prompt = Text(_prompt_text(pair["prompt"]), style=PROMPT_STYLE)
    cells = []
    for side in ("chosen", "rejected"):
        if not ids:  # the formatted stage: text only
            table.add_column(side)
            cells.append(Text(pair[side]))
            continue
        side_ids, labels = pair[f"{side}_input_ids"], pair[f"{side}_labels"]
        trained = sum(1 for x in labels if x != IGNORE_INDEX)
        table.add_column(f"{side}: {len(side_ids)} tokens, {trained} trained")
        if tok is not None:
            cells.append(masked_text(tok, side_ids, labels))
        else:  # pairs from rollouts: all tokens trained, shown as the sampled text
            style = TRAINED_STYLE if trained == len(side_ids) else ""
            cells.append(Text(str(pair[side]), style=style))
    table.add_row(*cells)
    if ids:
        n_prompt = len(pair["prompt_input_ids"])
        title += f" — prompt {n_prompt} tokens"
        if tok is not None and tok.bos_token_id is not None:
            title += f", BOS x{pair['prompt_input_ids'].count(tok.bos_token_id)}"
        title += "; trained tokens highlighted"
        if pair.get("margin") is not None:
            title += f"; margin {pair['margin']:g}"
    parts.append(Text("prompt", style="bold cyan"))
    parts.append(prompt)
    parts.append(table)
    return Group(*parts), title
