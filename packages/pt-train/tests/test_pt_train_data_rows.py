"""Conversation rows that pt-train tokenizes itself (``--data raw.jsonl``): a bad row is
one error naming the file, the row and the fix, as pt-data names it; tool-use chats
train the assistant's calls and answers, not the tool's output."""

from __future__ import annotations

import json

import pytest
import yaml

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import InputError
from pt_train.config import DataConfig
from pt_train.data import load_rows

CHAT = {
    "messages": [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
    ]
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_row_without_messages_names_the_file_the_row_and_the_fix(tmp_path, tiny_tokenizer):
    path = write_jsonl(tmp_path / "raw.jsonl", [CHAT, {"prompt": "2 + 2?", "answer": "4"}])
    with pytest.raises(InputError) as err:
        load_rows(DataConfig(path=str(path)), path, tiny_tokenizer)
    # rows count from 1, as pt-data counts them
    assert (
        err.value.message
        == f"{path} row 2: missing column 'messages'; the row has: 'prompt', 'answer'"
    )
    assert "give every row 'messages'" in err.value.hint


def test_a_malformed_conversation_names_its_row(tmp_path, tiny_tokenizer):
    image = {"type": "image_url", "image_url": {"url": "cat.png"}}
    bad = {
        "messages": [
            {"role": "user", "content": [image]},
            {"role": "assistant", "content": "A cat."},
        ]
    }
    path = write_jsonl(tmp_path / "raw.jsonl", [CHAT, CHAT, bad])
    with pytest.raises(InputError) as err:
        load_rows(DataConfig(path=str(path)), path, tiny_tokenizer)
    assert err.value.message == (
        f"{path} row 3: conversation: message 0: content part 0 is 'image_url', not text"
    )


def test_tool_calls_train_and_tool_output_does_not(tmp_path, qwen_tokenizer):
    call = {"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 2}'}}
    chat = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": [{"type": "text", "text": "2 + 2 = 4."}]},
    ]
    path = write_jsonl(tmp_path / "raw.jsonl", [{"messages": chat}])
    (row,) = load_rows(DataConfig(path=str(path), packing=False), path, qwen_tokenizer)
    trained = [
        int(t) for t, label in zip(row.input_ids, row.labels, strict=True) if label != IGNORE_INDEX
    ]
    # the call (arguments as an object) and the answer, each with its end-of-turn token
    assert qwen_tokenizer.decode(trained) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>'
        "2 + 2 = 4.<|im_end|>"
    )


@pytest.mark.slow
def test_pt_train_run_on_a_row_without_messages_exits_2(tmp_path, cli, tiny_run_config):
    path = write_jsonl(tmp_path / "raw.jsonl", [CHAT] * 3 + [{"text": "no chat"}])
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump(tiny_run_config(tmp_path, path, {"name": "sft"})))
    proc = cli("pt-train", "run", config, "--data", path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr
    assert f"{path} row 4: missing column 'messages'" in " ".join(proc.stderr.split())
