"""Frozen models beside the policy: DPO's reference, ASFT's anchor.

:func:`load_frozen` loads one (the policy's starting weights, or another path) in the
policy's dtype, with the same layers, and under ZeRO-3 partitioned over the ranks like
the policy (a DeepSpeed engine without an optimizer), so a 7B reference does not sit
whole on every GPU. Nothing of it is trained or saved.

:func:`precompute_pair_logps` computes a reference's log-probs of every pair once, before
training, into ``<run_dir>/reference/``, in chunks that a restarted run does not compute
again; training then reads them and does not load the reference at all.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch

from pt_core.files import atomic_path, atomic_write_json
from pt_core.log import get_logger, progress
from pt_train.distributed import DistEnv, barrier
from pt_train.logprobs import HeadRequest, install_token_head

log = get_logger(__name__)

CHUNK_PAIRS = 1024


def load_frozen(
    model_cfg, reference_cfg, tokenizer, *, dtype, seed, device, zero_stage, fused
) -> torch.nn.Module:
    """The frozen model of ``reference_cfg`` (``path`` or the policy's starting weights)."""
    from pt_train.model import load_model

    source = model_cfg
    if reference_cfg.path is not None:
        source = model_cfg.model_copy(update={"name_or_path": reference_cfg.path, "init": None})
    source = source.model_copy(update={"gradient_checkpointing": False})
    if reference_cfg.dtype is not None:
        dtype = getattr(torch, reference_cfg.dtype)
    model: torch.nn.Module = load_model(source, tokenizer, dtype=dtype, seed=seed, fused_ops=fused)
    model.requires_grad_(False)
    model.eval()
    if zero_stage == 3:
        import deepspeed

        engine, *_ = deepspeed.initialize(
            model=model,
            config={
                "train_micro_batch_size_per_gpu": 1,
                "zero_optimization": {"stage": 3},
                "bf16": {"enabled": dtype == torch.bfloat16},
            },
        )
        # the model given (typed as Tensor | Module by Module.__getattr__)
        model = engine.module  # pyright: ignore[reportAssignmentType]
    else:
        model = model.to(device)
    install_token_head(model)
    return model


def pairs_fingerprint(pairs) -> str:
    """A hash of the pairs' tokens, to tell whether stored log-probs belong to them."""
    digest = hashlib.sha256()
    for p in pairs:
        for part in (p.prompt, p.chosen, p.chosen_labels, p.rejected, p.rejected_labels):
            digest.update(np.asarray(part, dtype=np.int64).tobytes())
            digest.update(b"|")
    return digest.hexdigest()[:16]


def precompute_pair_logps(
    model, pairs, make_batch, root: Path, env: DistEnv, *, micro_pairs: int, chunk_mb: int,
    device, dtype, source: str,
) -> np.ndarray:  # fmt: skip
    """[pairs, 2] reference log-probs (chosen, rejected) of every pair, computed here (the
    ranks share each chunk's micro-batches) and stored in ``root``
    (``<run_dir>/reference``), in chunks that a restarted run does not compute again."""
    root = Path(root)
    fingerprint = pairs_fingerprint(pairs)
    final = root / "logps.npy"
    meta = root / "meta.json"
    if final.exists():
        log.warning("%s holds reference log-probs of other data; computing them again", root)
    barrier()
    if env.is_main:
        root.mkdir(parents=True, exist_ok=True)
    barrier()
    chunks = [(s, min(len(pairs), s + CHUNK_PAIRS)) for s in range(0, len(pairs), CHUNK_PAIRS)]
    todo = [c for c in chunks if not _chunk_path(root, fingerprint, *c).exists()]
    log.info(
        "reference log-probs of %d pairs: %d of %d chunks to compute (in %s)",
        len(pairs),
        len(todo),
        len(chunks),
        root,
    )
    bar = progress() if env.is_main else None
    if bar is not None:
        bar.start()
        task = bar.add_task("reference log-probs", total=sum(e - s for s, e in todo))
    for start, end in todo:
        # Every rank takes every world_size-th micro-batch of the chunk, and all run the
        # same number of forward passes (a rank short of one repeats its last): a ZeRO-3
        # reference's forward is a collective of every rank.
        starts = list(range(start, end, micro_pairs))
        mine = starts[env.rank :: env.world_size]
        rounds = -(-len(starts) // env.world_size)
        part = np.full((end - start, 2), np.nan, dtype=np.float64)
        for i in range(rounds):
            mb_start = mine[min(i, len(mine) - 1)] if mine else starts[-1]
            indices = list(range(mb_start, min(end, mb_start + micro_pairs)))
            batch = make_batch(indices).to(device)
            sums = sequence_logps(model, batch, chunk_mb=chunk_mb, device=device, dtype=dtype)
            if i < len(mine):
                part[mb_start - start : mb_start - start + len(indices)] = (
                    sums.view(-1, 2).double().cpu().numpy()
                )
                if bar is not None:
                    bar.update(task, advance=len(indices) * env.world_size)
        rank_file = _chunk_path(root, fingerprint, start, end).with_suffix(f".rank{env.rank}.npy")
        with atomic_path(rank_file) as tmp:
            np.save(tmp, part)
        barrier()
        if env.is_main:
            ranks = [
                np.load(_chunk_path(root, fingerprint, start, end).with_suffix(f".rank{r}.npy"))
                for r in range(env.world_size)
            ]
            merged = np.where(np.isnan(ranks[0]), 0.0, ranks[0])
            for other in ranks[1:]:
                merged = np.where(np.isnan(other), merged, other)
            with atomic_path(_chunk_path(root, fingerprint, start, end)) as tmp:
                np.save(tmp, merged)  # the name ends in .npy, so np.save keeps it
            for r in range(env.world_size):
                _chunk_path(root, fingerprint, start, end).with_suffix(f".rank{r}.npy").unlink()
        barrier()
    if bar is not None:
        bar.stop()
    barrier()
    table = np.concatenate([np.load(_chunk_path(root, fingerprint, s, e)) for s, e in chunks])
    barrier()
    if env.is_main:
        with atomic_path(final) as tmp:
            np.save(tmp, table)
        atomic_write_json(meta, {"fingerprint": fingerprint, "source": source, "pairs": len(pairs)})
        for s, e in chunks:
            _chunk_path(root, fingerprint, s, e).unlink(missing_ok=True)
    barrier()
    return table


def stored_pair_logps(root: Path, pairs, source: str) -> np.ndarray | None:
    """The [pairs, 2] table a previous run stored in ``root`` for these pairs and this
    reference."""
    root = Path(root)
    final, meta = root / "logps.npy", root / "meta.json"
    if not (final.exists() and meta.exists()):
        return None
    stored = json.loads(meta.read_text())
    if stored.get("fingerprint") != pairs_fingerprint(pairs) or stored.get("source") != source:
        return None
    return np.load(final)


def _chunk_path(root: Path, fingerprint: str, start: int, end: int) -> Path:
    return root / f"part-{fingerprint}-{start:09d}-{end:09d}.npy"


def sequence_logps(model, batch, *, chunk_mb: int, device, dtype) -> torch.Tensor:
    """[S] the model's log-prob of each sequence of ``batch`` (sum over trained tokens)."""
    from pt_train.objectives.base import segment_sum

    with torch.no_grad():
        out = model(
            **batch.model_inputs(device, dtype),
            head=HeadRequest(targets=batch.targets, chunk_mb=chunk_mb),
        )
    return segment_sum(out.token_logps.double(), batch.token_sequence, batch.num_sequences)
