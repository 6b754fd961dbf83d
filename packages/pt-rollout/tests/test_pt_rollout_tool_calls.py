"""Tool calls read out of generated replies (pt_rollout.tools.calls), in the two formats
of the template families in use: each read back from what the template itself renders for
an assistant turn with ``tool_calls`` (the real-shape Qwen2.5 tokenizer's ChatML, and a
Llama 3.1-style template written here from Meta's documented JSON tool-call format),
and the failures a model's malformed calls are reported with."""

from __future__ import annotations

import json

import pytest

from pt_core.chat import CHATML, PLAIN
from pt_core.errors import ConfigError
from pt_rollout.tools import ParseFailure, ToolCall, parse_tool_calls, resolve_tool_format

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "description": "the first"},
                           "b": {"type": "integer", "description": "the second"}},
            "required": ["a", "b"],
        },
    },
}  # fmt: skip

# Llama 3.1's JSON tool calling, as Meta documents the prompt format (written here): the
# tools' JSON in the first user turn, "Environment: ipython" in the system turn, the
# assistant's call as {"name": ..., "parameters": ...} ending with <|eot_id|>, the tool's
# answer in an ipython turn.
LLAMA31_JSON_TOOLS = (
    "{{- bos_token }}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools %}{{- 'Environment: ipython\\n\\n' }}{%- endif %}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}{%- endif %}"
    "{{- '<|eot_id|>' }}"
    "{%- set first_user = namespace(done=false) %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{%- if tools and not first_user.done %}"
    '{{- \'Answer with a JSON function call, {"name": function name, "parameters": '
    "its arguments}, to one of these functions:\\n\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{{- '\\n\\n' }}{%- endfor %}"
    "{%- set first_user.done = true %}"
    "{%- endif %}"
    "{{- message.content + '<|eot_id|>' }}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{{- '{\"name\": \"' + call.name + '\", \"parameters\": ' + (call.arguments | tojson) + '}' }}"
    "{{- '<|eot_id|>' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- elif message.role in ('tool', 'ipython') %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)


def rendered_reply(tokenizer, template: str, reply: dict, end: str) -> str:
    """What a model trained on ``template`` generates for the assistant turn ``reply``:
    the whole conversation rendered, less the prompt with its generation prompt, up to the
    end-of-turn token ``end``."""
    conversation = [{"role": "user", "content": "What is 2 + 3, and 4 + 5?"}]
    prompt = tokenizer.apply_chat_template(conversation, tools=[ADD], chat_template=template,
                                           tokenize=False, add_generation_prompt=True)  # fmt: skip
    whole = tokenizer.apply_chat_template([*conversation, reply], tools=[ADD],
                                          chat_template=template, tokenize=False)  # fmt: skip
    assert whole.startswith(prompt)
    return whole[len(prompt) :].partition(end)[0]


def assistant_calls(content: str, *calls: dict) -> dict:
    tool_calls = [{"type": "function", "function": {"name": "add", "arguments": c}} for c in calls]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls}


# --- round trips: what a template renders, read back ---------------------------------------


@pytest.mark.parametrize("template_name", ["qwen2.5", "pt chatml"])
@pytest.mark.parametrize("content", ["Adding both.", ""])
def test_chatml_tool_calls_read_back_as_rendered(qwen_tokenizer, template_name, content):
    """Two calls after some text (and without it), rendered by the real-shape Qwen2.5
    template and by pt's own ChatML: the text and both calls come back, and come back the
    same from the reply's token ids decoded with their special tokens."""
    template = qwen_tokenizer.chat_template if template_name == "qwen2.5" else CHATML
    assert resolve_tool_format(template) == "hermes"
    reply = rendered_reply(
        qwen_tokenizer, template, assistant_calls(content, {"a": 2, "b": 3}, {"a": 4, "b": 5}),
        "<|im_end|>",
    )  # fmt: skip
    parsed = parse_tool_calls(reply, "hermes")
    assert parsed.content == content
    assert parsed.calls == [ToolCall("add", {"a": 2, "b": 3}), ToolCall("add", {"a": 4, "b": 5})]
    assert parsed.failures == []
    ids = qwen_tokenizer.encode(reply, add_special_tokens=False)
    assert parse_tool_calls(qwen_tokenizer.decode(ids), "hermes") == parsed
    # <tool_call> is a special token of Qwen's: decoded without them, the calls are gone
    skipped = qwen_tokenizer.decode(ids, skip_special_tokens=True)
    assert parse_tool_calls(skipped, "hermes").calls == []


def test_qwen_chatml_renders_the_tool_schemas_into_the_system_turn(qwen_tokenizer):
    """The schemas a Toolbox gives are what the template shows the model, as JSON lines
    between <tools> tags."""
    prompt = qwen_tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[ADD], tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    listed = prompt.partition("<tools>\n")[2].partition("\n</tools>")[0]
    assert [json.loads(line) for line in listed.splitlines()] == [ADD]
    plain = qwen_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<tools>" not in plain  # without tools=, the template is as it was


def test_llama31_json_tool_calls_read_back_as_rendered(qwen_tokenizer):
    """One call (Llama 3.1's template renders one a turn): it comes back with no text."""
    assert resolve_tool_format(LLAMA31_JSON_TOOLS) == "llama3_json"
    reply = rendered_reply(
        qwen_tokenizer, LLAMA31_JSON_TOOLS, assistant_calls("", {"a": 2, "b": 3}), "<|eot_id|>"
    )
    assert reply == '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    parsed = parse_tool_calls(reply, "llama3_json")
    assert (parsed.content, parsed.calls, parsed.failures) == (
        "", [ToolCall("add", {"a": 2, "b": 3})], [],
    )  # fmt: skip


# --- the formats, case by case -------------------------------------------------------------------


def test_hermes_a_reply_without_calls_is_all_content():
    parsed = parse_tool_calls("  The answer is 5.\n", "hermes")
    assert (parsed.content, parsed.calls, parsed.failures) == ("The answer is 5.", [], [])


@pytest.mark.parametrize(
    ("reply", "calls", "reason"),
    [
        ('<tool_call>\n{"name": "add", "arguments": {"a": 1,}}\n</tool_call>', [],
         "not JSON (Expecting property name enclosed in double quotes at 37)"),
        ('<tool_call>\n["add", 1]\n</tool_call>', [], "not a JSON object"),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', [], 'no "name" (a string) of the tool to call'),
        ('<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>', [],
         '"arguments" is not a JSON object of arguments'),
        ('<tool_call>\n{"name": "now"}\n</tool_call>\n<tool_call>\n{"name": "add", "argu',
         [ToolCall("now", {})], "no </tool_call> closes it"),
    ],
)  # fmt: skip
def test_hermes_a_call_that_cannot_be_read_is_a_failure_with_the_reason(reply, calls, reason):
    """Each failure keeps the text meant as a call and what is wrong with it, and the
    message a model is answered with; a call without arguments has none (the schema check
    then names what is missing); a call cut off by the token limit has no closing tag."""
    parsed = parse_tool_calls(reply, "hermes")
    assert parsed.calls == calls
    assert [f.reason for f in parsed.failures] == [reason]
    assert parsed.failures[0].message() == f"Error: the tool call could not be read: {reason}."


def test_llama3_json_with_python_tag_several_calls_and_end_token():
    """The text before <|python_tag|> is content; calls separated by ';'; the end-of-turn
    token decoded at the end is not part of them."""
    reply = 'Let me add.<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}; ' \
            '{"name": "add", "arguments": {"a": 3, "b": 4}}<|eom_id|>'  # fmt: skip
    parsed = parse_tool_calls(reply, "llama3_json")
    assert parsed.content == "Let me add."
    assert parsed.calls == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("add", {"a": 3, "b": 4})]
    assert parsed.failures == []


@pytest.mark.parametrize(
    ("reply", "content", "failure"),
    [
        ("The answer is 7.", "The answer is 7.", None),  # prose: no call meant
        ('{"name": "add", "parameters": {"a": 1', "", ParseFailure(
            '{"name": "add", "parameters": {"a": 1', "not JSON (Expecting ',' delimiter at 37)")),
        ('{"answer": 7}', "", ParseFailure('{"answer": 7}', 'no "name" (a string) of the tool to call')),
    ],
)  # fmt: skip
def test_llama3_json_a_reply_is_a_call_only_when_it_starts_as_one(reply, content, failure):
    parsed = parse_tool_calls(reply, "llama3_json")
    assert (parsed.content, parsed.calls) == (content, [])
    assert parsed.failures == ([failure] if failure else [])


# --- which format ---------------------------------------------------------------------------------


def test_a_template_without_tool_calls_needs_the_format_named():
    with pytest.raises(ConfigError, match="writes tool calls in no format pt reads") as caught:
        resolve_tool_format(PLAIN)
    assert "hermes or llama3_json" in str(caught.value.hint)
    assert resolve_tool_format(PLAIN, override="hermes") == "hermes"
    with pytest.raises(
        ConfigError, match="tool call format 'json' is not one of hermes, llama3_json"
    ):
        resolve_tool_format(PLAIN, override="json")
    with pytest.raises(ConfigError, match="tool call format 'xml'"):
        parse_tool_calls("", "xml")
