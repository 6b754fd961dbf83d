"""Packing tokenized sequences into rows of at most ``max_seq_length`` tokens.

Best-fit-decreasing: sequences are taken longest first, and each goes into the
open row whose free space is the smallest that still fits it (a new row when
none fits). A segment tree over free-space values finds that row in
O(log max_seq_length). Sequences are never split; ``position_ids`` restart at 0
for every sequence and ``seq_lens`` lists the lengths, so the trainer can keep
attention inside each sequence (varlen / block-diagonal masks).

Packing efficiency is the fraction of real tokens once every row is padded to
``max_seq_length``: ``tokens / (rows * max_seq_length)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pt_core.errors import InputError


class _FreeSpaceTree:
    """Which free-space values some open row has, and the smallest one >= a length.

    Leaf ``v`` holds ``v`` while at least one row has exactly ``v`` tokens free, else 0;
    inner nodes hold the max of their children, so the leftmost leaf >= ``length`` is
    found by walking down, going left whenever the left subtree's max suffices.
    """

    def __init__(self, maxval: int):
        self.size = 1 << max(0, (maxval - 1).bit_length())
        self.tree = [0] * (2 * self.size)

    def _set(self, val: int, present: bool) -> None:
        tree = self.tree
        i = self.size + val - 1
        tree[i] = val if present else 0
        i >>= 1
        while i:
            left, right = tree[2 * i], tree[2 * i + 1]
            tree[i] = left if left >= right else right
            i >>= 1

    def add(self, val: int) -> None:
        self._set(val, True)

    def remove(self, val: int) -> None:
        self._set(val, False)

    def smallest_at_least(self, length: int) -> int:
        """The smallest present value >= ``length``, or 0 when there is none."""
        tree = self.tree
        if tree[1] < length:
            return 0
        i = 1
        while i < self.size:
            i = 2 * i if tree[2 * i] >= length else 2 * i + 1
        return tree[i]


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of indices into ``lengths``, each summing to at most ``capacity``.

    Deterministic: ties in length keep their input order, and bins are returned in
    the order they were opened.
    """
    for i, n in enumerate(lengths):
        if n == 0:
            raise InputError(f"sequence {i} is empty; there is nothing to pack")
        if n > capacity:
            raise InputError(
                f"sequence {i} has {n} tokens, more than max_seq_length={capacity}; "
                "packing never splits a sequence",
                hint="truncate or drop long sequences first (data.tokenizer.truncate: true)",
            )
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    tree = _FreeSpaceTree(capacity)
    by_space: dict[int, list[int]] = {}  # free space -> open bins with exactly that space
    bins: list[list[int]] = []
    for idx in order:
        n = lengths[idx]
        space = tree.smallest_at_least(n)
        if space:
            stack = by_space[space]
            b = stack.pop()
            if not stack:
                tree.remove(space)
        else:
            b = len(bins)
            bins.append([])
            space = capacity
        bins[b].append(idx)
        left = space - n
        if left:
            stack = by_space.setdefault(left, [])
            if not stack:
                tree.add(left)
            stack.append(b)
    return bins


def pack_examples(examples: Sequence[dict], max_seq_length: int) -> list[dict]:
    """Pack ``{"input_ids", "labels"}`` examples into tokenized rows.

    Each row: ``input_ids``, ``labels``, ``position_ids`` (restarting at 0 for every
    packed sequence) and ``seq_lens`` (summing to the row length). Rows are not padded.
    """
    lengths = [len(e["input_ids"]) for e in examples]
    rows = []
    for members in best_fit_decreasing(lengths, max_seq_length):
        rows.append(concat_examples([examples[i] for i in members]))
    return rows


def single_rows(examples: Sequence[dict]) -> list[dict]:
    """One sequence per row (no packing), in the same row schema."""
    return [concat_examples([e]) for e in examples]


def concat_examples(members: Sequence[dict]) -> dict:
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    seq_lens: list[int] = []
    for e in members:
        n = len(e["input_ids"])
        if len(e["labels"]) != n:
            raise InputError(f"an example has {n} input_ids but {len(e['labels'])} labels")
        input_ids += e["input_ids"]
        labels += e["labels"]
        position_ids += range(n)
        seq_lens.append(n)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "seq_lens": seq_lens,
    }


def packing_efficiency(row_lengths: Sequence[int], max_seq_length: int) -> float:
    """Real tokens over the slots of rows padded to ``max_seq_length`` (1.0 = no padding)."""
    if not row_lengths:
        return 0.0
    return sum(row_lengths) / (len(row_lengths) * max_seq_length)


# --------------------------------------------------------------------------- flat arrays


def gather_segments(offsets, order, lengths=None):
    """Token indices of segments ``order`` laid end to end (numpy, no Python loop).

    ``offsets`` (n+1) delimit n segments of a flat array; ``lengths`` may shorten them
    (truncation keeps each segment's head). Returns (indices, new_offsets).
    """
    import numpy as np

    order = np.asarray(order, dtype=np.int64)
    starts = offsets[:-1][order]
    seg_lens = (offsets[1:] - offsets[:-1])[order] if lengths is None else lengths[order]
    new_offsets = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(seg_lens, out=new_offsets[1:])
    total = int(new_offsets[-1])
    index = np.arange(total, dtype=np.int64) - np.repeat(new_offsets[:-1] - starts, seg_lens)
    return index, new_offsets


def pack_table(ids, labels, offsets, max_seq_length: int, *, packing: bool = True):
    """Tokenized sequences held flat (``ids``/``labels`` int32, ``offsets`` n+1) -> a pyarrow
    table of rows (``input_ids``, ``labels``, ``position_ids``, ``seq_lens``), packed by
    best-fit-decreasing or one sequence per row. Same rows as :func:`pack_examples`."""
    import pyarrow as pa

    return pa.concat_tables(pack_tables(ids, labels, offsets, max_seq_length, packing=packing))


# packed rows gathered at a time: the copies and index arrays are of this many rows, not
# of the chunk
PACK_SLICE_ROWS = 8192


def pack_tables(ids, labels, offsets, max_seq_length: int, *, packing: bool = True):
    """:func:`pack_table`'s rows as tables of at most ``PACK_SLICE_ROWS`` rows each, made
    one at a time (the bins are found over all the sequences first)."""
    import numpy as np

    lengths = offsets[1:] - offsets[:-1]
    if packing:
        bins = best_fit_decreasing(lengths.tolist(), max_seq_length)
    else:
        bins = [[i] for i in range(len(lengths))]
    for at in range(0, max(len(bins), 1), PACK_SLICE_ROWS):
        part = bins[at : at + PACK_SLICE_ROWS]
        count = sum(len(b) for b in part)
        order = np.fromiter((i for b in part for i in b), dtype=np.int64, count=count)
        yield _gather_rows(ids, labels, offsets, lengths, order, [len(b) for b in part])


def _gather_rows(ids, labels, offsets, lengths, order, members_per_row):
    """One table of packed rows: the sequences ``order``, ``members_per_row`` to a row."""
    import numpy as np
    import pyarrow as pa

    index, seq_offsets = gather_segments(offsets, order)
    seq_lens = lengths[order]
    positions = np.arange(len(index), dtype=np.int64) - np.repeat(seq_offsets[:-1], seq_lens)
    members = np.zeros(len(members_per_row) + 1, dtype=np.int64)
    np.cumsum(members_per_row, out=members[1:])
    row_offsets = seq_offsets[members].astype(np.int32)

    def lists(values):
        return pa.ListArray.from_arrays(pa.array(row_offsets), pa.array(values))

    return pa.table(
        {
            "input_ids": lists(ids[index].astype(np.int32, copy=False)),
            "labels": lists(labels[index].astype(np.int32, copy=False)),
            "position_ids": lists(positions.astype(np.int32)),
            "seq_lens": pa.ListArray.from_arrays(
                pa.array(members.astype(np.int32)), pa.array(seq_lens.astype(np.int32))
            ),
        }
    )
