"""Preference pairs as pt-train reads them: the three source shapes, the token ids and masks,
the boundary between prompt and answer, the length policy and the drops."""

from __future__ import annotations

import pytest

from pt_core.contracts import IGNORE_INDEX, TOKENIZED_PREFERENCE_COLUMNS
from pt_core.errors import InputError
from pt_data.preferences import normalize_preference_row, tokenize_preference_rows


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def encode(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def expected_pair(tok, prompt, chosen, rejected):
    """The pair computed from the tokenizer's own chat template: the prompt rendered through
    the generation prompt, each answer = the ids of the whole conversation after it."""
    prompt_text = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    prompt_ids = encode(tok, prompt_text)
    out = {"prompt_input_ids": prompt_ids}
    for side, answer in (("chosen", chosen), ("rejected", rejected)):
        full = encode(tok, tok.apply_chat_template(prompt + answer, tokenize=False))
        assert full[: len(prompt_ids)] == prompt_ids  # ChatML: no merge at the boundary
        ids = full[len(prompt_ids) :]
        # ChatML ends the answer with "<|im_end|>\n": the newline is the separator before the
        # next turn, not model output, so it is the one untrained token.
        assert tok.decode(ids[-2:]) == "<|im_end|>\n"
        out[f"{side}_input_ids"] = ids
        out[f"{side}_labels"] = ids[:-1] + [IGNORE_INDEX]
    return out


def tokenize(tok, rows, **kw):
    kw.setdefault("max_seq_length", 512)
    return tokenize_preference_rows(rows, tok, **kw)


def test_answers_with_a_prompt_string(tiny_tokenizer):
    rows = [{"id": "q1", "prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"}]
    (row,), counts = tokenize(tiny_tokenizer, rows)
    expected = expected_pair(
        tiny_tokenizer, [user("What is 2 + 2?")], [assistant("4")], [assistant("5")]
    )
    assert {k: row[k] for k in TOKENIZED_PREFERENCE_COLUMNS} == expected
    assert row["id"] == "q1"
    assert counts == {"pairs": 1, "dropped": {}, "truncated": 0, "boundary_merged": 0}


def test_prompt_plus_answer_is_the_tokenizers_encoding_of_the_whole_conversation(
    tiny_tokenizer,
):
    # A multi-turn prompt with a system message and an earlier assistant turn: that earlier
    # turn belongs to the prompt (not trained here), and each side still concatenates to
    # exactly the encoding of the whole rendered conversation, with one BOS.
    prompt = [
        {"role": "system", "content": "Be brief."},
        user("What is 12 + 34?"),
        assistant("46"),
        user("And 7 * 8?"),
    ]
    chosen, rejected = [assistant("\\boxed{56}")], [assistant("It is 54.")]
    (row,), _ = tokenize(
        tiny_tokenizer, [{"prompt": prompt, "chosen": chosen, "rejected": rejected}]
    )
    for side, answer in (("chosen", chosen), ("rejected", rejected)):
        whole = tiny_tokenizer.apply_chat_template(prompt + answer, tokenize=False)
        assert row["prompt_input_ids"] + row[f"{side}_input_ids"] == encode(tiny_tokenizer, whole)
    assert row == {**row, **expected_pair(tiny_tokenizer, prompt, chosen, rejected)}
    bos = tiny_tokenizer.bos_token_id
    assert row["prompt_input_ids"][0] == bos and row["prompt_input_ids"].count(bos) == 1
    assert bos not in row["chosen_input_ids"] + row["rejected_input_ids"]


def test_whole_conversations_share_their_prompt_prefix(tiny_tokenizer):
    # UltraFeedback-binarized: chosen and rejected are whole conversations, with a 'prompt'
    # column repeating the first user turn. The prompt is their common prefix.
    row = {
        "prompt": "Name a colour.",
        "chosen": [user("Name a colour."), assistant("Blue.")],
        "rejected": [user("Name a colour."), assistant("A dog.")],
    }
    norm, reason = normalize_preference_row(row)
    assert reason is None
    assert norm == {
        "prompt": [user("Name a colour.")],
        "chosen": [assistant("Blue.")],
        "rejected": [assistant("A dog.")],
    }
    (pair,), _ = tokenize(tiny_tokenizer, [row])
    expected = expected_pair(
        tiny_tokenizer, [user("Name a colour.")], [assistant("Blue.")], [assistant("A dog.")]
    )
    assert {k: pair[k] for k in TOKENIZED_PREFERENCE_COLUMNS} == expected


def test_anthropic_hh_texts_split_at_the_last_shared_human_turn(tiny_tokenizer):
    shared = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: What is 3 + 4?"
    row = {"chosen": shared + "\n\nAssistant: It is 7.", "rejected": shared + "\n\nAssistant: 8"}
    norm, _ = normalize_preference_row(row)
    prompt = [user("Hi there"), assistant("Hello!"), user("What is 3 + 4?")]
    assert norm == {
        "prompt": prompt,
        "chosen": [assistant("It is 7.")],
        "rejected": [assistant("8")],
    }
    (pair,), _ = tokenize(tiny_tokenizer, [row])
    expected = expected_pair(tiny_tokenizer, prompt, [assistant("It is 7.")], [assistant("8")])
    assert {k: pair[k] for k in TOKENIZED_PREFERENCE_COLUMNS} == expected
    # The HH shape with a separate prompt (as TRL's copy of the dataset has it): the prompt's
    # trailing "\n\nAssistant:" is the answer's header, not a turn.
    split = {"prompt": shared + "\n\nAssistant:", "chosen": " It is 7.", "rejected": " 8"}
    assert normalize_preference_row(split)[0] == norm


def test_identical_answers_and_differing_prompts_are_dropped_and_counted(tiny_tokenizer):
    rows = [
        {"prompt": "q", "chosen": "same", "rejected": "same"},
        {"chosen": [user("a"), assistant("x")], "rejected": [user("b"), assistant("y")]},
        # the conversations differ in a user turn after a shared answer: no shared prompt
        {
            "chosen": [user("a"), assistant("x"), user("more"), assistant("y")],
            "rejected": [user("a"), assistant("x")],
        },
        {"prompt": "q", "chosen": "yes", "rejected": "no"},
    ]
    out, counts = tokenize(tiny_tokenizer, rows)
    assert len(out) == 1 and counts["pairs"] == 1
    assert counts["dropped"] == {"identical": 1, "prompts_differ": 2}


def test_where_tokens_merge_across_the_boundary_the_prompt_ends_before_the_merged_token(
    tiny_tokenizer,
):
    # The plain template's generation prompt ends in "Assistant: "; the tiny BPE encodes
    # " hello" with the space attached, so prompt + answer cannot be cut between them.
    prompt, chosen, rejected = [user("hi")], [assistant("hello")], [assistant("hey")]
    rows = [{"prompt": prompt, "chosen": chosen, "rejected": rejected}]
    (row,), counts = tokenize(tiny_tokenizer, rows, chat_template="plain")
    bos, eos = tiny_tokenizer.bos_token, tiny_tokenizer.eos_token
    prompt_text = f"{bos}User: hi\n\nAssistant: "
    alone = encode(tiny_tokenizer, prompt_text)
    assert tiny_tokenizer.decode(alone[-1:]) == " "  # the prompt alone ends in a space token
    for side, answer in (("chosen", "hello"), ("rejected", "hey")):
        whole = encode(tiny_tokenizer, f"{prompt_text}{answer}{eos}\n\n")
        # the invariant holds: prompt + answer is the encoding of the whole text
        assert row["prompt_input_ids"] + row[f"{side}_input_ids"] == whole
        first = row[f"{side}_input_ids"][0]
        assert tiny_tokenizer.decode([first]).startswith(" h")  # the merged token
        assert row[f"{side}_labels"][0] == first  # ... is trained, as the SFT mask trains it
    assert row["prompt_input_ids"] == alone[:-1]  # the prompt is one token short of alone
    assert counts["boundary_merged"] == 1


def test_exactly_one_bos_when_the_template_writes_one_and_so_does_the_tokenizer(
    tiny_tokenizer,
):
    doubled = "{{ bos_token }}" + tiny_tokenizer.chat_template
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}]
    (plain,), _ = tokenize(tiny_tokenizer, rows)
    (fixed,), _ = tokenize(tiny_tokenizer, rows, chat_template=doubled)
    assert fixed == plain and fixed["prompt_input_ids"].count(tiny_tokenizer.bos_token_id) == 1


def test_length_limits_drop_or_cut_and_count(tiny_tokenizer):
    short = {"id": "short", "prompt": "q", "chosen": "yes", "rejected": "no"}
    long_answer = {"id": "long", "prompt": "q", "chosen": "1 " * 40, "rejected": "no"}
    long_prompt = {"id": "wordy", "prompt": "w " * 60, "chosen": "yes", "rejected": "no"}
    rows = [short, long_answer, long_prompt]
    (base,), _ = tokenize(tiny_tokenizer, [short])
    n_prompt = len(base["prompt_input_ids"])  # "q" gives the same prompt in both short rows
    (full_long,), _ = tokenize(tiny_tokenizer, [long_answer])
    assert len(full_long["chosen_input_ids"]) > 40  # one token per digit and per space

    limit = n_prompt + 10
    out, counts = tokenize(tiny_tokenizer, rows, max_seq_length=limit, max_prompt_length=30)
    # the long answer does not fit beside the prompt; the long prompt is over 30 tokens
    assert [r["id"] for r in out] == ["short"]
    assert counts["dropped"] == {"too_long": 1, "prompt_too_long": 1}

    out, counts = tokenize(
        tiny_tokenizer, rows, max_seq_length=limit, max_prompt_length=30, truncate=True
    )
    assert [r["id"] for r in out] == ["short", "long"] and counts["truncated"] == 1
    cut = out[1]
    # the answer keeps its first tokens, up to max_seq_length with the prompt; the prompt is
    # never cut, and the short side is left whole
    assert cut["prompt_input_ids"] == full_long["prompt_input_ids"]
    assert cut["chosen_input_ids"] == full_long["chosen_input_ids"][:10]
    assert cut["chosen_labels"] == full_long["chosen_labels"][:10]
    assert cut["rejected_input_ids"] == full_long["rejected_input_ids"]
    assert counts["dropped"] == {"prompt_too_long": 1}

    # max_completion_length limits each answer on its own
    out, counts = tokenize(tiny_tokenizer, rows[:2], max_completion_length=5, truncate=True)
    assert [len(r["chosen_input_ids"]) for r in out] == [
        len(base["chosen_input_ids"]),
        5,
    ]
    # a prompt that fills max_seq_length leaves no room for an answer token
    out, counts = tokenize(tiny_tokenizer, [short], max_seq_length=n_prompt, truncate=True)
    assert out == [] and counts["dropped"] == {"prompt_too_long": 1}


def test_answers_that_become_equal_when_cut_are_dropped(tiny_tokenizer):
    row = {"prompt": "q", "chosen": "1 2 3 4 5 6", "rejected": "1 2 3 4 5 7"}
    out, counts = tokenize(tiny_tokenizer, [row], max_completion_length=4, truncate=True)
    assert out == [] and counts["dropped"] == {"identical": 1}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": "q", "chosen": "a"}, r"preference row 1: .*missing column\(s\) 'rejected'"),
        (
            {"id": 7, "prompt": 3, "chosen": "a", "rejected": "b"},
            r"preference row 1 \(id 7\): column 'prompt' holds int",
        ),
        ({"chosen": "a", "rejected": "b"}, "hold only answers and the row has no 'prompt'"),
        (
            {"chosen": [user("q"), assistant("a")], "rejected": "b", "prompt": "q"},
            "one of 'chosen' and 'rejected' is a whole conversation",
        ),
        (
            {"prompt": "q", "chosen": [assistant("a"), user("b")], "rejected": "c"},
            "'chosen' holds user turns",
        ),
        ({"prompt": "q", "chosen": [], "rejected": "c"}, "column 'chosen' is an empty list"),
    ],
)
def test_malformed_rows_are_one_error_naming_the_row(tiny_tokenizer, row, message):
    with pytest.raises(InputError, match=message):
        tokenize(tiny_tokenizer, [row])
