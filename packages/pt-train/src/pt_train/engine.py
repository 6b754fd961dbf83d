"""The training engine: DeepSpeed, or plain PyTorch where DeepSpeed has nothing to do.

With one process, ZeRO stage 0, fp32, no offload and no raw DeepSpeed keys,
DeepSpeed's engine only wraps the model: nothing is partitioned, nothing is
communicated. There the trainer uses :class:`PlainEngine`, which does the same
arithmetic (the same AdamW on the same gradients, stepped at the same
accumulation boundaries) without DeepSpeed's import, its engine or, on CPU, the
communication op it compiles on first use. ``deepspeed.engine: deepspeed`` keeps
DeepSpeed in every case.

Both write a stage-0 checkpoint a run can resume from with either engine, so a
run may change its number of processes between restarts. Frozen parameters (the base
model of a LoRA run, :mod:`pt_train.lora`) are not saved: a resumed run has them already,
loaded again from the model's source.
"""

from __future__ import annotations

from pathlib import Path

import torch

from pt_core.errors import InputError

DS_TAG = "ds"
PLAIN_TAG = "plain"
PLAIN_FILE = "state.pt"
# Where a DeepSpeed stage-0 checkpoint keeps the model and the optimizer (one file).
DS_STAGE0_FILE = "mp_rank_00_model_states.pt"


def use_plain_engine(cfg, world_size: int, bf16: bool) -> bool:
    """True where DeepSpeed would only wrap the model (see the module docstring)."""
    ds = cfg.deepspeed
    return (
        ds.engine == "auto"
        and world_size == 1
        and ds.zero_stage == 0
        and not (ds.offload_optimizer or ds.offload_param or ds.raw)
        and not bf16
    )


class PlainEngine:
    """The part of DeepSpeed's engine interface the trainer uses, for one process."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_accum: int):
        self.module = module
        self.optimizer = optimizer
        self.grad_accum = grad_accum
        self.micro_steps = 0

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def train(self) -> None:
        self.module.train()

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = False) -> None:
        # The trainer scales the loss itself (scale_wrt_gas=False), as with DeepSpeed.
        loss.backward()

    def step(self) -> None:
        """Count a micro-batch; at the accumulation boundary, step and clear the gradients."""
        self.micro_steps += 1
        if self.micro_steps % self.grad_accum == 0:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def get_global_grad_norm(self) -> None:
        return None  # stage 0: the trainer clips and reports the norm itself


def frozen_names(module: torch.nn.Module) -> set[str]:
    return {name for name, p in module.named_parameters() if not p.requires_grad}


def saved_module_state(module: torch.nn.Module) -> dict:
    """The module's state dict without its frozen parameters, nor what a 4-bit frozen
    weight stores beside it (``<weight>.absmax``, ``<weight>.quant_map``, ...: its
    quantization state, rebuilt when the base is loaded again)."""
    frozen = frozen_names(module)
    return {
        k: v
        for k, v in module.state_dict().items()
        if k not in frozen and not any(k[:i] in frozen for i, c in enumerate(k) if c == ".")
    }


def save_engine(engine, directory: Path, write=None) -> None:
    """Write the model (its trained parameters) and optimizer state into ``directory`` (a
    checkpoint being built).

    ``write(obj, path)`` stores the plain engine's file (default :func:`torch.save`;
    :mod:`pt_train.checkpoint` passes one that writes in the background)."""
    if isinstance(engine, PlainEngine):
        (directory / PLAIN_TAG).mkdir()
        state = {
            "module": saved_module_state(engine.module),
            "optimizer": engine.optimizer.state_dict(),
        }
        (write or torch.save)(state, directory / PLAIN_TAG / PLAIN_FILE)
    else:
        frozen = bool(frozen_names(engine.module))
        engine.save_checkpoint(
            str(directory), tag=DS_TAG, save_latest=False, exclude_frozen_parameters=frozen
        )


def load_engine(engine, directory: Path, zero_stage: int) -> None:
    """Restore what :func:`save_engine` wrote, into either engine where the layout allows.

    At stage 0 both engines hold the module and the torch optimizer as they are, so a
    plain checkpoint and DeepSpeed's stage-0 file restore into either one the same way.
    """
    plain = directory / PLAIN_TAG / PLAIN_FILE
    ds_dir = directory / DS_TAG
    if not plain.exists() and not ds_dir.exists():
        raise InputError(f"{directory} holds no model state (neither {PLAIN_TAG}/ nor {DS_TAG}/)")
    frozen = frozen_names(engine.module)
    if not plain.exists() and not isinstance(engine, PlainEngine):
        loaded, _ = engine.load_checkpoint(
            str(directory),
            tag=DS_TAG,
            load_optimizer_states=True,
            load_lr_scheduler_states=False,
            load_module_strict=not frozen,
        )
        if loaded is None:
            raise InputError(f"DeepSpeed could not load the checkpoint in {directory}")
        return
    if plain.exists():
        if zero_stage != 0:
            raise InputError(
                f"{directory} was written by a single-process stage-0 run; it resumes under "
                f"ZeRO stage 0 only (deepspeed.zero_stage is {zero_stage})",
                hint="resume with deepspeed.zero_stage=0",
            )
        state = torch.load(plain, map_location="cpu", weights_only=False)
    else:
        stage0 = ds_dir / DS_STAGE0_FILE
        state = (
            torch.load(stage0, map_location="cpu", weights_only=False) if stage0.exists() else {}
        )
        if not state.get("optimizer"):
            raise InputError(
                f"{ds_dir} is a partitioned (ZeRO stage 1-3) DeepSpeed checkpoint; a single "
                "process at stage 0 cannot resume it",
                hint="resume with the run's deepspeed.zero_stage, or with deepspeed.engine=deepspeed",
            )
    missing, unexpected = engine.module.load_state_dict(state["module"], strict=False)
    if unexpected or set(missing) - frozen:
        raise InputError(
            f"{directory} holds the weights of another model: "
            f"{len(set(missing) - frozen)} of this model's trained parameters missing "
            f"(e.g. {sorted(set(missing) - frozen)[:1]}), {len(unexpected)} unknown "
            f"(e.g. {unexpected[:1]})",
            hint="resume with the model (and model.lora) the run was started with",
        )
    engine.optimizer.load_state_dict(state["optimizer"])
