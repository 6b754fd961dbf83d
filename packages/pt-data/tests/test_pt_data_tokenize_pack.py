"""Loss masks, BOS handling and packing on the tiny ChatML tokenizer."""

from __future__ import annotations

import pytest

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_data.pack import best_fit_decreasing, pack_examples, packing_efficiency
from pt_data.tokenize import NoTrainableTokens, TooLong, tokenize_conversation

CONVO = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 34?"},
    {"role": "assistant", "content": "12 + 34 = 46, so \\boxed{46}."},
    {"role": "user", "content": "And 7 * 8?"},
    {"role": "assistant", "content": "\\boxed{56}"},
]


def trained_text(tok, row):
    return tok.decode(
        [i for i, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    )


def test_only_assistant_turns_and_their_end_tokens_are_trained(tiny_tokenizer):
    row = tokenize_conversation(tiny_tokenizer, CONVO)
    # Both assistant contents, each followed by its <|im_end|>; nothing from system/user turns.
    assert (
        trained_text(tiny_tokenizer, row)
        == "12 + 34 = 46, so \\boxed{46}.<|im_end|>\\boxed{56}<|im_end|>"
    )
    # Where a label is set it equals the token itself (labels are aligned, the model shifts).
    assert all(
        label in (i, IGNORE_INDEX) for i, label in zip(row["input_ids"], row["labels"], strict=True)
    )
    # Every prompt token (everything up to the first assistant content) has no loss.
    prompt = tiny_tokenizer.apply_chat_template(
        CONVO[:2], add_generation_prompt=True, tokenize=False
    )
    n_prompt = len(tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert row["labels"][:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert row["labels"][n_prompt] != IGNORE_INDEX


def test_ids_match_the_tokenizers_own_chat_template(tiny_tokenizer):
    row = tokenize_conversation(tiny_tokenizer, CONVO)
    text = tiny_tokenizer.apply_chat_template(CONVO, tokenize=False)
    assert row["input_ids"] == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_train_on_last_trains_only_the_final_answer(tiny_tokenizer):
    row = tokenize_conversation(tiny_tokenizer, CONVO, train_on="last")
    assert trained_text(tiny_tokenizer, row) == "\\boxed{56}<|im_end|>"


def test_exactly_one_bos_even_when_the_template_adds_one_too(tiny_tokenizer):
    bos = tiny_tokenizer.bos_token_id
    row = tokenize_conversation(tiny_tokenizer, CONVO)
    assert row["input_ids"][0] == bos and row["input_ids"].count(bos) == 1
    # A template writing the BOS twice (as happens when a tokenizer also prepends one)
    # still yields a single BOS.
    doubled = "{{ bos_token }}" + tiny_tokenizer.chat_template
    row2 = tokenize_conversation(tiny_tokenizer, CONVO, chat_template=doubled)
    assert row2["input_ids"].count(bos) == 1 and row2["input_ids"] == row["input_ids"]


def test_a_template_that_drops_assistant_content_is_an_error(tiny_tokenizer):
    users_only = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] != 'assistant' %}"
        "{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(InputError):
        tokenize_conversation(tiny_tokenizer, CONVO, chat_template=users_only)
    with pytest.raises(NoTrainableTokens):
        tokenize_conversation(tiny_tokenizer, CONVO[:2])  # no assistant turn at all


def test_too_long_is_an_error_unless_truncated(tiny_tokenizer):
    full = tokenize_conversation(tiny_tokenizer, CONVO)
    limit = len(full["input_ids"]) - 3
    with pytest.raises(TooLong):
        tokenize_conversation(tiny_tokenizer, CONVO, max_seq_length=limit)
    cut = tokenize_conversation(tiny_tokenizer, CONVO, max_seq_length=limit, truncate=True)
    assert cut["input_ids"] == full["input_ids"][:limit]


def test_best_fit_decreasing_fills_the_tightest_bin():
    # Longest first: 6 opens bin0 (4 left); 5 does not fit there, opens bin1 (5 left);
    # 4 takes bin0 exactly; 3 goes to bin1, the only one with room (2 left); 2 fills bin1;
    # 1 finds every bin full and opens bin2.
    assert best_fit_decreasing([3, 6, 2, 5, 4, 1], 10) == [[1, 4], [3, 0, 2], [5]]


def test_packed_rows_restart_positions_and_decode_to_the_original_conversations(tiny_tokenizer):
    convos = [
        [
            {"role": "user", "content": f"What is {a} + {a}?"},
            {"role": "assistant", "content": str(2 * a)},
        ]
        for a in range(1, 30)
    ]
    examples = [tokenize_conversation(tiny_tokenizer, c) for c in convos]
    rows = pack_examples(examples, max_seq_length=64)
    assert len(rows) < len(examples)  # several conversations share a row
    seen = []
    for row in rows:
        assert len(row["input_ids"]) <= 64 and sum(row["seq_lens"]) == len(row["input_ids"])
        start = 0
        for n in row["seq_lens"]:
            assert row["position_ids"][start : start + n] == list(range(n))
            seen.append(tiny_tokenizer.decode(row["input_ids"][start : start + n]))
            start += n
    originals = [tiny_tokenizer.apply_chat_template(c, tokenize=False) for c in convos]
    assert sorted(seen) == sorted(originals)
    tokens = sum(len(e["input_ids"]) for e in examples)
    assert packing_efficiency([len(r["input_ids"]) for r in rows], 64) == tokens / (64 * len(rows))


def test_packing_never_splits_a_sequence():
    with pytest.raises(InputError, match="never splits"):
        pack_examples([{"input_ids": [1] * 9, "labels": [1] * 9}], max_seq_length=8)


@pytest.mark.parametrize("template", [None, "doubled"])
def test_the_flat_fast_path_gives_the_same_ids_and_labels(tiny_tokenizer, template):
    from pt_data.tokenize import ConversationTokenizer

    if template == "doubled":  # the fast path must also repair a double BOS
        template = "{{ bos_token }}" + tiny_tokenizer.chat_template
    ct = ConversationTokenizer(tiny_tokenizer, chat_template=template)
    convos = [
        CONVO,
        CONVO[:3],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
    ]
    batch = ct.encode_flat(convos)
    expected = [tokenize_conversation(tiny_tokenizer, c) for c in convos]
    for k, e in enumerate(expected):
        a, b = batch.offsets[k], batch.offsets[k + 1]
        assert batch.ids[a:b].tolist() == e["input_ids"]
        assert batch.labels[a:b].tolist() == e["labels"]


def test_named_and_file_templates(tiny_tokenizer, tmp_path):
    from pt_core.errors import ConfigError
    from pt_data.templates import TEMPLATES

    # The registry's chatml renders exactly what the tiny tokenizer's own ChatML renders.
    own = tokenize_conversation(tiny_tokenizer, CONVO)
    assert tokenize_conversation(tiny_tokenizer, CONVO, chat_template="chatml") == own
    jinja = tmp_path / "t.jinja"
    jinja.write_text(TEMPLATES["plain"])
    row = tokenize_conversation(tiny_tokenizer, CONVO, chat_template=str(jinja))
    # The plain template ends each assistant turn with the EOS, which is trained.
    assert trained_text(tiny_tokenizer, row).endswith("\\boxed{56}<|im_end|>")
    assert tiny_tokenizer.decode(row["input_ids"]).startswith("<|begin_of_text|>Be brief.")
    with pytest.raises(ConfigError, match="neither a known template nor a file"):
        tokenize_conversation(tiny_tokenizer, CONVO, chat_template="chatmll")


def test_generation_markers_are_accepted_and_syntax_errors_are_config_errors(tiny_tokenizer):
    from pt_core.errors import ConfigError

    marked = tiny_tokenizer.chat_template.replace(
        "{% else %}{{ '<|im_start|>' + message['role']",
        "{% else %}{%- generation -%}{{ '<|im_start|>' + message['role']",
    ).replace(
        "{{ '<|im_end|>\\n' }}{% endif %}", "{{ '<|im_end|>\\n' }}{%- endgeneration -%}{% endif %}"
    )
    assert "{%- generation -%}" in marked and "{%- endgeneration -%}" in marked
    own = tokenize_conversation(tiny_tokenizer, CONVO)
    assert tokenize_conversation(tiny_tokenizer, CONVO, chat_template=marked) == own
    with pytest.raises(ConfigError, match="line 1"):
        tokenize_conversation(tiny_tokenizer, CONVO, chat_template="{% for m in messages %}")
