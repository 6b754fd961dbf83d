"""The policy being trained, as the parts around the trainer step use it: the online loop
samples from it and pushes its weights to generators, the evaluator answers prompts with it.

    policy.module()         the Hugging Face model (under LoRA the adapted model, as peft runs it)
    policy.state_dict()     its merged weights, gathered on rank 0 under ZeRO-3 (a collective)
    policy.weights()        the same as (name, tensor) pairs made as they are asked for
    policy.token_logps(b)   the current weights' log-probs of a batch's trained tokens
    policy.sampler(tok)     an engine that samples from it as it is (no copy of its weights)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from pt_train import checkpoint as ckpt
from pt_train.batch import Batch
from pt_train.logprobs import HeadRequest
from pt_train.lora import hf_model


class Policy:
    """A handle on the trainer's engine (given with :meth:`attach` once it is built).
    ``on_device``: weights handed out stay on the device (for an engine in this process
    that shares it); otherwise they are copied to the CPU. ``temperature``: the
    distribution :meth:`token_logps` computes, the one the samples were drawn from."""

    def __init__(self, *, zero_stage: int, device: torch.device, dtype: torch.dtype,
                 chunk_mb: float, temperature: float, on_device: bool = False):  # fmt: skip
        self.zero_stage = zero_stage
        self.device = device
        self.dtype = dtype
        self.chunk_mb = chunk_mb
        self.temperature = temperature
        self.on_device = on_device
        self.engine: Any = None

    def attach(self, engine) -> None:
        self.engine = engine

    def module(self):
        return hf_model(self.engine.module)

    def state_dict(self) -> dict | None:
        """The merged state dict on rank 0 (None elsewhere); under ZeRO-3 every rank must
        call it (it gathers the partitions)."""
        return ckpt.gathered_state_dict(self.engine, self.zero_stage, on_device=self.on_device)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The merged weights as ``(name, tensor)`` pairs, gathered a group of modules at a
        time under ZeRO-3 (one rank)."""
        return ckpt.gathered_weights(self.engine, self.zero_stage, on_device=self.on_device)

    def sampler(self, tokenizer, *, seed: int = 0, decoder: str = "auto"):
        """The HF engine on the live module: what it samples is the current weights', with
        nothing copied; it puts the module in eval mode while it generates and back after
        (the online loop's local generator, the evaluation's answers)."""
        from pt_rollout.engines.hf import HFEngine

        model = self.module()
        device = next(model.parameters()).device
        return HFEngine(model, tokenizer=tokenizer, device=str(device), seed=seed, decoder=decoder)

    def row_lengths(self, batch: Batch) -> list[int] | None:
        """The rows' lengths for the token head to run rows of similar length together;
        None under ZeRO-3, where every decoder call is a collective that all ranks must
        make alike."""
        return batch.row_lengths if self.zero_stage < 3 else None

    def token_logps(self, batch: Batch) -> torch.Tensor:
        """The current weights' log-probs of a batch's trained tokens (no gradient), in
        float64 on the CPU."""
        batch = batch.to(self.device)
        with torch.no_grad():
            out = self.engine(
                **batch.model_inputs(self.device, self.dtype),
                head=HeadRequest(
                    targets=batch.targets,
                    chunk_mb=self.chunk_mb,
                    temperature=self.temperature,
                    row_lengths=self.row_lengths(batch),
                ),
            )
        return out.token_logps.detach().double().cpu()
