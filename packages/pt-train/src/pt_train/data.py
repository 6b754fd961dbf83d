"""Training rows, the order they are seen in, and micro-batches.

Rows are pt-data's tokenized rows (``input_ids``, ``labels``, ``position_ids``,
``seq_lens``), read from a dataset directory or file, or made here from
conversations with pt-data's own tokenize and pack functions.

The order is a pure function of (seed, epoch): every epoch is a fresh
permutation seeded by ``(seed, epoch)``, and the epochs are laid end to end as
one stream. Optimizer step ``s`` takes stream positions
``[s * global_batch_size, (s + 1) * global_batch_size)``, so resuming at step
``s`` needs nothing but ``s``, and the data order continues exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_core.files import iter_rows, require_columns, split_path
from pt_core.log import get_logger
from pt_train.config import DataConfig

log = get_logger(__name__)


@dataclass
class Row:
    input_ids: np.ndarray  # (len,) int64
    labels: np.ndarray  # (len,) int64, IGNORE_INDEX where no loss
    position_ids: np.ndarray  # (len,) restarting at 0 for every packed sequence

    def __len__(self) -> int:
        return len(self.input_ids)


def load_rows(data: DataConfig, path: str | Path, tokenizer) -> list[Row]:
    """Every training row of ``path`` (pt-data directory, file, or directory of shards)."""
    source = split_path(path, data.split)
    rows = iter_rows(source)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{source}: no rows", hint="point data.path at a non-empty dataset")
    if "input_ids" in first:
        require_columns(first, ("input_ids", "labels"), str(source))
        out = [_tokenized_row(first, source, 0)]
        out += [_tokenized_row(r, source, i) for i, r in enumerate(rows, start=1)]
    elif "messages" in first:
        out = _tokenize_conversations([first, *rows], data, tokenizer)
    else:
        raise InputError(
            f"{source}: rows have neither 'input_ids' (tokenized) nor 'messages' "
            f"(conversations); they have: {', '.join(map(repr, first))}",
            hint="build the dataset with pt-data, or give conversations with a 'messages' column",
        )
    return out


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


def _tokenize_conversations(rows: list[dict], data: DataConfig, tokenizer) -> list[Row]:
    from pt_data.pack import pack_examples, single_rows
    from pt_data.tokenize import tokenize_conversation

    examples = [
        tokenize_conversation(
            tokenizer,
            r["messages"],
            max_seq_length=data.max_seq_length,
            train_on=data.train_on,
            truncate=data.truncate,
        )
        for r in rows
    ]
    packed = pack_examples(examples, data.max_seq_length) if data.packing else single_rows(examples)
    log.info(
        "tokenized %d conversations into %d rows%s",
        len(examples),
        len(packed),
        " (packed)" if data.packing else "",
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


def collate(
    rows: list[Row], pad_token_id: int, attn_implementation: str = "sdpa"
) -> dict[str, torch.Tensor | None]:
    """Pad rows to the longest one and build what the model needs to keep packed sequences apart.

    Padding forms its own sequence (positions restart at 0 there) with no loss, so a
    real token never attends to it and no padded query row is empty.
    ``flash_attention_2`` finds the sequences from ``position_ids`` (varlen); sdpa
    and eager get an explicit block-diagonal causal mask (batch, 1, seq, seq).
    """
    length = max(len(r) for r in rows)
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((batch, length), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r)
        input_ids[i, :n] = torch.from_numpy(r.input_ids)
        labels[i, :n] = torch.from_numpy(r.labels)
        position_ids[i, :n] = torch.from_numpy(r.position_ids)
        position_ids[i, n:] = torch.arange(length - n)
    out = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    out["attention_mask"] = (
        None
        if attn_implementation == "flash_attention_2"
        else block_causal_mask(position_ids, as_bool=attn_implementation == "sdpa")
    )
    return out


def block_causal_mask(position_ids: torch.Tensor, *, as_bool: bool) -> torch.Tensor:
    """(batch, seq) positions -> (batch, 1, seq, seq) mask: query q sees key k when both
    are in the same packed sequence and k <= q. Bool (True = attend) for sdpa, additive
    float (0 / -inf-like) for eager attention."""
    seq = position_ids.shape[1]
    # A new sequence starts wherever the position does not continue the previous one.
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    seq_id = starts.long().cumsum(-1)  # (batch, seq)
    same = seq_id[:, :, None] == seq_id[:, None, :]  # (batch, seq, seq)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = (same & causal)[:, None]  # (batch, 1, seq, seq)
    if as_bool:
        return mask
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def count_tokens(rows: list[Row]) -> int:
    return int(sum(len(r) for r in rows))
