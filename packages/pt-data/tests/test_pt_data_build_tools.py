"""pt-data build on tool-use chats: a row with tool calls, a tool turn and a ``tools``
column is kept, its tools reach the template, and only the calls and the answer train."""

from __future__ import annotations

import json

import pytest
import yaml

from pt_core.files import read_rows, split_path
from pt_data.build import build
from pt_data.config import DataConfig

CALL = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_CHAT = [
    {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp_c": 18}'},
    {"role": "assistant", "content": "It is 18 C."},
]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
]


def test_build_keeps_and_trains_tool_chats(tmp_path, qwen_tokenizer, qwen_tokenizer_dir, realshape):
    src = tmp_path / "chats.jsonl"
    src.write_text(json.dumps({"messages": TOOL_CHAT, "tools": TOOLS}) + "\n")
    template = (
        "{%- if tools %}{{- '# Tools: ' + tools | map(attribute='function.name') | join(', ') "
        "+ '\\n' }}{%- endif %}" + realshape.QWEN_CHATML
    )
    cfg = DataConfig.model_validate(
        {
            "datasets": [{"source": str(src)}],
            "tokenizer": {"name_or_path": str(qwen_tokenizer_dir), "chat_template": template},
        }
    )
    info = build(cfg, out_dir=tmp_path / "out")
    assert info["rows"] == 1, info  # kept: neither an empty turn nor malformed
    (row,) = read_rows(split_path(tmp_path / "out", "train"))
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    assert qwen_tokenizer.decode(row["input_ids"]).startswith("# Tools: get_weather\n")
    assert qwen_tokenizer.decode(trained) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>It is 18 C.<|im_end|>"
    )


# ChatML as `pt-data tokenizer` wrote it before it rendered tools: role, content, end.
CONTENT_ONLY_CHATML = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_tool_chat(tmp_path, tools=TOOLS):
    src = tmp_path / "chats.jsonl"
    row = {"id": "weather-1", "messages": TOOL_CHAT} | ({"tools": tools} if tools else {})
    src.write_text(json.dumps(row) + "\n")
    return src


def test_the_template_pt_data_tokenizer_writes_trains_tool_calls_and_lists_the_tools(
    tmp_path, tiny_tokenizer, tiny_tokenizer_dir
):
    """The tokenizer of `pt-data tokenizer` (tiny_tokenizer_dir is one) renders a tool call
    as Qwen2.5's ChatML does, in <tool_call> tags with its arguments as JSON, so the call is
    what the model learns to emit; the tools are listed in a system turn and the tool's
    output is a user turn, both inputs."""
    tokenizer = {"name_or_path": str(tiny_tokenizer_dir)}
    cfg = DataConfig.model_validate(
        {"datasets": [{"source": str(write_tool_chat(tmp_path))}], "tokenizer": tokenizer}
    )
    build(cfg, out_dir=tmp_path / "out")
    (row,) = read_rows(split_path(tmp_path / "out", "train"))
    text = tiny_tokenizer.decode(row["input_ids"])
    trained = [t for t, label in zip(row["input_ids"], row["labels"], strict=True) if label != -100]
    assert tiny_tokenizer.decode(trained) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>It is 18 C.<|im_end|>"
    )
    assert text.startswith("<|begin_of_text|><|im_start|>system\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in text
    assert '<|im_start|>user\n<tool_response>\n{"temp_c": 18}\n</tool_response><|im_end|>' in text


def test_conversations_without_tools_render_as_plain_chatml(tiny_tokenizer):
    """Rows without tool calls or tools read exactly as before: role, content, end of turn."""
    chat = [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]
    assert tiny_tokenizer.apply_chat_template(chat, tokenize=False) == (
        "<|begin_of_text|><|im_start|>user\n1 + 1?<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
    )


DROPS_TOOL_TURNS = CONTENT_ONLY_CHATML.replace(
    "{% for message in messages %}",
    "{% for message in messages %}{% if message['role'] == 'tool' %}{% continue %}{% endif %}",
)


@pytest.mark.parametrize(
    ("template", "tools", "says"),
    [
        (CONTENT_ONLY_CHATML, None, "does not render the tool calls of assistant message 1 "
         "(get_weather): their turn would train an empty reply"),
        (CONTENT_ONLY_CHATML.replace("message['content']", "(message['content'] ~ "
         "(message['tool_calls'] | tojson if message['tool_calls'] else ''))"), TOOLS,
         "renders the conversation the same with and without the row's tools: it drops them"),
        (DROPS_TOOL_TURNS.replace("message['content']", "(message['content'] ~ "
         "(message['tool_calls'] | tojson if message['tool_calls'] else ''))"), None,
         "does not render tool message 2"),
    ],
    ids=["tool-calls", "tools", "tool-turns"],
)  # fmt: skip
def test_a_template_that_drops_tool_calls_tools_or_tool_turns_is_refused(
    tmp_path, tiny_tokenizer_dir, cli, template, tools, says
):
    """Silently training an empty reply for every call, or a model that never sees its tools
    or their outputs, is an error naming the row and the fix, with nothing written."""
    config = tmp_path / "data.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data": {
                    "datasets": [{"source": str(write_tool_chat(tmp_path, tools))}],
                    "tokenizer": {
                        "name_or_path": str(tiny_tokenizer_dir),
                        "chat_template": template,
                    },
                    "output_dir": str(tmp_path / "out"),
                }
            }
        )
    )
    proc = cli("pt-data", "build", config, check=False)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in err and proc.stdout == ""
    assert f"error: row 'weather-1': the chat template {says}" in err
    assert "fix: use a template that renders tool calls, tools and tool turns, e.g. chatml" in err
    assert not (tmp_path / "out").exists()
