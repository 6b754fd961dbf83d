"""Fixed data: token rows (SFT, DFT, ASFT) and preference pairs (DPO), in an order that is
a pure function of (seed, step); see :class:`pt_train.data.StepSampler`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from pt_train.batch import Batch, collate, pack_in_order
from pt_train.data import Pair, StepSampler, count_tokens
from pt_train.producers.base import Producer


class FixedData(Producer):
    """Items (rows or pairs) sampled by step; ``to_batch`` makes one micro-batch of them.

    ``micro_batch_size`` items per micro-batch: a pair is one item, so a pair is never
    split between micro-batches or ranks.
    """

    def __init__(
        self,
        items: Sequence,
        to_batch: Callable[[list[int]], Batch],
        *,
        global_batch_size: int,
        micro_batch_size: int,
        seed: int,
        shuffle: bool,
        rank: int,
        world_size: int,
    ):
        self.items = items
        self.to_batch = to_batch
        self.num_rows = len(items)
        self.num_tokens = count_tokens(items)
        self.micro_batch_size = micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.sampler = StepSampler(len(items), global_batch_size, seed=seed, shuffle=shuffle)

    def micro_batches(self, step: int) -> list[Batch]:
        indices = self.sampler.micro_batches(
            step, self.rank, self.world_size, self.micro_batch_size
        )
        return [self.to_batch(mb) for mb in indices]


def rows_producer(rows, *, pad_token_id: int, attn_implementation: str, **sampling) -> FixedData:
    """Token rows as they are (pt-data packs them); one micro-batch = ``micro_batch_size``
    rows padded to the longest."""

    def to_batch(indices: list[int]) -> Batch:
        return collate([rows[i] for i in indices], pad_token_id, attn_implementation)

    return FixedData(rows, to_batch, **sampling)


def pairs_producer(
    pairs: list[Pair],
    *,
    pad_token_id: int,
    attn_implementation: str,
    max_seq_length: int,
    reference_logps: np.ndarray | None = None,
    **sampling,
) -> FixedData:
    """Preference pairs; a micro-batch holds the chosen and rejected sequences of its pairs
    in the order chosen, rejected, chosen, ... With ``flash_attention_2`` they are packed
    into rows of ``max_seq_length`` tokens (its variable-length kernel attends within each
    sequence only, so packing costs nothing and saves the padding); with sdpa and eager,
    whose masks are dense, each sequence is a row of its own, padded to the longest, since
    attention over a packed row costs the square of the row's length.
    ``reference_logps`` ([pairs, 2], chosen and rejected) attaches precomputed reference
    log-probs."""
    pack = attn_implementation == "flash_attention_2"

    def to_batch(indices: list[int]) -> Batch:
        sequences = [row for i in indices for row in pairs[i].sequences()]
        data = {}
        if reference_logps is not None:
            data["ref_logps"] = torch.from_numpy(
                np.asarray(reference_logps[indices], dtype=np.float64).reshape(-1)
            )
        if pack:
            sequences = pack_in_order(sequences, max_seq_length)
        return collate(sequences, pad_token_id, attn_implementation, data)

    return FixedData(pairs, to_batch, **sampling)
