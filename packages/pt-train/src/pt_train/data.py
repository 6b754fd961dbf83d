"""Training rows and the order they are seen in.

Token rows are pt-data's tokenized rows (``input_ids``, ``labels``, ``position_ids``,
``seq_lens``), read from a dataset directory or file, or made here from conversations
with pt-data's own tokenize and pack functions. Preference pairs are pt-data's tokenized
pairs (``prompt_input_ids``, ``chosen_input_ids``, ``chosen_labels``,
``rejected_input_ids``, ``rejected_labels``).

The order is a pure function of (seed, epoch): every epoch is a fresh
permutation seeded by ``(seed, epoch)``, and the epochs are laid end to end as
one stream. Optimizer step ``s`` takes stream positions
``[s * global_batch_size, (s + 1) * global_batch_size)``, so resuming at step
``s`` needs nothing but ``s``, and the data order continues exactly.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pt_core.chat import resolve_template
from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import ConfigError, InputError
from pt_core.files import iter_rows, require_columns, split_path
from pt_core.log import get_logger
from pt_train.batch import Row
from pt_train.config import DataConfig

log = get_logger(__name__)

PAIR_COLUMNS = (
    "prompt_input_ids",
    "chosen_input_ids",
    "chosen_labels",
    "rejected_input_ids",
    "rejected_labels",
)


@dataclass
class Pair:
    """A tokenized preference pair: the prompt once, each completion with its labels."""

    prompt: np.ndarray
    chosen: np.ndarray
    chosen_labels: np.ndarray
    rejected: np.ndarray
    rejected_labels: np.ndarray

    def sequences(self) -> tuple[Row, Row]:
        """The two sequences the model sees, chosen first: prompt + completion, trained on
        the completion's labels only."""
        return self._row(self.chosen, self.chosen_labels), self._row(
            self.rejected, self.rejected_labels
        )

    def _row(self, completion: np.ndarray, labels: np.ndarray) -> Row:
        ids = np.concatenate([self.prompt, completion])
        prompt_labels = np.full(len(self.prompt), IGNORE_INDEX, dtype=np.int64)
        return Row(ids, np.concatenate([prompt_labels, labels]), np.arange(len(ids)))

    def __len__(self) -> int:
        return 2 * len(self.prompt) + len(self.chosen) + len(self.rejected)


def load_rows(
    data: DataConfig, path: str | Path, tokenizer, vocab_size: int | None = None
) -> list[Row]:
    """Every training row of ``path`` (pt-data directory, file, or directory of shards)."""
    source = split_path(path, data.split)
    rows = iter_rows(source)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{source}: no rows", hint="point data.path at a non-empty dataset")
    if "input_ids" in first:
        require_columns(first, ("input_ids", "labels"), str(source))
        _warn_unused(data, "tokenized rows", ("packing", "train_on", "truncate", "max_seq_length"))
        out = [_tokenized_row(first, source, 0)]
        out += [_tokenized_row(r, source, i) for i, r in enumerate(rows, start=1)]
        check_token_ids(((r.input_ids,) for r in out), vocab_size or len(tokenizer), source)
    elif "messages" in first:
        resolve_template(tokenizer, None, key="data.chat_template")  # no template: one error
        out = _tokenize_conversations([first, *rows], data, tokenizer, source)
    elif any(k in first for k in (*PAIR_COLUMNS, "chosen", "rejected")):
        raise InputError(
            f"{source}: these rows are preference pairs; the objective trains on single "
            "sequences (token rows or conversations)",
            hint="use objective.name=dpo for preference pairs, or give SFT data",
        )
    else:
        raise InputError(
            f"{source}: rows have neither 'input_ids' (tokenized) nor 'messages' "
            f"(conversations); they have: {', '.join(map(repr, first))}",
            hint="build the dataset with pt-data, or give conversations with a 'messages' column",
        )
    return out


def load_pairs(
    data: DataConfig, path: str | Path, tokenizer, vocab_size: int | None = None
) -> list[Pair]:
    """Every preference pair of ``path``: pt-data's tokenized pairs, or untokenized
    ``prompt``/``chosen``/``rejected`` rows tokenized here with pt-data's code."""
    source = split_path(path, data.split)
    rows = iter_rows(source)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{source}: no rows", hint="point data.path at a non-empty dataset")
    if all(k in first for k in PAIR_COLUMNS):
        if data.truncate:
            raise ConfigError(
                f"{source}: data.truncate has no effect on tokenized preference pairs (pt-data "
                "cut or dropped them when it built them); remove it, or give untokenized rows"
            )
        _warn_unused(data, "tokenized pairs", ("max_prompt_length", "max_completion_length"))
        pairs = [_tokenized_pair(r, source, i) for i, r in enumerate([first, *rows])]
        check_token_ids(
            ((p.prompt, p.chosen, p.rejected) for p in pairs), vocab_size or len(tokenizer), source
        )
        return pairs
    if "chosen" in first and "rejected" in first:
        # prompt/chosen/rejected, whole conversations sharing a prompt, or HH texts
        resolve_template(tokenizer, None, key="data.chat_template")  # no template: one error
        return _tokenize_pairs([first, *rows], data, tokenizer, source)
    raise InputError(
        f"{source}: the objective trains on preference pairs, but the rows have "
        f"{', '.join(map(repr, first))}",
        hint="give tokenized pairs (pt-data build with format: preferences, or pt-data pairs) "
        "or rows with chosen and rejected (and prompt, unless they share it)",
    )


def check_token_ids(rows, vocab_size: int, source) -> None:
    """Refuse rows holding ids past the model's vocabulary (``vocab_size`` embedding rows):
    another tokenizer made them, and they would index past the embedding. (Rows of a
    smaller vocabulary are caught by the tokenizer fingerprint in dataset.json.)"""
    for index, arrays in enumerate(rows):
        for ids in arrays:
            if len(ids) and (int(ids.max()) >= vocab_size or int(ids.min()) < 0):
                bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
                raise InputError(
                    f"{source}: row {index + 1} holds token id {bad}; the model has ids "
                    f"0..{vocab_size - 1}: the rows were made by another tokenizer",
                    hint="rebuild the data with the model's tokenizer",
                )


def _tokenized_pair(row: dict, source, index: int) -> Pair:
    arrays = {k: np.asarray(row[k], dtype=np.int64) for k in PAIR_COLUMNS}
    for side in ("chosen", "rejected"):
        if len(arrays[f"{side}_input_ids"]) != len(arrays[f"{side}_labels"]):
            raise InputError(
                f"{source}: row {index + 1} has {len(arrays[f'{side}_input_ids'])} "
                f"{side}_input_ids but {len(arrays[f'{side}_labels'])} {side}_labels"
            )
    return Pair(
        arrays["prompt_input_ids"],
        arrays["chosen_input_ids"],
        arrays["chosen_labels"],
        arrays["rejected_input_ids"],
        arrays["rejected_labels"],
    )


def _tokenize_pairs(rows: list[dict], data: DataConfig, tokenizer, source) -> list[Pair]:
    from pt_data.preferences import tokenize_preference_rows

    tokenized, counts = tokenize_preference_rows(
        rows,
        tokenizer,
        max_seq_length=data.max_seq_length,
        max_prompt_length=data.max_prompt_length,
        max_completion_length=data.max_completion_length,
        truncate=data.truncate,
    )
    log.info("tokenized %d preference pairs (%s)", len(tokenized), counts)
    if not tokenized:
        raise InputError(f"{source}: no pair fits data.max_seq_length={data.max_seq_length}")
    return [_tokenized_pair(r, source, i) for i, r in enumerate(tokenized)]


def _warn_unused(data: DataConfig, what: str, keys: tuple[str, ...]) -> None:
    """Say so when the user set ``data`` keys that the rows at hand make meaningless."""
    given = [k for k in keys if k in data.model_fields_set]
    if given:
        log.warning(
            "data.%s %s no effect on %s (they were applied when the rows were built)",
            ", data.".join(given),
            "has" if len(given) == 1 else "have",
            what,
        )


def _tokenized_row(row: dict, source, index: int) -> Row:
    input_ids = np.asarray(row["input_ids"], dtype=np.int64)
    labels = np.asarray(row["labels"], dtype=np.int64)
    if len(labels) != len(input_ids):
        raise InputError(
            f"{source}: row {index} has {len(input_ids)} input_ids but {len(labels)} labels"
        )
    if row.get("position_ids") is not None:
        position_ids = np.asarray(row["position_ids"], dtype=np.int64)
    elif row.get("seq_lens") is not None:
        position_ids = np.concatenate([np.arange(n) for n in row["seq_lens"]])
    else:
        position_ids = np.arange(len(input_ids))
    if len(position_ids) != len(input_ids):
        raise InputError(
            f"{source}: row {index} has {len(input_ids)} input_ids but "
            f"{len(position_ids)} position_ids"
        )
    return Row(input_ids, labels, position_ids)


def _tokenize_conversations(
    rows: list[dict], data: DataConfig, tokenizer, source: Path
) -> list[Row]:
    """Conversations tokenized (and packed) as pt-data builds them, a repeated prompt
    dropped as pt-data's default ``dedup: prompt`` drops it."""
    from pt_data.build import dropped_summary
    from pt_data.mix import prompt_key, stable_hash
    from pt_data.pack import pack_examples, single_rows
    from pt_data.tokenize import tokenize_conversation

    examples = []
    seen_prompts: set[bytes] = set()
    repeats = 0
    for number, r in enumerate(rows, start=1):
        if "messages" not in r:
            raise InputError(
                f"{source} row {number}: missing column 'messages'; the row has: "
                f"{', '.join(map(repr, r)) or 'no columns'}",
                hint="give every row 'messages' (a list of {role, content}), or map other "
                "columns to messages with pt-data build (a transform) first",
            )
        try:
            example = tokenize_conversation(
                tokenizer,
                r["messages"],
                max_seq_length=data.max_seq_length,
                train_on=data.train_on,
                truncate=data.truncate,
                tools=r.get("tools"),
            )
        except InputError as exc:
            raise InputError(f"{source} row {number}: {exc.message}", hint=exc.hint) from None
        digest = stable_hash(prompt_key(r, "conversations"))
        if digest in seen_prompts:
            repeats += 1
            continue
        seen_prompts.add(digest)
        examples.append(example)
    packed = pack_examples(examples, data.max_seq_length) if data.packing else single_rows(examples)
    dropped = {"duplicate": repeats} if repeats else {}
    keep = "pt-data build with data.dedup: none keeps them"
    log.info(
        "tokenized %d conversations into %d rows%s; %d read, %s",
        len(examples),
        len(packed),
        " (packed)" if data.packing else "",
        len(rows),
        dropped_summary(dropped, keep=keep) if dropped else "none dropped",
    )
    return [_tokenized_row(r, "conversations", i) for i, r in enumerate(packed)]


class StepSampler:
    """Which rows each optimizer step, rank and micro-batch sees; see the module docstring."""

    def __init__(self, num_rows: int, global_batch_size: int, *, seed: int, shuffle: bool):
        self.num_rows = num_rows
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self._epoch_cache: tuple[int, np.ndarray] | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            if self.shuffle:
                order = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
            else:
                order = np.arange(self.num_rows)
            self._epoch_cache = (epoch, order)
        return self._epoch_cache[1]

    def global_batch(self, step: int) -> list[int]:
        start = step * self.global_batch_size
        out = []
        for pos in range(start, start + self.global_batch_size):
            epoch, offset = divmod(pos, self.num_rows)
            out.append(int(self.epoch_order(epoch)[offset]))
        return out

    def micro_batches(
        self, step: int, rank: int, world_size: int, micro_batch_size: int
    ) -> list[list[int]]:
        """This rank's rows for ``step``, split into micro-batches (a contiguous share each)."""
        batch = self.global_batch(step)
        per_rank = len(batch) // world_size
        mine = batch[rank * per_rank : (rank + 1) * per_rank]
        return [mine[i : i + micro_batch_size] for i in range(0, per_rank, micro_batch_size)]


def count_tokens(rows: Iterable[Sized]) -> int:
    return int(sum(len(r) for r in rows))
