"""Chats as real datasets hold them: content as a list of text parts (the OpenAI/HF
format), assistant turns made of tool calls, and ``tool`` turns with their output, on the
Qwen2.5 tokenizer and its own ChatML template (tool calls in <tool_call> tags, tool
outputs as <tool_response> user turns)."""

from __future__ import annotations

import json

import pytest

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_data.config import DataConfig
from pt_data.tokenize import check_messages, tokenize_conversation

WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    # OpenAI's format: the arguments as a JSON string
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}

TOOL_CHAT = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 18, "sky": "clear"}'},
    {"role": "assistant", "content": [{"type": "text", "text": "It is 18 C and clear."}]},
]

# What the model must emit, turn by turn: the call (arguments as an object), then the
# answer, each closed by ChatML's end-of-turn token.
CALL_REPLY = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>'
)
ANSWER_REPLY = "It is 18 C and clear.<|im_end|>"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def trained_runs(tok, ids, labels) -> list[str]:
    """The decoded runs of consecutive trained tokens."""
    runs, run = [], []
    for token, label in zip(ids, labels, strict=True):
        if label != IGNORE_INDEX:
            assert label == token  # labels are aligned with the ids; the model shifts them
            run.append(token)
        elif run:
            runs.append(tok.decode(run))
            run = []
    if run:
        runs.append(tok.decode(run))
    return runs


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_text_parts_are_joined_with_newlines_like_vllm_joins_them():
    (message,) = check_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ]
    )
    assert message == {"role": "user", "content": "a\nb"}


def test_the_tool_call_and_the_answer_are_trained_and_the_tool_output_is_not(qwen_tokenizer):
    row = tokenize_conversation(qwen_tokenizer, TOOL_CHAT)
    # Exactly the two assistant replies with their <|im_end|>: the call-only turn is a
    # reply the model must learn to emit; the system, user and tool turns are inputs.
    assert trained_runs(qwen_tokenizer, row["input_ids"], row["labels"]) == [
        CALL_REPLY,
        ANSWER_REPLY,
    ]
    untrained = qwen_tokenizer.decode(
        [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label == -100]
    )
    assert '<tool_response>\n{"temp_c": 18, "sky": "clear"}\n</tool_response>' in untrained


def test_the_ids_are_what_the_tokenizers_own_template_gives(qwen_tokenizer):
    # The same conversation as apply_chat_template takes it (string content, arguments
    # as a dict) encodes to the same ids: parts and JSON-string arguments change nothing.
    plain = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    **WEATHER_CALL,
                    "function": {**WEATHER_CALL["function"], "arguments": {"city": "Paris"}},
                }
            ],
        },
        TOOL_CHAT[2],
        {"role": "assistant", "content": "It is 18 C and clear."},
    ]
    text = qwen_tokenizer.apply_chat_template(plain, tokenize=False)
    row = tokenize_conversation(qwen_tokenizer, TOOL_CHAT)
    assert row["input_ids"] == qwen_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_train_on_last_trains_only_the_final_answer(qwen_tokenizer):
    row = tokenize_conversation(qwen_tokenizer, TOOL_CHAT, train_on="last")
    assert trained_runs(qwen_tokenizer, row["input_ids"], row["labels"]) == [ANSWER_REPLY]


def test_a_rows_tools_reach_the_template_as_tools(qwen_tokenizer, realshape):
    # Qwen2.5's own template lists the tools in its system turn; this one names them.
    template = (
        "{%- if tools %}{{- '# Tools: ' + tools | map(attribute='function.name') | join(', ') "
        "+ '\\n' }}{%- endif %}" + realshape.QWEN_CHATML
    )
    for tools in ([WEATHER_TOOL], json.dumps([WEATHER_TOOL])):  # a list, or a JSON string
        row = tokenize_conversation(qwen_tokenizer, TOOL_CHAT, chat_template=template, tools=tools)
        assert qwen_tokenizer.decode(row["input_ids"]).startswith("# Tools: get_weather\n")
        # the tool list is an input: the trained text is the same as without tools
        runs = trained_runs(qwen_tokenizer, row["input_ids"], row["labels"])
        assert runs == [CALL_REPLY, ANSWER_REPLY]
    with pytest.raises(InputError, match="column 'tools' holds dict"):
        tokenize_conversation(qwen_tokenizer, TOOL_CHAT, chat_template=template, tools=WEATHER_TOOL)


def test_an_image_part_is_refused_naming_the_file_and_row(tmp_path, qwen_tokenizer_dir):
    from pt_data.inspect import inspect_config

    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
    chat = [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]},
        {"role": "assistant", "content": "A cat."},
    ]
    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": TOOL_CHAT}, {"messages": chat}])
    cfg = DataConfig.model_validate(
        {"datasets": [{"source": str(src)}], "tokenizer": {"name_or_path": str(qwen_tokenizer_dir)}}
    )
    with pytest.raises(InputError) as err:
        inspect_config(cfg, "tokenized", n=2)
    assert err.value.message == (
        f"{src} row 2 (messages transform): column 'messages' message 0: content part 1 is "
        "'image_url', not text"
    )
    assert "drop the image/audio parts" in err.value.hint


def test_inspect_tokenized_shows_tool_chats(tmp_path, cli, qwen_tokenizer, qwen_tokenizer_dir):
    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": TOOL_CHAT, "tools": [WEATHER_TOOL]}])
    cfg = tmp_path / "data.yaml"
    cfg.write_text(
        f"data:\n  datasets:\n    - source: {src}\n"
        f"  tokenizer:\n    name_or_path: {qwen_tokenizer_dir}\n"
    )
    wide = {"COLUMNS": "400"}  # the panel's title holds the long temporary path
    proc = cli("pt-data", "inspect", cfg, "--stage", "tokenized", "--json", env=wide)
    assert "trained (highlighted)" in proc.stderr and "<tool_response>" in proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert trained_runs(qwen_tokenizer, record["input_ids"], record["labels"]) == [
        CALL_REPLY,
        ANSWER_REPLY,
    ]

    proc = cli("pt-data", "inspect", cfg, "--stage", "transformed", "--json")
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    # the transform keeps the tool keys and the row's tools, with the parts made text
    assert record["row"]["tools"] == [WEATHER_TOOL]
    assert [m["role"] for m in record["row"]["messages"]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert record["row"]["messages"][1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"
    }
    assert record["row"]["messages"][2]["tool_call_id"] == "call_1"
    assert record["row"]["messages"][3]["content"] == "It is 18 C and clear."


def test_inspect_shows_an_episode_with_the_environments_tokens_not_trained(
    tmp_path, cli, tiny_tokenizer, tiny_tokenizer_dir
):
    """An episode row (pt-rollout generate --env): its prompt and every id after it, the
    policy's turns trained and highlighted, the environment's answer between them not; the
    rows record no tokenizer, so one is asked for."""
    from pt_core.files import write_rows

    ids = lambda text: tiny_tokenizer(text, add_special_tokens=False).input_ids  # noqa: E731
    turn1, answer, turn2 = (
        ids("5<|im_end|>"),
        ids("\n<|im_start|>user\nhigher<|im_end|>\n"),
        ids("9<|im_end|>"),
    )
    row = {"id": 3, "sample": 0, "prompt_token_ids": ids("<|im_start|>user\nguess<|im_end|>\n"),
           "completion_token_ids": turn1 + answer + turn2,
           "completion_mask": [1] * len(turn1) + [0] * len(answer) + [1] * len(turn2),
           "num_turns": 2, "finish_reason": "done"}  # fmt: skip
    rows = write_rows(tmp_path / "episodes.jsonl", [row])
    wide = {"COLUMNS": "400"}
    proc = cli("pt-data", "inspect", rows, "--tokenizer", tiny_tokenizer_dir, "--json", env=wide)
    assert "episode 3, sample 0, 2 turns, ended done" in proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines()]
    assert trained_runs(tiny_tokenizer, record["input_ids"], record["labels"]) == [
        "5<|im_end|>",
        "9<|im_end|>",
    ]
    refused = cli("pt-data", "inspect", rows, check=False)
    assert refused.returncode == 2 and "record no tokenizer" in refused.stderr
