"""A micro-batch as the trainer sees it, whatever produced it.

Rows of token ids (each row one sequence or several packed ones), the next-token target
of every position (``IGNORE_INDEX`` where nothing is trained), which sequence each
trained token belongs to, and the objective's own per-sequence or per-token data
(reference log-probs, a teacher's top-k, advantages...).

Padding forms its own sequence (positions restart at 0 there) with no loss, so a real
token never attends to it and no padded query row is empty. ``flash_attention_2`` finds
the sequences from ``position_ids`` (varlen); sdpa and eager get an explicit
block-diagonal causal mask (batch, 1, seq, seq).

With such a mask a row may also hold a shared prefix: its first ``shared_prefix`` tokens
are seen by every sequence of the row, so completions sampled from one prompt can hold the
prompt once (:func:`pt_train.producers.rollouts.shared_prompt_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from pt_core.contracts import IGNORE_INDEX


@dataclass
class Row:
    """One row of tokens: a sequence, or several packed ones (positions restart at 0)."""

    input_ids: np.ndarray  # (len,) int64
    labels: np.ndarray  # (len,) int64, IGNORE_INDEX where no loss
    position_ids: np.ndarray  # (len,) restarting at 0 for every packed sequence
    # Leading tokens every sequence of the row attends to (a prompt its sequences share;
    # their positions continue from it). Needs the dense mask of sdpa or eager.
    shared_prefix: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class Batch:
    input_ids: torch.Tensor  # [R, L]
    position_ids: torch.Tensor  # [R, L]
    attention_mask: torch.Tensor | None  # [R, 1, L, L], or None for flash_attention_2
    targets: torch.Tensor  # [R, L-1]: the token after each position, IGNORE_INDEX if untrained
    token_sequence: torch.Tensor  # [N]: the sequence (0..S-1) of each trained target
    num_sequences: int  # S: sequences in the batch, in row-major order, padding not counted
    tokens: int  # real (unpadded) tokens, for throughput
    data: dict[str, torch.Tensor] = field(default_factory=dict)
    row_lengths: list[int] | None = None  # [R] unpadded length of each right-padded row

    @property
    def num_trained(self) -> int:
        return int(self.token_sequence.numel())

    def model_inputs(self, device, float_dtype) -> dict:
        mask = self.attention_mask
        if mask is not None:
            mask = mask.to(device)
            if mask.is_floating_point():
                mask = mask.to(float_dtype)
        return {
            "input_ids": self.input_ids.to(device),
            "position_ids": self.position_ids.to(device),
            "attention_mask": mask,
        }

    def to(self, device) -> Batch:
        return Batch(
            self.input_ids,
            self.position_ids,
            self.attention_mask,
            self.targets.to(device),
            self.token_sequence.to(device),
            self.num_sequences,
            self.tokens,
            {k: v.to(device) for k, v in self.data.items()},
            self.row_lengths,
        )


def collate(
    rows: list[Row], pad_token_id: int, attn_implementation: str = "sdpa", data: dict | None = None
) -> Batch:
    """Pad rows to the longest one and build what the model and the objective need."""
    length = max(len(r) for r in rows)
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)
    labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)
    position_ids = torch.zeros((batch, length), dtype=torch.long)
    # The sequence of each real token, numbered across the batch; -1 on padding.
    sequence = torch.full((batch, length), -1, dtype=torch.long)
    sequences = 0
    for i, r in enumerate(rows):
        n = len(r)
        input_ids[i, :n] = torch.from_numpy(np.asarray(r.input_ids, dtype=np.int64))
        labels[i, :n] = torch.from_numpy(np.asarray(r.labels, dtype=np.int64))
        positions = torch.from_numpy(np.asarray(r.position_ids, dtype=np.int64))
        position_ids[i, :n] = positions
        position_ids[i, n:] = torch.arange(length - n)
        starts = sequence_starts(positions[None])[0]
        sequence[i, :n] = starts.long().cumsum(0) - 1 + sequences
        sequences += int(starts.sum())
    targets = shift_targets(labels, position_ids)
    trained = targets != IGNORE_INDEX
    prefix = torch.tensor([r.shared_prefix for r in rows], dtype=torch.long)
    if attn_implementation == "flash_attention_2":
        if prefix.any():
            raise ValueError("a shared prefix needs a dense mask (sdpa or eager attention)")
        mask = None
    else:
        mask = block_causal_mask(
            position_ids, as_bool=attn_implementation == "sdpa", shared_prefix=prefix
        )
    return Batch(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=mask,
        targets=targets,
        token_sequence=sequence[:, 1:][trained],
        num_sequences=sequences,
        tokens=int(sum(len(r) for r in rows)),
        data=dict(data or {}),
        row_lengths=[len(r) for r in rows],
    )


def shift_targets(labels: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Targets for next-token prediction from labels aligned with the inputs.

    (batch, seq) -> (batch, seq - 1): ``targets[:, t] = labels[:, t + 1]``, except where
    token ``t + 1`` starts a new packed sequence (position 0): the last token of one
    sequence never learns to predict the first token of the next.
    """
    targets = labels[:, 1:].clone()
    targets[position_ids[:, 1:] == 0] = IGNORE_INDEX
    return targets


def sequence_starts(position_ids: torch.Tensor) -> torch.Tensor:
    """(batch, seq) -> bool, True where a new sequence starts: wherever the position does
    not continue the previous one."""
    starts = torch.ones_like(position_ids, dtype=torch.bool)
    starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
    return starts


def block_causal_mask(
    position_ids: torch.Tensor, *, as_bool: bool, shared_prefix: torch.Tensor | None = None
) -> torch.Tensor:
    """(batch, seq) positions -> (batch, 1, seq, seq) mask: query q sees key k when both
    are in the same packed sequence and k <= q, or when k is in the row's shared prefix
    (its first ``shared_prefix[row]`` tokens). Bool (True = attend) for sdpa, additive
    float (0 / -inf-like) for eager attention."""
    seq = position_ids.shape[1]
    seq_id = sequence_starts(position_ids).long().cumsum(-1)  # (batch, seq)
    same = seq_id[:, :, None] == seq_id[:, None, :]  # (batch, seq, seq)
    if shared_prefix is not None and bool(shared_prefix.any()):
        in_prefix = torch.arange(seq)[None, :] < shared_prefix[:, None]  # (batch, seq) keys
        same = same | in_prefix[:, None, :]
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    mask = (same & causal)[:, None]  # (batch, 1, seq, seq)
    if as_bool:
        return mask
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def pack_in_order(rows: list[Row], max_length: int) -> list[Row]:
    """Concatenate consecutive sequences into rows of at most ``max_length`` tokens, in
    order (a sequence longer than that is a row of its own), so that the k-th sequence of
    the result is the k-th of the input."""
    packed: list[list[Row]] = []
    used = 0
    for r in rows:
        if packed and used + len(r) <= max_length:
            packed[-1].append(r)
            used += len(r)
        else:
            packed.append([r])
            used = len(r)
    return [
        Row(
            np.concatenate([r.input_ids for r in group]),
            np.concatenate([r.labels for r in group]),
            np.concatenate([r.position_ids for r in group]),
        )
        for group in packed
    ]
