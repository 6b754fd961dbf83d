"""Model construction: from a Hugging Face name/path, or from random weights (``model.init``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from pt_core.log import get_logger

if TYPE_CHECKING:
    import torch

log = get_logger(__name__)


def build_llama(
    tokenizer,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = False,
    vocab_size: int | None = None,
    seed: int = 0,
):
    """A randomly initialised Llama-style causal LM sized for ``tokenizer``.

    ``hidden_size / num_heads`` is the head dimension; keep it at 64, which
    vLLM's CPU attention supports.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    if vocab_size is not None and vocab_size < len(tokenizer):
        raise ValueError(
            f"vocab_size {vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens"
        )
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_word_embeddings,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def load_tokenizer(path: str, *, key: str = "model.name_or_path"):
    """The tokenizer at ``path``, which the config key ``key`` gave: runs read it from the
    model path unless model.tokenizer (or model.init.tokenizer) names another, so a model
    path that is not there is reported as the model path."""
    from transformers import AutoTokenizer

    from pt_core.errors import ConfigError
    from pt_core.hub import require_local_or_hub

    require_local_or_hub(
        path,
        key,
        error=ConfigError,
        hint="give a local model directory, or a hub name with a network or in the cache "
        "(model.tokenizer, when set, is read instead of model.name_or_path)",
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load the tokenizer from {path!r} ({exc})",
            hint="set model.tokenizer (or model.init.tokenizer) to a local directory or hub name",
        ) from None
    if tokenizer.pad_token_id is None:
        # Padding carries no loss and is masked out, so any id will do.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_same_tokenizer(tokenizer, other_path: str, what: str, *, required: bool = True) -> None:
    """A model that scores the policy's token ids (a teacher, a reference) must read them as
    the policy does: the same vocabulary and the same special tokens, else a clear error.
    A model that is not ``required`` (a reference whose log-probs may be stored in the run)
    and is not here is left unchecked, with a warning."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from pt_core.errors import ConfigError
    from pt_core.hub import require_local_or_hub

    if not required and not Path(other_path).is_dir():
        log.warning(
            "%s %s is not here to compare its tokenizer with the policy's", what, other_path
        )
        return
    require_local_or_hub(other_path, f"objective.{what}.path", error=ConfigError)
    try:
        other = AutoTokenizer.from_pretrained(other_path)
    except (OSError, ValueError):
        log.warning("%s %s has no tokenizer to compare with the policy's", what, other_path)
        return
    mine, theirs = tokenizer.get_vocab(), other.get_vocab()
    if mine != theirs:
        differing = sorted(set(mine.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        raise ConfigError(
            f"the {what} {other_path} has another tokenizer than the policy "
            f"({len(theirs)} tokens against {len(mine)}; e.g. {differing}): it would score "
            "token ids that mean other text",
            hint=f"use a {what} with the policy's tokenizer (distilling across tokenizers is "
            "not supported)",
        )
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(tokenizer, name, None), getattr(other, name, None)
        if a is not None and b is not None and a != b:
            raise ConfigError(
                f"the {what} {other_path} has {name}={b}, the policy {a}",
                hint=f"use a {what} with the policy's tokenizer and special tokens",
            )


def load_model(
    model_cfg,
    tokenizer,
    *,
    dtype,
    seed: int,
    fused_ops: bool = False,
    lora=None,
    device=None,
    compute_dtype=None,
) -> torch.nn.Module:
    """The model of ``model_cfg`` (a ``pt_train.config.ModelConfig``): pretrained weights
    from ``name_or_path``, or random weights from ``init`` seeded with ``seed``; with
    ``fused_ops``, the memory-lean MLP and RMSNorm of :mod:`pt_train.fused` for training;
    with ``lora`` (a ``LoraSection``), wrapped in peft's LoRA adapters (:mod:`pt_train.lora`),
    the base frozen. With ``lora.load_in_4bit`` (QLoRA) the base's linear layers are 4-bit
    NF4 (bitsandbytes), quantized on ``device`` (default: the CPU) and computing in
    ``compute_dtype`` (default: ``dtype``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pt_core.errors import ConfigError

    four_bit = lora is not None and lora.load_in_4bit
    if model_cfg.init is not None:
        model = _initial_llama(model_cfg.init, tokenizer, seed=seed).to(dtype)
    elif four_bit:
        from peft import prepare_model_for_kbit_training
        from transformers import BitsAndBytesConfig

        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute_dtype or dtype,
        )
        device = torch.device(device or "cpu")
        with _loading(model_cfg):
            model = AutoModelForCausalLM.from_pretrained(
                model_cfg.name_or_path,
                dtype=dtype,
                quantization_config=quantization,
                device_map={"": str(device) if device.index is None else device.index},
            )
        # the norms and embeddings in fp32, and the input gradients checkpointing needs
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=model_cfg.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    else:
        with _loading(model_cfg):
            model = AutoModelForCausalLM.from_pretrained(model_cfg.name_or_path, dtype=dtype)
    try:
        model.set_attn_implementation(model_cfg.attn_implementation)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"model.attn_implementation={model_cfg.attn_implementation!r} is not usable here ({exc})",
            hint="use sdpa, or install flash-attn on a GPU machine for flash_attention_2",
        ) from None
    model.config.use_cache = False
    if model_cfg.gradient_checkpointing:
        # transformers >= 5.2x names it activation checkpointing; older releases gradient.
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    if lora is not None:
        from pt_train.lora import apply_lora, parameter_numel

        # Before the fused ops: an MLP whose projections carry adapters must keep its own
        # forward (the fused one reads the base weights), and fused.py leaves it alone.
        model = apply_lora(model, lora, seed=seed)
        if four_bit:
            trained = sum(parameter_numel(p) for p in model.parameters() if p.requires_grad)
            log.info(
                "QLoRA: the base is loaded as 4-bit NF4 (bitsandbytes); %d adapter parameters "
                "train",
                trained,
            )
    if fused_ops:
        from pt_train.fused import apply_fused_ops

        counts = apply_fused_ops(model)
        log.info("fused ops: %d MLP and %d RMSNorm modules", counts["mlp"], counts["rms_norm"])
    return model


def model_skeleton(model_cfg, tokenizer):
    """The model of ``model_cfg`` with its modules on the meta device: its layer names and
    shapes, from the config alone (no weight read or drawn, the RNG streams untouched), to
    check a config against before the run loads the model or writes anything."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        if model_cfg.init is not None:
            return _initial_llama(model_cfg.init, tokenizer, seed=0)
        with _loading(model_cfg):
            config = AutoConfig.from_pretrained(model_cfg.name_or_path)
        return AutoModelForCausalLM.from_config(config)


def check_lora_targets(model_cfg, tokenizer) -> None:
    """Refuse ``model.lora.target_modules`` names that match no layer
    (:func:`check_target_names`) on the model's skeleton, before the run loads the model
    or writes anything to its directory."""
    lora_cfg = model_cfg.lora
    if lora_cfg is None or lora_cfg.target_modules == ["all-linear"]:
        return
    from pt_train.lora import check_target_names

    check_target_names(model_skeleton(model_cfg, tokenizer), lora_cfg.target_modules)


def _initial_llama(init, tokenizer, *, seed: int):
    """The random model of ``model.init``; sizes that do not fit are a config error."""
    from pt_core.errors import ConfigError

    try:
        return build_llama(
            tokenizer,
            hidden_size=init.hidden_size,
            num_layers=init.num_layers,
            num_heads=init.num_heads,
            num_kv_heads=init.num_kv_heads,
            intermediate_size=init.intermediate_size,
            max_position_embeddings=init.max_position_embeddings,
            tie_word_embeddings=init.tie_word_embeddings,
            vocab_size=init.vocab_size,
            seed=seed,
        )
    except ValueError as exc:
        raise ConfigError(f"model.init: {exc}", hint="change the model.init sizes") from None


@contextlib.contextmanager
def _loading(model_cfg):
    """Reading ``model.name_or_path`` (the model or its config): a path that is not there,
    or that holds no model transformers can read, is a config error naming it."""
    from pt_core.errors import ConfigError
    from pt_core.hub import require_local_or_hub

    require_local_or_hub(model_cfg.name_or_path, "model.name_or_path", error=ConfigError)
    try:
        yield
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load model.name_or_path={model_cfg.name_or_path!r} ({exc})",
            hint="give a local model directory or a hub name (the hub needs a network)",
        ) from None


def save_initial_model(cfg, out_dir):
    """Write the model a run of ``cfg`` starts from (same seed, same weights as step 0 of
    ``pt-train run``) as an inference checkpoint, to evaluate the untrained model beside
    the trained ones."""
    import torch

    from pt_train.checkpoint import write_inference_checkpoint

    tokenizer = load_tokenizer(cfg.model.tokenizer_path)
    model = load_model(cfg.model, tokenizer, dtype=torch.float32, seed=cfg.training.seed)
    return write_inference_checkpoint(model, tokenizer, out_dir, step=0)
