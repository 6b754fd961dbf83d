"""Building a small byte-level BPE tokenizer with a chat template, locally and offline.

The offline quickstart and the tests train their models from scratch, so they
need a tokenizer that is made on the machine rather than downloaded. Digits are
split one per token so that arithmetic is learnable by a tiny model.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pt_core.chat import CHATML

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, IM_START, IM_END, PAD]


_DEFAULT_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Please reason step by step, and put your "
    "final answer within \\boxed{}. What is 12 + 34? We add the tens and the ones: 12 + 34 = 46. "
    "The answer is \\boxed{46}. Compute 7 * 8 - 5. First 7 * 8 = 56, then 56 - 5 = 51. "
    "user assistant system Question: Answer: Let x = 3 and y = -2; then x * y = -6. "
    "A train travels 60 miles in 2 hours, so its speed is 30 miles per hour. "
    "Solve for n: 3n + 4 = 19, so 3n = 15 and n = 5. Therefore, the final answer is $5$. "
    "Hello! How can I help you today? Sure, here is a short poem about the sea."
)


def build_tokenizer(
    out_dir: str | Path | None = None,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 512,
    model_max_length: int = 2048,
):
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it as a HF fast tokenizer.

    The result has BOS/EOS/PAD, ChatML special tokens and a chat template that
    puts exactly one BOS at the start. ``<|im_end|>`` is the EOS token, so
    generation stops at the end of an assistant turn. Saved to ``out_dir`` when given.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = list(texts) if texts is not None else []
    corpus = corpus + [_DEFAULT_CORPUS] * 4
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START, EOS],
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHATML  # one BOS at the start; tool calls and tool turns rendered
    if out_dir is not None:
        hf.save_pretrained(str(out_dir))
    return hf


def row_texts(row: dict, where: str = "row") -> list[str]:
    """Every string in a row, message contents included. A conversation (``messages``)
    with tool calls or a ``tools`` column adds its rendering by the ChatML template, so
    that the tokenizer learns the text the template writes around them (the tool list in
    the opening, the calls' tags and JSON), which no column holds and every such row
    repeats; ``where`` names the row in the error of one that cannot be rendered."""
    out = []
    for value in row.values():
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    out.append(item)
                elif isinstance(item, dict) and isinstance(item.get("content"), str):
                    out.append(item["content"])
    messages = row.get("messages")
    if isinstance(messages, list) and (
        row.get("tools") or any(isinstance(m, dict) and m.get("tool_calls") for m in messages)
    ):
        from pt_data.templates import compile_template
        from pt_data.tokenize import check_messages, check_tools

        rendered = compile_template(CHATML).render(
            messages=check_messages(messages, where), tools=check_tools(row.get("tools"), where),
            bos_token="",
        )  # fmt: skip
        out.append(rendered)
    return out


def train_tokenizer_on_rows(
    paths, out_dir: str | Path, *, vocab_size: int = 512, skip_bad: bool = False
):
    """Train :func:`build_tokenizer` on the text of row files and save it atomically."""
    from pt_core.files import atomic_path, iter_rows

    texts = [
        text
        for path in paths
        for i, row in enumerate(iter_rows(path, skip_bad=skip_bad), start=1)
        for text in row_texts(row, f"{path}: row {i}")
    ]
    if not any(t.strip() for t in texts):
        from pt_core.errors import InputError

        raise InputError(
            f"{', '.join(map(str, paths))}: no text to learn from",
            hint="give row files whose columns hold strings or messages",
        )
    with atomic_path(out_dir) as tmp:
        tokenizer = build_tokenizer(tmp, texts=texts, vocab_size=vocab_size)
    return tokenizer
