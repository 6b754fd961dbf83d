"""pt-data build on tool-use chats: a row with tool calls, a tool turn and a ``tools``
column is kept, its tools reach the template, and only the calls and the answer train."""

from __future__ import annotations

import json

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
