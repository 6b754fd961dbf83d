"""A lean decoder for Llama-family models: the HF engine's generation without the module stack.

Decoding a small batch one token at a time costs mostly per-operation overhead: each step
of a Hugging Face model goes through every module's call machinery, builds its cache
update and its attention mask, and on a CPU or with a small model that is most of the
step. This decoder reads the same weights and runs the same formulas (RMSNorm, rotary
embeddings from the model's own rotary module, grouped-query attention through
``scaled_dot_product_attention``, SwiGLU) as a flat sequence of tensor operations over a
key/value cache allocated once per batch, with every row writing the same slot each step
(the prompts are left-padded, so that new tokens stay aligned). Its logits equal the
model's up to floating-point rounding; the tests compare them step by step.

It takes only what it can reproduce: the ``llama``, ``mistral``, ``qwen2`` and ``qwen3``
architectures with global attention in every layer, SiLU MLPs, and plain
``nn.Linear``/``nn.Embedding`` modules whose weights are all present. A model wrapped by
LoRA adapters, quantised, or partitioned by ZeRO-3 (whose weights are gathered only when
their own module is called) is left to the Hugging Face forward (:func:`lean_decoder`
returns None). It reads transformers' module attributes (``variance_epsilon``,
``head_dim``, ``scaling``, ``rotary_emb``, ...): where a transformers release renames one,
:func:`lean_decoder` says so in one log line and returns None, and the engine decodes
with the model's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pt_core.log import get_logger

log = get_logger(__name__)

ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")
_SILU = frozenset({"SiLU", "SiLUActivation"})


def lean_decoder(model) -> LeanDecoder | None:
    """A :class:`LeanDecoder` over ``model``, or None when the model is not one it
    reproduces exactly."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "model_type", None) not in ARCHITECTURES:
        return None
    if getattr(config, "sliding_window", None) or any(
        t != "full_attention" for t in getattr(config, "layer_types", None) or []
    ):
        return None
    inner = getattr(model, "model", None)
    head = getattr(model, "lm_head", None)
    if inner is None or type(head) is not nn.Linear or head.bias is not None:
        return None
    if type(getattr(inner, "embed_tokens", None)) is not nn.Embedding:
        return None
    if not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return None
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None:
            return None
        if any(type(getattr(attn, n, None)) is not nn.Linear for n in _LINEARS):
            return None
        if any(type(getattr(mlp, n, None)) is not nn.Linear for n in _MLP):
            return None
        if type(getattr(mlp, "act_fn", None)).__name__ not in _SILU:
            return None
        if getattr(attn, "sliding_window", None) or getattr(attn, "softcap", None):
            return None
    for p in model.parameters():
        # ZeRO-3 leaves an empty placeholder and gathers the weight in the module's hooks
        if hasattr(p, "ds_id") or p.numel() == 0:
            return None
    try:
        decoder = LeanDecoder(model)
        decoder._weights()  # every attribute a decoding step reads
    except (AttributeError, TypeError, KeyError) as exc:
        log.info(
            "lean decoder: %s's modules are not laid out as it reads them (%s); decoding "
            "with the model's forward",
            config.model_type,
            exc,
        )
        return None
    return decoder


def _rms_norm(x, weight, eps):
    """The Llama RMSNorm: normalised in float32, cast back, then scaled."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # the same operations, fused
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class LeanDecoder:
    """Prefill, then one token per step, over a cache of ``[layers, 2, rows, kv heads,
    slots, head_dim]``; finished rows leave it through :meth:`select`."""

    def __init__(self, model):
        self.model = model
        self.inner = model.model
        config = model.config
        self.head_dim = int(self.inner.layers[0].self_attn.head_dim)
        self.kv_heads = int(config.num_key_value_heads)
        self.gqa = int(config.num_attention_heads) != self.kv_heads
        # both made by start(), for each batch
        self.cache: torch.Tensor  # keys and values of every layer
        self.mask: torch.Tensor  # [rows, 1, 1, slots] additive
        self.slot = 0

    def _weights(self):
        """Each layer's tensors, looked up once per batch rather than through the modules
        at every step (the same tensors: an optimizer's in-place updates show)."""

        def linear(m):
            return m.weight, m.bias

        def norm(m):
            return m.weight, float(m.variance_epsilon)

        layers = []
        for layer in self.inner.layers:
            a, m = layer.self_attn, layer.mlp
            layers.append(
                (
                    norm(layer.input_layernorm),
                    linear(a.q_proj),
                    linear(a.k_proj),
                    linear(a.v_proj),
                    norm(a.q_norm) if hasattr(a, "q_norm") else None,
                    norm(a.k_norm) if hasattr(a, "k_norm") else None,
                    linear(a.o_proj),
                    float(a.scaling),
                    norm(layer.post_attention_layernorm),
                    linear(m.gate_proj),
                    linear(m.up_proj),
                    linear(m.down_proj),
                )
            )
        return layers

    def start(self, prompt_mask, slots: int) -> None:
        """A cache for ``prompt_mask``'s rows (``[A, width]``, 1 on prompt tokens, the
        prompts left-padded) with room for ``slots`` keys in all."""
        rows, width = prompt_mask.shape
        weight = self.inner.embed_tokens.weight
        self.layers = self._weights()
        self.cache = torch.empty(
            (len(self.layers), 2, rows, self.kv_heads, slots, self.head_dim),
            dtype=weight.dtype,
            device=weight.device,
        )
        # the additive mask sdpa would make of a bool one: 0 on keys seen, -inf on padding
        self.mask = torch.zeros((rows, 1, 1, slots), dtype=weight.dtype, device=weight.device)
        self.mask[:, 0, 0, :width].masked_fill_(prompt_mask == 0, float("-inf"))
        self.slot = 0

    def select(self, index) -> None:
        self.cache = self.cache.index_select(2, index)
        self.mask = self.mask.index_select(0, index)

    def forward(self, input_ids, position_ids):
        """Logits (float32, ``[A, V]``) after the last of ``input_ids`` (``[A, T]``), which
        take the next ``T`` slots of the cache."""
        rows, length = input_ids.shape
        start, end = self.slot, self.slot + length
        mask = self.mask[..., :end]
        if length > 1:
            ones = torch.ones((length, end), dtype=torch.bool, device=input_ids.device)
            causal = ones.tril(start)
            # a padding query sees itself only (it sees no key otherwise: NaN in sdpa)
            diagonal = causal & ~ones.tril(start - 1)
            mask = mask.masked_fill(~causal, float("-inf")).masked_fill(diagonal, 0.0)
        h = F.embedding(input_ids, self.inner.embed_tokens.weight)
        cos, sin = self.inner.rotary_emb(h, position_ids)
        # rotate_half(x) * sin == roll(x, half) * sin with its first half negated
        half = cos.shape[-1] // 2
        cos, sin = cos[:, :, None], torch.cat((-sin[..., :half], sin[..., half:]), -1)[:, :, None]
        shape = (rows, length, -1, self.head_dim)
        for i, (ln1, q_p, k_p, v_p, q_n, k_n, o_p, scale, ln2, g_p, u_p, d_p) in enumerate(
            self.layers
        ):
            x = _rms_norm(h, *ln1)
            q = F.linear(x, *q_p).view(shape)
            k = F.linear(x, *k_p).view(shape)
            v = F.linear(x, *v_p).view(shape)
            if q_n is not None:
                q, k = _rms_norm(q, *q_n), _rms_norm(k, *k_n)
            q = q * cos + q.roll(half, -1) * sin
            k = k * cos + k.roll(half, -1) * sin
            cache_k, cache_v = self.cache[i, 0], self.cache[i, 1]
            cache_k[:, :, start:end] = k.transpose(1, 2)
            cache_v[:, :, start:end] = v.transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                cache_k[:, :, :end],
                cache_v[:, :, :end],
                attn_mask=mask,
                scale=scale,
                enable_gqa=self.gqa,
            )
            h = h + F.linear(out.transpose(1, 2).reshape(rows, length, -1), *o_p)
            x = _rms_norm(h, *ln2)
            h = h + F.linear(F.silu(F.linear(x, *g_p)) * F.linear(x, *u_p), *d_p)
        self.slot = end
        last = _rms_norm(h[:, -1], self.inner.norm.weight, float(self.inner.norm.variance_epsilon))
        return F.linear(last, self.model.lm_head.weight).float()
