"""Sampled completions as training sequences: pt-rollout's rollout and score rows.

A row is one completion: ``prompt_token_ids`` + ``completion_token_ids``, trained on every
completion token, with what was recorded per completion token (the sampling log-probs,
the teacher's log-probs and top-k) and per sequence (an advantage, the weight version that
generated it). :func:`rollout_batch` lays a micro-batch of them out for the trainer; the
per-token arrays are concatenated in the order of the batch's trained tokens, so
``batch.data["teacher_token_logps"][i]`` belongs to trained token ``i``.

Completions of one prompt that follow each other in a micro-batch (a GRPO group, the n
samples of a prompt) can share a row that holds the prompt once
(:func:`shared_prompt_rows`), as Prefix Grouper does for GRPO (Liu et al. 2025, "Prefix
Grouper: Efficient GRPO Training through Shared-Prefix Forward", arXiv 2506.05433): each
completion attends to the prompt and to itself, so its log-probs are those of its own
row, and the prompt is computed once instead of once per sample.

Piped (``pt-rollout generate | pt-rollout score ... | pt-train run opd.yaml --data -``) the
rows come from a file and are sampled by step like any fixed data; the online loop
(:mod:`pt_train.producers.online`) makes them round by round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_core.files import iter_rows, split_path
from pt_train.batch import Batch, Row, collate, pack_in_order
from pt_train.producers.fixed import FixedData

# row column -> (batch.data key, dtype, values per token: 1 or "k")
TOKEN_COLUMNS = {
    "completion_logprobs": ("rollout_logps", np.float64),
    "teacher_token_logprobs": ("teacher_token_logps", np.float64),
    "teacher_topk_ids": ("teacher_topk_ids", np.int64),
    "teacher_topk_logprobs": ("teacher_topk_logps", np.float64),
    "student_topk_ids": ("student_topk_ids", np.int64),
    "teacher_student_topk_logprobs": ("teacher_student_topk_logps", np.float64),
    "old_logprobs": ("old_logps", np.float64),
}
# row column -> batch.data key, one value per sequence
SEQUENCE_COLUMNS = {
    "advantage": "advantages",
    "weight_version": "weight_versions",
    "staleness": "staleness",
}


@dataclass
class RolloutSample:
    prompt: np.ndarray
    completion: np.ndarray
    tokens: dict[str, np.ndarray] = field(default_factory=dict)  # per trained token
    sequence: dict[str, float] = field(default_factory=dict)  # per sequence
    # 1 where the policy sampled the completion token (trained), 0 where an environment's
    # turn put it (in the context, not trained); None: every completion token is trained
    mask: np.ndarray | None = None

    @property
    def labels(self) -> np.ndarray:
        """The completion's labels: its ids, but the environment's tokens not trained."""
        if self.mask is None:
            return self.completion
        return np.where(self.mask.astype(bool), self.completion, IGNORE_INDEX)

    def row(self) -> Row:
        ids = np.concatenate([self.prompt, self.completion])
        labels = np.concatenate(
            [np.full(len(self.prompt), IGNORE_INDEX, dtype=np.int64), self.labels]
        )
        return Row(ids, labels, np.arange(len(ids)))

    def __len__(self) -> int:
        return len(self.prompt) + len(self.completion)


def shared_prompt_rows(samples: list[RolloutSample], max_length: int | None = None) -> list[Row]:
    """A row per run of consecutive samples with the same prompt, the prompt held once
    (a run is split into rows of at most ``max_length`` tokens, each with the prompt).

    The row is the prompt's first ``P - 1`` tokens (the shared prefix) followed by one
    segment per completion: the prompt's last token, whose output predicts the
    completion's first token, then the completion, at positions ``P - 1`` onwards. Each
    segment attends to the prefix and to itself (:func:`pt_train.batch.block_causal_mask`),
    which is the attention of the sample's own row; its trained targets, sequences and
    per-token data keep the order of the samples.
    """
    runs: list[list[RolloutSample]] = []
    for sample in samples:
        if runs and np.array_equal(runs[-1][0].prompt, sample.prompt):
            runs[-1].append(sample)
        else:
            runs.append([sample])
    rows: list[Row] = []
    for run in runs:
        prompt = run[0].prompt
        start = len(prompt) - 1
        groups: list[list[RolloutSample]] = []
        length = 0
        for sample in run:
            segment = len(sample.completion) + 1
            if not groups or (max_length and length + segment > max_length):
                groups.append([])
                length = start
            groups[-1].append(sample)
            length += segment
        for group in groups:
            if len(group) == 1:
                rows.append(group[0].row())
                continue
            ids, labels, positions = (
                [prompt[:-1]],
                [np.full(start, IGNORE_INDEX)],
                [np.arange(start)],
            )
            for sample in group:
                n = len(sample.completion)
                ids.append(np.concatenate([prompt[-1:], sample.completion]))
                labels.append(np.concatenate([[IGNORE_INDEX], sample.labels]))
                positions.append(np.arange(start, start + n + 1))
            rows.append(
                Row(
                    np.concatenate(ids).astype(np.int64),
                    np.concatenate(labels).astype(np.int64),
                    np.concatenate(positions).astype(np.int64),
                    shared_prefix=start,
                )
            )
    return rows


def sample_from_row(row: dict, where: str, columns: Sequence[str] = ()) -> RolloutSample:
    """One rollout/score row as a sample; ``columns`` are the token and sequence columns
    to keep (others are left out). A row with ``completion_mask`` (an episode's) trains the
    completion tokens marked 1, and its token columns are kept at those tokens."""
    for key in ("prompt_token_ids", "completion_token_ids"):
        value = row.get(key)
        if not isinstance(value, list | np.ndarray) or len(value) == 0:
            raise InputError(
                f"{where}: {key!r} must be a non-empty list of token ids",
                hint="give rows written by pt-rollout generate (and score)",
            )
    prompt = np.asarray(row["prompt_token_ids"], dtype=np.int64)
    completion = np.asarray(row["completion_token_ids"], dtype=np.int64)
    mask = completion_mask(row, len(completion), where)
    sample = RolloutSample(prompt, completion, mask=mask)
    for column in columns:
        if column in TOKEN_COLUMNS:
            key, dtype = TOKEN_COLUMNS[column]
            given = row[column]
            if isinstance(given, list | np.ndarray) and len(given) != len(completion):
                raise InputError(
                    f"{where}: {column!r} has {len(given)} entries for {len(completion)} "
                    "completion tokens",
                    hint="score and generate the same rollouts; do not edit the token columns",
                )
            if mask is not None and isinstance(given, list | np.ndarray):
                given = [v for v, m in zip(given, mask, strict=True) if m]  # the trained
            try:
                values = np.asarray(given, dtype=dtype)
            except (TypeError, ValueError):
                raise InputError(
                    f"{where}: {column!r} is not a list of numbers of one length per token"
                ) from None
            trained = int(mask.sum()) if mask is not None else len(completion)
            if values.shape[:1] != (trained,):
                raise InputError(
                    f"{where}: {column!r} has {values.shape[0] if values.ndim else 0} entries "
                    f"for {len(completion)} completion tokens",
                    hint="score and generate the same rollouts; do not edit the token columns",
                )
            sample.tokens[key] = values
        elif column in SEQUENCE_COLUMNS:
            sample.sequence[SEQUENCE_COLUMNS[column]] = float(row[column])
    return sample


def completion_mask(row: dict, length: int, where: str) -> np.ndarray | None:
    """A row's ``completion_mask`` (1: trained, 0: an environment's token), checked: one
    entry per completion token, each 0 or 1, at least one 1; None where it has none."""
    given = row.get("completion_mask")
    if given is None:
        return None
    mask = np.asarray(given)
    if mask.shape != (length,) or not np.isin(mask, (0, 1)).all() or not mask.any():
        raise InputError(
            f"{where}: 'completion_mask' must hold a 0 or 1 for each of the {length} "
            "completion tokens, with at least one 1",
            hint="give the episode rows pt-rollout generate --env writes as they are",
        )
    return mask.astype(np.int64)


def load_rollouts(data_cfg, path, required: Mapping[str, str]) -> list[RolloutSample]:
    """Every rollout row of ``path``; ``required`` columns (with how to get each) must be
    there, every other known token or sequence column present in the rows is kept too."""
    source = split_path(Path(path), data_cfg.split)
    rows = iter_rows(source)
    first = next(rows, None)
    if first is None:
        raise InputError(f"{source}: no rows", hint="point data.path at rollouts with rows")
    if "completion_token_ids" not in first:
        raise InputError(
            f"{source}: the objective trains on sampled completions, but the rows have "
            f"{', '.join(map(repr, first))}",
            hint="give rows from pt-rollout generate (| pt-rollout score)",
        )
    missing = [c for c in required if c not in first]
    if missing:
        raise InputError(
            f"{source}: the rows lack {', '.join(map(repr, missing))}, which the objective needs",
            hint=required[missing[0]],
        )
    columns = [c for c in (*TOKEN_COLUMNS, *SEQUENCE_COLUMNS) if c in first]
    samples = [sample_from_row(first, f"{source} row 1", columns)]
    for i, row in enumerate(rows, start=2):
        samples.append(sample_from_row(row, f"{source} row {i}", columns))
    widths = {k: {s.tokens[k].shape[1:] for s in samples} for k in samples[0].tokens}
    for key, shapes in widths.items():
        if len(shapes) > 1:
            raise InputError(
                f"{source}: {key} has rows of different widths {sorted(shapes)}",
                hint="score all rows with the same --top-k",
            )
    return samples


def rollout_batch(
    samples: list[RolloutSample],
    pad_token_id: int,
    attn_implementation: str = "sdpa",
    pack_length: int | None = None,
    shared_prompt_length: int | None = None,
) -> Batch:
    """One micro-batch of samples: a row per sequence, or with ``pack_length`` the
    sequences packed in order into rows of at most that many tokens, or with
    ``shared_prompt_length`` (sdpa and eager attention) the samples of one prompt in rows
    of at most that many tokens that hold the prompt once; the per-token and per-sequence
    data laid out in the order of the batch's trained tokens and sequences."""
    if shared_prompt_length and attn_implementation != "flash_attention_2":
        rows = shared_prompt_rows(samples, shared_prompt_length)
    else:
        rows = [s.row() for s in samples]
    if pack_length:
        rows = pack_in_order(rows, pack_length)
    data: dict[str, torch.Tensor] = {}
    for key in samples[0].tokens:
        data[key] = torch.from_numpy(np.concatenate([s.tokens[key] for s in samples]))
    for key in samples[0].sequence:
        data[key] = torch.tensor([s.sequence[key] for s in samples], dtype=torch.float64)
    return collate(rows, pad_token_id, attn_implementation, data)


def rollouts_producer(
    samples: list[RolloutSample],
    *,
    pad_token_id: int,
    attn_implementation: str,
    max_seq_length: int,
    shared_prompt: bool = True,
    **sampling,
) -> FixedData:
    # Packing is free with flash_attention_2's variable-length kernel; with the dense masks
    # of sdpa and eager it would cost the square of the row length (see pairs_producer),
    # but samples of one prompt that meet in a micro-batch can share it.
    pack = max_seq_length if attn_implementation == "flash_attention_2" else None
    shared = max_seq_length if shared_prompt else None

    def to_batch(indices: list[int]) -> Batch:
        return rollout_batch(
            [samples[i] for i in indices], pad_token_id, attn_implementation, pack, shared
        )

    return FixedData(samples, to_batch, **sampling)
