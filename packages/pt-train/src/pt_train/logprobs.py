"""Per-token log-probs at trained positions, with the LM head applied in chunks.

Every objective needs the log-probability of some tokens at the positions it trains,
never the logits of the whole batch. A model's own forward computes
``[batch, seq, vocab]`` logits at every position (prompt, padding and all), and a loss
in fp32 keeps a log-softmax of the same size for the backward pass: with a 128k
vocabulary that is 1 GiB per 2,048 tokens, each. Here the decoder runs once, the
hidden states of the trained positions are picked out (``[N, hidden]``), and the LM head
is applied to ``chunk_rows`` of them at a time. When there are several chunks, each runs
under activation checkpointing, so its ``[chunk_rows, vocab]`` logits are freed at once
and recomputed one chunk at a time in the backward pass: the memory for logits is one
chunk's, whatever the batch (a single chunk keeps its log-probs for the backward pass,
no more than the recomputation would hold).

What a chunk computes (:class:`HeadRequest`):

- ``logps``: ``[N, K]`` log-probs of given token ids (column 0 is the target token; more
  columns for a teacher's top-k ids), under ``softmax(logits / temperature)``;
- ``entropy``: ``[N]`` entropy of that distribution (no gradient; a metric);
- ``dense``: a function of the chunk's full ``[C, vocab]`` log-probs and of another model's
  (a reference or a teacher, run on the same positions without gradient), for losses
  over the whole vocabulary (ASFT's KL anchor, distillation's dense KL).

:func:`install_token_head` gives a Hugging Face causal LM a second mode of ``forward``
(``model(..., head=request)``), so the DeepSpeed engine, which must run the forward
itself (ZeRO gathers weights and prepares its backward there), computes exactly this.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pt_core.contracts import IGNORE_INDEX

# Bytes of fp32 logits one chunk may hold ([chunk_rows, vocab]); the default keeps a chunk
# at 256 MiB, i.e. 512 positions of a 128k vocabulary.
DEFAULT_CHUNK_MB = 256

DenseFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class HeadRequest:
    """What to compute at the trained positions (``targets != IGNORE_INDEX``).

    ``extra_ids`` ([N, K-1]) adds columns to ``logps`` after the target's. ``dense``
    gets the policy's ``[C, V]`` log-probs and the other model's (``dense_model``) and
    returns ``[C]`` per-position values that carry gradient to the policy only.
    """

    targets: torch.Tensor  # [R, L-1] next-token ids, IGNORE_INDEX where not trained
    temperature: float = 1.0
    extra_ids: torch.Tensor | None = None
    entropy: bool = False
    dense: DenseFn | None = None
    dense_hidden: torch.Tensor | None = None  # [N, H'] the other model's hidden states
    dense_head: Callable | None = None  # maps those to the other model's logits
    chunk_mb: float = DEFAULT_CHUNK_MB
    # [R] unpadded length of each (right-padded) row: with a dense mask the decoder runs
    # on groups of rows of similar length, each cut to its longest (see length_groups)
    row_lengths: list[int] | None = None


class HeadOutput(dict):
    """``logps`` [N, K], and ``entropy`` [N] / ``dense`` [N] when asked for.

    A dict, because DeepSpeed's engine looks for the tensors of a forward's output in
    tensors, tuples, lists and dicts to hook the start of its backward pass on them.
    """

    @property
    def logps(self) -> torch.Tensor:
        return self["logps"]

    @property
    def entropy(self) -> torch.Tensor | None:
        return self.get("entropy")

    @property
    def dense(self) -> torch.Tensor | None:
        return self.get("dense")

    @property
    def token_logps(self) -> torch.Tensor:
        """[N] log-prob of each trained position's target token."""
        return self["logps"][:, 0]


def logit_transform(config) -> Callable[[torch.Tensor], torch.Tensor]:
    """What a model's own forward does to the LM head's output before the softmax
    (Cohere's ``logit_scale``, Granite's ``logits_scaling``, Gemma's final soft-capping),
    so log-probs here are those of the model's forward."""
    scale = getattr(config, "logit_scale", None)
    divide = getattr(config, "logits_scaling", None)
    cap = getattr(config, "final_logit_softcapping", None)

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale:
            logits = logits * scale
        if divide:
            logits = logits / divide
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


def chunk_rows(vocab: int, chunk_mb: float) -> int:
    return max(1, int(chunk_mb * 2**20) // (4 * vocab))


def trained_hidden(hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[R, L, H] decoder output -> [N, H] at the positions whose next token is trained
    (row-major order, the order of ``targets[targets != IGNORE]``)."""
    return hidden[:, :-1][targets != IGNORE_INDEX]


def head_outputs(
    hidden: torch.Tensor,
    lm_head: Callable[[torch.Tensor], torch.Tensor],
    request: HeadRequest,
    vocab: int,
) -> HeadOutput:
    """Apply ``lm_head`` to ``hidden`` ([N, H], the trained positions) chunk by chunk."""
    mask = request.targets != IGNORE_INDEX
    ids = request.targets[mask][:, None]  # [N, 1]
    if request.extra_ids is not None:
        ids = torch.cat([ids, request.extra_ids.to(ids.device)], dim=1)  # [N, K]
    rows = hidden.shape[0]
    step = chunk_rows(vocab, request.chunk_mb)
    # One chunk holds every position: keeping its log-softmax for the backward costs no more
    # than recomputing it there (logits and log-probs of that chunk), and saves the LM head's
    # second forward.
    recompute = torch.is_grad_enabled() and hidden.requires_grad and rows > step
    logps, entropies, denses = [], [], []
    # At least one chunk, even an empty one: every rank must run the LM head (under ZeRO-3
    # its backward is a collective), so that a micro-batch without trained tokens still
    # takes part.
    for start in range(0, max(rows, 1), step):
        end = min(rows, start + step)
        other = request.dense_hidden[start:end] if request.dense_hidden is not None else None
        args = (hidden[start:end], ids[start:end], other)
        fn = _ChunkFn(lm_head, request)
        out = checkpoint(fn, *args, use_reentrant=False) if recompute else fn(*args)
        logps.append(out[0])
        if request.entropy:
            entropies.append(out[1])
        if request.dense is not None:
            denses.append(out[2])
    out = HeadOutput(logps=torch.cat(logps))
    if request.entropy:
        out["entropy"] = torch.cat(entropies)
    if request.dense is not None:
        out["dense"] = torch.cat(denses)
    return out


class _ChunkFn:
    """One chunk: logits -> log-probs of the ids (+ entropy, + dense term), in fp32."""

    def __init__(self, lm_head, request: HeadRequest):
        self.lm_head = lm_head
        self.request = request

    def __call__(self, hidden, ids, other_hidden):
        r = self.request
        logits = self.lm_head(hidden).float()  # [C, V]
        if r.temperature != 1.0:
            logits = logits / r.temperature
        logp = F.log_softmax(logits, dim=-1)  # [C, V]
        picked = logp.gather(-1, ids)  # [C, K]
        entropy = dense = None
        if r.entropy:
            with torch.no_grad():
                entropy = -(logp.exp() * logp).sum(-1)
        if r.dense is not None:
            assert r.dense_head is not None  # set with dense, as dense_hidden is
            with torch.no_grad():
                other = r.dense_head(other_hidden).float()
                if r.temperature != 1.0:
                    other = other / r.temperature
                other_logp = F.log_softmax(other, dim=-1)
            dense = r.dense(logp, other_logp)
        return picked, entropy, dense


# --------------------------------------------------------------------------- the model side


def decoder_and_head(model):
    """The decoder stack and a function from its hidden states to logits, for the
    Hugging Face causal LMs that expose them (``get_decoder`` / ``get_output_embeddings``)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None or decoder is model:
        raise TypeError(
            f"{type(model).__name__} does not expose its decoder and LM head "
            "(get_decoder / get_output_embeddings)"
        )
    transform = logit_transform(model.config)

    def lm_head(hidden: torch.Tensor) -> torch.Tensor:
        return transform(head(hidden))

    return decoder, lm_head


# A decoder call costs about as much as this many more padded positions (its fixed work
# per layer); rows are grouped only where that saves more padding than it costs.
GROUP_COST_TOKENS = 64


def length_groups(lengths: list[int], width: int) -> list[list[int]]:
    """The rows (indices into ``lengths``) of each decoder call: rows sorted by length,
    cut into runs that minimise the positions computed (each run padded to its longest,
    ``GROUP_COST_TOKENS`` per run), by dynamic programming. One run of every row, as
    they are, when ``width`` (the padded length) is already the best."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0.0] + [math.inf] * n  # best[j]: cost of the first j sorted rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        for i in range(j):
            cost = best[i] + (j - i) * longest + GROUP_COST_TOKENS
            if cost < best[j]:
                best[j], cut[j] = cost, i
    if best[n] >= n * width + GROUP_COST_TOKENS:
        return [list(range(n))]
    runs, j = [], n
    while j > 0:
        runs.append(order[cut[j] : j])
        j = cut[j]
    return runs[::-1]


def decoder_trained_hidden(
    decoder, input_ids, position_ids, attention_mask, targets, row_lengths=None
) -> torch.Tensor:
    """[N, H] decoder output at the trained positions (the order of
    ``targets[targets != IGNORE]``).

    With a dense mask ([R, 1, L, L]) and the rows' lengths, rows of similar length run
    together, each group cut to its longest row: a right-padded row's real tokens attend
    only to themselves, so cutting its padding changes nothing but the positions
    computed."""
    groups = None
    if row_lengths is not None and attention_mask is not None and attention_mask.dim() == 4:
        width = input_ids.shape[1]
        groups = length_groups(list(row_lengths), width)
    if groups is None or len(groups) == 1:
        hidden = decoder_hidden(decoder, input_ids, position_ids, attention_mask)
        return trained_hidden(hidden, targets)
    assert row_lengths is not None and attention_mask is not None  # groups were made of them
    per_row: dict[int, torch.Tensor] = {}  # row -> its trained positions' hidden states
    for rows in groups:
        n = max(row_lengths[i] for i in rows)
        index = torch.tensor(rows, device=input_ids.device)
        hidden = decoder_hidden(
            decoder,
            input_ids[index, :n],
            position_ids[index, :n] if position_ids is not None else None,
            attention_mask[index][:, :, :n, :n],
        )
        group_targets = targets[index]
        for k, i in enumerate(rows):
            per_row[i] = hidden[k, : n - 1][group_targets[k, : n - 1] != IGNORE_INDEX]
    out = torch.cat([per_row[i] for i in range(input_ids.shape[0])])
    if out.shape[0] != int((targets != IGNORE_INDEX).sum()):
        raise ValueError("row_lengths: a row has trained positions past its length")
    return out


def decoder_hidden(decoder, input_ids, position_ids, attention_mask) -> torch.Tensor:
    out = decoder(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=attention_mask,
        use_cache=False,
    )
    return out[0] if isinstance(out, tuple) else out.last_hidden_state


@dataclass
class TokenHead:
    """What :func:`install_token_head` keeps on a model (a plain object, so that the
    decoder is not registered a second time as a submodule of the model)."""

    decoder: Callable  # the model's decoder, or a function calling it (pt_train.lora)
    lm_head: Callable
    vocab: int


def install_token_head(model) -> TokenHead:
    """Give ``model`` (a Hugging Face causal LM) a second forward mode:
    ``model(input_ids=..., position_ids=..., attention_mask=..., head=HeadRequest)``
    returns a :class:`HeadOutput` at the trained positions instead of full logits.
    Without ``head`` the forward is the model's own. Idempotent; returns the head."""
    if isinstance(getattr(model, "_pt_head", None), TokenHead):
        return model._pt_head
    decoder, lm_head = decoder_and_head(model)
    weight = model.get_output_embeddings().weight
    # Under ZeRO-3 the weight is a partition; ds_shape is the whole one.
    vocab = int(getattr(weight, "ds_shape", weight.shape)[0])
    token_head = TokenHead(decoder, lm_head, vocab)
    original = model.forward

    def forward(*args, head: HeadRequest | None = None, **kwargs):
        if head is None:
            return original(*args, **kwargs)
        hidden = decoder_trained_hidden(
            decoder,
            kwargs["input_ids"],
            kwargs.get("position_ids"),
            kwargs.get("attention_mask"),
            head.targets,
            head.row_lengths,
        )
        return head_outputs(hidden, lm_head, head, vocab)

    model.forward = forward
    model._pt_head = token_head
    return token_head


def other_model_hidden(
    model, batch_inputs: dict, targets: torch.Tensor, row_lengths: list[int] | None = None
) -> torch.Tensor:
    """A frozen model's hidden states at the trained positions ([N, H]), no gradient."""
    head = install_token_head(model)
    with torch.no_grad():
        return decoder_trained_hidden(
            head.decoder,
            batch_inputs["input_ids"],
            batch_inputs.get("position_ids"),
            batch_inputs.get("attention_mask"),
            targets,
            row_lengths,
        )
