"""LoRA adapters on the policy, with peft (``model.lora``).

    model:
      name_or_path: Qwen/Qwen3-8B
      lora: {r: 16, alpha: 32, dropout: 0.05, target_modules: [q_proj, k_proj, v_proj, o_proj]}

Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models" (arXiv:2106.09685). A
targeted linear layer ``y = x W^T`` becomes::

    y = x W^T + (alpha / r) * dropout(x) A^T B^T        A: [r, in], B: [out, r]

with ``A`` random and ``B`` zero at the start, so the adapted model starts as the base model;
only ``A`` and ``B`` train. What a LoRA run does differently from a full one:

- the optimizer holds the adapters only (the base weights have ``requires_grad`` off);
- full checkpoints hold the adapters and their optimizer state, not the frozen base, which a
  resumed run loads again from ``model.name_or_path`` / ``model.init`` (pt_train.engine);
- inference checkpoints, and the weights pushed to a generator process, hold the merged
  weights ``W + (alpha / r) B A`` under the base model's own names: a plain Hugging Face
  checkpoint that vLLM loads (:func:`merged_state_dict`); the adapter alone is written
  beside them, in ``adapter/`` (peft's format);
- DPO's reference, ASFT's anchor and GRPO's KL reference, when ``reference.path`` is unset,
  are the policy with its adapters disabled (:class:`AdaptersOff`): the starting weights,
  without a second copy of the model in memory.
"""

from __future__ import annotations

import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from pt_core.errors import ConfigError, first_line
from pt_core.log import get_logger
from pt_train.logprobs import TokenHead, decoder_and_head, install_token_head

log = get_logger(__name__)

# How peft names the wrapped model's parameters: base_model.model.<the model's own name>.
PEFT_PREFIX = "base_model.model."
BASE_LAYER = ".base_layer."


def parameter_numel(param) -> int:
    """The number of values a parameter holds: a ZeRO-3 partition's whole (``ds_numel``), a
    4-bit bitsandbytes weight's unpacked shape (its tensor holds two values a byte)."""
    quant_state = getattr(param, "quant_state", None)
    if quant_state is not None:
        return quant_state.shape.numel()
    return getattr(param, "ds_numel", param.numel())


def apply_lora(model, lora_cfg, *, seed: int):
    """Wrap ``model`` (a Hugging Face causal LM) in a peft model with the adapters of
    ``lora_cfg`` (a ``pt_train.config.LoraSection``), its base weights frozen. The adapters'
    random start depends on ``seed`` only (the global RNG streams are left as they were)."""
    from peft import LoraConfig, get_peft_model
    from peft.utils.error import NoMatchingPeftModuleError

    targets = lora_cfg.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"  # peft's name for every linear layer but the output layer
    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=targets,
        use_dora=lora_cfg.use_dora,
        use_rslora=lora_cfg.use_rslora,
        task_type="CAUSAL_LM",
    )
    names = linear_names(model)
    if targets != "all-linear":
        check_target_names(model, targets)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        # peft asks the model about gradient checkpointing by a name transformers deprecates
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*checkpointing")
        # an adapter on a tied LM head is refused below, with its reason
        warnings.filterwarnings("ignore", category=UserWarning, message=".*tie_word_embeddings")
        try:
            peft_model = get_peft_model(model, config)
        except NoMatchingPeftModuleError:
            raise ConfigError(
                f"model.lora.target_modules={targets!r} matches no layer of {type(model).__name__}",
                hint=f"name some of its linear layers: {', '.join(names)}",
            ) from None
        except ValueError as exc:  # e.g. a module type that LoRA does not support
            raise ConfigError(
                f"model.lora.target_modules={targets!r}: {first_line(exc)}",
                hint=f"name linear layers of {type(model).__name__}: {', '.join(names)}",
            ) from None
    _check_targets(peft_model, targets, names)
    trained = sum(parameter_numel(p) for p in peft_model.parameters() if p.requires_grad)
    total = sum(parameter_numel(p) for p in peft_model.parameters())
    log.info(
        "lora%s: r=%d alpha=%g on %d layers; %d of %d parameters train (%.3f%%)",
        "".join(f" ({k})" for k in ("use_dora", "use_rslora") if getattr(lora_cfg, k)),
        lora_cfg.r,
        lora_cfg.alpha,
        len(lora_layers(peft_model)),
        trained,
        total,
        100.0 * trained / total,
    )
    return peft_model


def linear_names(model) -> list[str]:
    """The distinct last names of ``model``'s linear layers (what target_modules may name)."""
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear)
        }
    )


def check_target_names(model, targets: list[str]) -> None:
    """Refuse target names that match no module of ``model`` (as peft matches them: the
    module's name, or its last dotted parts), naming the closest linear layers, rather than
    put adapters on the other names only."""
    import difflib

    modules = [name for name, _ in model.named_modules() if name]
    unmatched = [t for t in targets if not any(m == t or m.endswith("." + t) for m in modules)]
    if not unmatched:
        return
    linear = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    closest = []
    for target in unmatched:
        depth = target.count(".") + 1
        candidates = sorted({".".join(name.split(".")[-depth:]) for name in linear})
        near = difflib.get_close_matches(target, candidates, n=2, cutoff=0.5)
        closest.append(f"{target} -> {' or '.join(near)}" if near else f"{target} -> ?")
    raise ConfigError(
        f"model.lora.target_modules={unmatched!r} matches no layer of {type(model).__name__}",
        hint=f"closest: {'; '.join(closest)} (its linear layers: {', '.join(linear_names(model))})",
    )


def _check_targets(peft_model, targets, names: list[str]) -> None:
    """Adapters only on linear layers, and not on an LM head tied to the input embeddings
    (the merged head would no longer equal the embeddings the checkpoint ties it to)."""
    embeddings = peft_model.get_input_embeddings().weight
    for name, layer in lora_layers(peft_model).items():
        base = layer.get_base_layer()
        if type(base) is not torch.nn.Linear and not is_four_bit_layer(base):
            raise ConfigError(
                f"model.lora.target_modules={targets!r} matches {name}, of type "
                f"{type(base).__name__}; pt-train puts adapters on linear layers only",
                hint=f"name linear layers: {', '.join(names)}",
            )
        if base.weight is embeddings:
            raise ConfigError(
                f"model.lora.target_modules={targets!r} matches {name}, whose weight is tied "
                "to the input embeddings",
                hint="leave the LM head out of target_modules",
            )


def is_four_bit_layer(module) -> bool:
    # bitsandbytes is imported only by a run that loads a 4-bit base.
    bnb = sys.modules.get("bitsandbytes")
    return bnb is not None and isinstance(module, bnb.nn.Linear4bit)


def is_four_bit(peft_model) -> bool:
    """True for a peft model whose base is 4-bit (QLoRA, ``model.lora.load_in_4bit``)."""
    return is_lora(peft_model) and bool(getattr(hf_model(peft_model), "is_loaded_in_4bit", False))


def merged_full_precision(peft_model, state: dict):
    """The merged model of a QLoRA run, as a plain Hugging Face model: its base loaded again
    from its source (``name_or_path``) without quantization, in fp32, the trained adapters of
    ``state`` (the peft model's state dict) put on it, then merged by peft. Merging into the
    4-bit layers instead would round the merged weights to 4 bits."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    trained = hf_model(peft_model)
    base = AutoModelForCausalLM.from_pretrained(trained.name_or_path, dtype=torch.float32)
    adapter = peft_model.active_adapter
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, message=".*checkpointing")
        plain = get_peft_model(base, peft_model.peft_config[adapter], adapter_name=adapter)
    adapters = {k: v for k, v in state.items() if ".lora_" in k}
    missing, unexpected = plain.load_state_dict(adapters, strict=False)
    missing_adapters = [k for k in missing if ".lora_" in k]
    assert not unexpected and not missing_adapters, (unexpected[:1], missing_adapters[:1])
    merged = plain.merge_and_unload()
    merged.generation_config = trained.generation_config
    return merged


def is_lora(module) -> bool:
    # A model is a peft one only if peft was imported: runs without LoRA never import it.
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(module, peft.PeftModel)


def lora_layers(peft_model) -> dict:
    """The adapted layers of a peft model, by their name in the base model."""
    from peft.tuners.lora import LoraLayer

    return {
        name.removeprefix(PEFT_PREFIX): m
        for name, m in peft_model.named_modules()
        if isinstance(m, LoraLayer)
    }


def hf_model(module):
    """The Hugging Face model under a peft wrapper, its adapters in place and active (what
    generates and what ``save_pretrained`` names the weights of); any other model as is."""
    return module.get_base_model() if is_lora(module) else module


def merged_state_dict(peft_model, state: dict) -> dict:
    """The merged weights of a peft model's full state dict (``peft_model.state_dict()``, or
    the one gathered from ZeRO-3 partitions), under the base model's names:
    ``W + scaling * B @ A`` for every adapted layer (computed in fp32, stored in ``W``'s
    dtype), with DoRA each row of it scaled to its magnitude ``m / ||W + scaling B A||``,
    every other tensor as it is, the adapters left out."""
    adapter = peft_model.active_adapter
    layers = lora_layers(peft_model)
    out = {}
    for key, value in state.items():
        name = key.removeprefix(PEFT_PREFIX)
        if ".lora_" in name:
            continue
        if BASE_LAYER in name:
            owner, param = name.split(BASE_LAYER)
            name = f"{owner}.{param}"
            if param == "weight":
                a = state[f"{PEFT_PREFIX}{owner}.lora_A.{adapter}.weight"].float()  # [r, in]
                b = state[f"{PEFT_PREFIX}{owner}.lora_B.{adapter}.weight"].float()  # [out, r]
                scaling = layers[owner].scaling[adapter]  # alpha / r; rsLoRA: alpha / sqrt(r)
                merged = value.float() + scaling * (b @ a)  # [out, in]
                magnitude = state.get(
                    f"{PEFT_PREFIX}{owner}.lora_magnitude_vector.{adapter}.weight"
                )
                if magnitude is not None:
                    # DoRA: each output row rescaled to its trained magnitude
                    merged = merged * (magnitude.float() / merged.norm(dim=1))[:, None]
                value = merged.to(value.dtype)
        out[name] = value
    return out


def save_adapter(peft_model, directory: Path, state: dict) -> None:
    """The adapter alone, in peft's format (``adapter_config.json``,
    ``adapter_model.safetensors``), from the model's full state dict."""
    peft_model.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
    (Path(directory) / "README.md").unlink(missing_ok=True)  # peft's model-card template


def shares_reference(lora_cfg, reference_cfg) -> bool:
    """True where the frozen reference is the policy with its adapters off: LoRA with
    ``reference: adapters_off``, a reference that is the policy's starting weights
    (``reference.path`` unset) in the policy's dtype (``reference.dtype`` unset)."""
    return (
        lora_cfg is not None
        and lora_cfg.reference == "adapters_off"
        and reference_cfg is not None
        and reference_cfg.path is None
        and reference_cfg.dtype is None
    )


class AdaptersOff:
    """The policy with its adapters disabled (peft's ``disable_adapter``) and in eval mode:
    the base model, which is the policy's starting weights, used as a frozen reference
    without a second copy of the model. Called like the frozen models of
    :mod:`pt_train.reference` (``reference(**inputs, head=request)``), and with the token
    head that :func:`pt_train.logprobs.other_model_hidden` reads for dense terms."""

    def __init__(self, peft_model):
        self.model = peft_model
        head = install_token_head(peft_model)
        decoder, lm_head = decoder_and_head(peft_model)
        head_is_adapted = any(name.endswith("lm_head") for name in lora_layers(peft_model))

        def decoder_off(*args, **kwargs):
            with self.off():
                return decoder(*args, **kwargs)

        def lm_head_off(hidden):
            # Called inside the policy's own forward (the dense term of a chunk): only the
            # head's adapter is switched off there, never the mode of the whole model.
            if not head_is_adapted:
                return lm_head(hidden)
            with peft_model.disable_adapter():
                return lm_head(hidden)

        self._pt_head = TokenHead(decoder_off, lm_head_off, head.vocab)

    @contextmanager
    def off(self):
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), self.model.disable_adapter():
                yield
        finally:
            self.model.train(was_training)

    def __call__(self, **kwargs):
        with self.off():
            return self.model(**kwargs)
