"""Full checkpoints (for resume) and inference checkpoints (for HF and vLLM).

Full checkpoint layout::

    checkpoints/step-N/ds/...            DeepSpeed: model, optimizer (ZeRO partitions)
    checkpoints/step-N/plain/state.pt    or, without DeepSpeed (pt_train.engine): both
    checkpoints/step-N/rng-rank{r}.pt    python/numpy/torch RNG states of each rank
    checkpoints/step-N/trainer_state.json   step, counters, config hash
    checkpoints/latest                   "step-N", written last

A LoRA run's full checkpoint holds the adapters, not the frozen base (pt_train.engine);
its inference checkpoint holds the merged weights, and the adapter in ``adapter/``
(pt_train.lora).

Everything is written under ``checkpoints/.tmp-step-N`` and renamed into place
once every rank has finished; ``latest`` is replaced atomically only after
that. A crash or ``kill -9`` mid-save leaves a ``.tmp-*`` directory that the
next run deletes, and ``latest`` still names the previous complete checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from pt_core.files import atomic_path, atomic_write_json, atomic_write_text
from pt_core.log import get_logger
from pt_train.distributed import DistEnv, barrier
from pt_train.engine import load_engine, save_engine
from pt_train.lora import hf_model, is_lora, merged_state_dict, save_adapter

log = get_logger(__name__)

LATEST = "latest"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None for a fresh run."""
    pointer = checkpoint_dir(run_dir) / LATEST
    if not pointer.exists():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text().strip()
    assert (path / "trainer_state.json").exists(), f"latest points at incomplete {path}"
    return path


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete what an interrupted save left behind (rank 0 only)."""
    root = checkpoint_dir(run_dir)
    if root.exists():
        for tmp in root.glob(".tmp-*"):
            log.warning("removing %s, left by an interrupted checkpoint save", tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_full(
    engine, run_dir: Path, step: int, trainer_state: dict, env: DistEnv, keep: int
) -> Path:
    """Save the whole training state at ``step`` (all ranks call this)."""
    root = checkpoint_dir(run_dir)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    save_engine(engine, tmp)
    torch.save(rng_state(), tmp / f"rng-rank{env.rank}.pt")
    if env.is_main:
        (tmp / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step}))
    barrier()
    if env.is_main:
        _fsync_tree(tmp)
        if final.exists():  # re-saving a step (resumed run that stopped at the same step)
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_text(root / LATEST, final.name + "\n")
        _prune(root, keep, protect=final)
    barrier()
    return final


def _fsync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())


def _prune(root: Path, keep: int, protect: Path) -> None:
    steps = sorted(
        (p for p in root.glob("step-*") if p.is_dir() and p.name.split("-")[1].isdigit()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    for old in steps[:-keep]:
        if old != protect:
            shutil.rmtree(old, ignore_errors=True)


def load_full(engine, path: Path, env: DistEnv, zero_stage: int) -> dict:
    """Restore model, optimizer and this rank's RNG; return the trainer state."""
    load_engine(engine, path, zero_stage)
    rng_file = path / f"rng-rank{env.rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:  # resumed on a different number of ranks
        log.warning("%s missing; RNG states start fresh on rank %d", rng_file.name, env.rank)
    return json.loads((path / "trainer_state.json").read_text())


def gathered_state_dict(engine, zero_stage: int, *, merged: bool = True) -> dict | None:
    """The full model state dict on rank 0 (None elsewhere); ZeRO-3 partitions are gathered.
    A LoRA model's is its merged weights under the base model's names (``merged``), or
    peft's own state dict, base and adapters apart."""
    if zero_stage == 3:
        state = engine._zero3_consolidated_16bit_state_dict()
        if torch.distributed.get_rank() != 0:
            return None
    elif torch.distributed.get_rank() != 0:
        return None
    else:
        state = {k: v.detach().cpu() for k, v in engine.module.state_dict().items()}
    if merged and is_lora(engine.module):
        state = merged_state_dict(engine.module, state)
    return state


def save_inference(
    engine, tokenizer, run_dir: Path, step: int, env: DistEnv, zero_stage: int
) -> Path:
    """Write ``inference/step-N`` from the engine's model (all ranks call this)."""
    final = Path(run_dir) / "inference" / f"step-{step}"
    state = gathered_state_dict(engine, zero_stage, merged=False)
    if env.is_main:
        write_inference_checkpoint(engine.module, tokenizer, final, step=step, state_dict=state)
    barrier()
    return final


def write_inference_checkpoint(
    model, tokenizer, path: Path, *, step: int, state_dict: dict | None = None
) -> Path:
    """The one writer of inference checkpoints: safetensors weights, config (KV cache on),
    tokenizer, generation config and ``pt_train.json``, written to a temporary directory
    and renamed into place. A LoRA model (a peft model; ``state_dict``, if given, its own)
    is written merged, with its adapter in ``adapter/``."""
    with atomic_path(path) as tmp:
        tmp.mkdir()
        if is_lora(model):
            peft_state = state_dict if state_dict is not None else model.state_dict()
            save_adapter(model, tmp / "adapter", peft_state)
            state_dict = merged_state_dict(model, peft_state)
        save_model_weights(model, tmp, state_dict)
        tokenizer.save_pretrained(str(tmp))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(tmp))
        atomic_write_json(tmp / "pt_train.json", {"step": step})
    return Path(path)


def save_model_weights(model, directory: Path, state_dict: dict | None = None) -> None:
    """``model``'s config (KV cache on) and weights (``state_dict``, or its own) as
    safetensors in ``directory``, loadable by HF and vLLM; a peft model is saved as the
    Hugging Face model under it (give its merged state dict)."""
    model = hf_model(model)
    # Training turns the KV cache off; generation wants it on.
    was = model.config.use_cache
    model.config.use_cache = True
    try:
        model.save_pretrained(str(directory), state_dict=state_dict, safe_serialization=True)
    finally:
        model.config.use_cache = was
