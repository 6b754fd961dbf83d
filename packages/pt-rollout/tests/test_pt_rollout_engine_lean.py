"""The lean decoder against the model it reads: the same logits at every step, the same
samples through the engine, and the models it must leave to their own forward."""

from __future__ import annotations

import pytest
import torch

from pt_rollout.engines import Request, SamplingParams
from pt_rollout.engines.hf import HFEngine
from pt_rollout.engines.lean import LeanDecoder, lean_decoder

torch.set_num_threads(2)

VOCAB = 300
BASE = dict(
    vocab_size=VOCAB,
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=256,
)


def build(kind: str, dtype=torch.float32, **overrides):
    import transformers as tf

    classes = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
    }
    config_class, model_class = classes[kind]
    torch.manual_seed(0)
    config = config_class(**{**BASE, **overrides})
    config._attn_implementation = "sdpa"
    model = model_class(config).eval().to(dtype)
    # random norms, so that a weight left out would show in the logits
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


# llama (plain), grouped-query attention, rope scaling, q/k/v biases (qwen2), per-head q/k
# norms (qwen3), mistral without a sliding window
MODELS = [
    ("llama", {}),
    ("llama", {"num_attention_heads": 4, "num_key_value_heads": 2}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}}),
    ("qwen2", {"num_attention_heads": 4, "num_key_value_heads": 1}),
    ("qwen3", {}),
    ("mistral", {"sliding_window": None}),
]
PROMPTS = [[5, 17, 3, 9, 9], [40, 41], [7] * 12, [101], [250, 3, 3, 88, 2, 61, 19]]


def padded(prompts):
    width = max(map(len, prompts))
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    return ids, mask


def model_cache_step(model, ids, mask, positions, cache):
    import inspect

    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else (
        "past_key_values"
    )  # fmt: skip
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **({name: cache} if cache is not None else {}),
    )
    return out.logits[:, -1].float(), out[name]


@pytest.mark.parametrize(("kind", "overrides"), MODELS)
def test_logits_equal_the_models_at_every_step_through_padding_and_dropped_rows(kind, overrides):
    model = build(kind, **overrides)
    if kind == "qwen2":
        # biases on q, k and v: give them values
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                    proj.bias.uniform_(-0.5, 0.5)
    decoder = lean_decoder(model)
    assert isinstance(decoder, LeanDecoder)
    ids, mask = padded(PROMPTS)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    steps = 6
    generator = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        decoder.start(mask, ids.shape[1] + steps)
        want, cache = model_cache_step(model, ids, mask, positions, None)
        got = decoder.forward(ids, positions)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        full = torch.cat([mask, torch.ones((len(PROMPTS), steps), dtype=torch.long)], 1)
        position = mask.sum(-1, keepdim=True)
        keys = ids.shape[1]
        for step in range(steps):
            if step == 3:  # two rows finish: both caches drop them
                keep = torch.tensor([0, 2, 4])
                decoder.select(keep)
                cache.batch_select_indices(keep)
                full, position = full[keep], position[keep]
            tokens = torch.randint(0, VOCAB, (len(position), 1), generator=generator)
            keys += 1
            want, cache = model_cache_step(model, tokens, full[:, :keys], position, cache)
            got = decoder.forward(tokens, position)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
            position = position + 1


class Tokenizer:
    pad_token_id = 0
    eos_token_id = 2

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def requests():
    return [Request(p, seed=i) for i, p in enumerate(PROMPTS + [[9, 8, 7, 6], [1, 2, 3]])]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(
            temperature=1.0, max_tokens=24, stop_token_ids=tuple(range(3, VOCAB, 12)), logprobs=True
        ),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=16, logprobs=True),
        SamplingParams(temperature=0.0, max_tokens=16, logprobs_top_k=3, logprobs=True),
    ],
    ids=["seeded-stops", "top-p", "greedy-topk"],
)
def test_the_engine_samples_what_it_samples_through_the_models_forward(params):
    model = build("llama", num_attention_heads=4, num_key_value_heads=2)
    lean = HFEngine(model, tokenizer=Tokenizer())
    plain = HFEngine(model, tokenizer=Tokenizer(), decoder="hf")
    assert lean._lean is not None and plain._lean is None
    got, want = lean.generate(requests(), params), plain.generate(requests(), params)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.finish_reason for c in got] == [c.finish_reason for c in want]
    lengths = {len(c.token_ids) for c in got}
    if params.stop_token_ids:
        assert len(lengths) > 1  # rows left the batch at different steps
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(
            torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5, rtol=0
        )
        if params.logprobs_top_k:
            assert a.topk_ids == b.topk_ids


def test_weights_changed_in_place_between_calls_are_the_ones_decoded():
    # The online loop hands the engine the model being trained: an optimizer step between
    # two generations must show in the second.
    model = build("llama")
    lean = HFEngine(model, tokenizer=Tokenizer())
    plain = HFEngine(model, tokenizer=Tokenizer(), decoder="hf")
    params = SamplingParams(temperature=0.0, max_tokens=12)
    before = [c.token_ids for c in lean.generate(requests(), params)]
    optimizer = torch.optim.SGD(model.parameters(), lr=5.0)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    after = [c.token_ids for c in lean.generate(requests(), params)]
    assert after == [c.token_ids for c in plain.generate(requests(), params)]
    assert after != before


def test_bfloat16_follows_the_models_rounding():
    model = build("qwen3", dtype=torch.bfloat16)
    decoder = lean_decoder(model)
    ids, mask = padded(PROMPTS)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        decoder.start(mask, ids.shape[1] + 1)
        want, _ = model_cache_step(model, ids, mask, positions, None)
        got = decoder.forward(ids, positions)
    # bf16 logits: within a few units of bf16's last place of each other
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)


def test_models_it_cannot_reproduce_keep_their_own_forward():
    from peft import LoraConfig, get_peft_model

    assert lean_decoder(build("mistral", sliding_window=16)) is None
    lora = get_peft_model(build("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert lean_decoder(lora) is None
    assert lean_decoder(lora.base_model.model) is None  # its q_proj is a LoRA layer now
    model = build("llama")
    next(model.parameters()).ds_id = 0  # a ZeRO-3 partitioned parameter
    assert lean_decoder(model) is None
    silly = build("llama", hidden_act="gelu")
    assert lean_decoder(silly) is None
    # and the engine still generates with them, through the model's forward
    engine = HFEngine(lora.base_model.model, tokenizer=Tokenizer())
    assert engine._lean is None
    out = engine.generate(requests()[:2], SamplingParams(temperature=0.0, max_tokens=5))
    assert all(len(c.token_ids) == 5 for c in out)


def test_the_decoder_switch_auto_is_lean_on_a_cpu():
    """decoder auto: lean where per-operation overhead is the cost (this CPU); lean and hf
    as asked; anything else is refused."""
    model = build("llama")
    assert HFEngine(model, tokenizer=Tokenizer())._lean is not None
    assert HFEngine(model, tokenizer=Tokenizer(), decoder="lean")._lean is not None
    assert HFEngine(model, tokenizer=Tokenizer(), decoder="hf")._lean is None
    with pytest.raises(ValueError, match="decoder"):
        HFEngine(model, tokenizer=Tokenizer(), decoder="fast")


def test_a_renamed_transformers_attribute_falls_back_to_the_models_forward(caplog):
    """The lean decoder reads transformers' module attributes; a release that renames one
    (here RMSNorm's variance_epsilon) gets the model's forward and one log line."""
    import logging

    model = build("llama")
    norm = model.model.layers[0].input_layernorm
    norm.eps = norm.variance_epsilon
    del norm.variance_epsilon
    pt_logger = logging.getLogger("pt")  # a CLI run in this process may stop propagation
    if not pt_logger.propagate:
        pt_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger="pt"):
            engine = HFEngine(model, tokenizer=Tokenizer(), decoder="lean")
    finally:
        pt_logger.removeHandler(caplog.handler)
    assert engine._lean is None
    lines = [r.getMessage() for r in caplog.records if "lean decoder" in r.getMessage()]
    assert len(lines) == 1 and "variance_epsilon" in lines[0]
