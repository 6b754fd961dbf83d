"""Transforms: raw rows in the formats people have -> the row schemas pt stages read.

A transform is a function ``fn(row, **options) -> dict | None`` (None drops the
row) registered under a name with the kind of row it makes::

    @register_transform("my_qa", kind="conversations")
    def my_qa(row, system=None):
        return {"messages": [{"role": "user", "content": row["q"]},
                             {"role": "assistant", "content": row["a"]}]}

In a config, ``transform: my_qa`` (once the module defining it is imported), or
``transform: my_package.my_module:my_qa`` for any importable function.

Kinds: ``conversations`` (``messages``), ``prompts`` (``id``, ``prompt``, ``answer``),
``preferences`` (``prompt``, ``chosen``, ``rejected``). Columns ``id``, ``source``,
``answer`` and ``tools`` of a raw row are carried into conversations.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pt_core.errors import ConfigError, InputError
from pt_core.files import require_columns
from pt_data.tokenize import as_turns

KINDS = ("conversations", "prompts", "preferences")

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


class SkipRow(Exception):  # noqa: N818 (a signal, not an error)
    """Raised by a transform to drop a row and count it under ``reason`` (in the build's
    ``dropped`` counts), where returning None would count it only as ``transform``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Transform:
    name: str
    fn: Callable[..., Any]  # a row -> the transformed row (a dict), or None to drop it
    kind: str | None  # None: inferred from the first row it returns

    def options_accepted(self) -> list[str]:
        params = list(inspect.signature(self.fn).parameters.values())[1:]
        return [p.name for p in params if p.kind is not p.VAR_KEYWORD]

    def check_options(self, options: dict[str, Any]) -> None:
        params = inspect.signature(self.fn).parameters.values()
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return
        accepted = self.options_accepted()
        for key in options:
            if key not in accepted:
                close = difflib.get_close_matches(key, accepted, n=1)
                raise ConfigError(
                    f"transform {self.name!r} has no option {key!r}; it accepts: "
                    f"{', '.join(accepted) or 'no options'}",
                    hint=f"did you mean {close[0]!r}?" if close else None,
                )


_REGISTRY: dict[str, Transform] = {}


def register_transform(name: str, *, kind: str | None = None):
    """Register ``fn(row, **options)`` as transform ``name`` producing rows of ``kind``."""
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def decorate(fn):
        _REGISTRY[name] = Transform(name, fn, kind)
        return fn

    return decorate


def known_transforms() -> list[str]:
    return sorted(_REGISTRY)


def get_transform(name: str) -> Transform:
    """A registered transform, or ``package.module:function`` imported on the spot."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    if ":" in name:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConfigError(
                f"transform {name!r}: cannot import module {module_name!r} ({exc})",
                hint="make the module importable (installed, or on PYTHONPATH)",
            ) from None
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise ConfigError(f"transform {name!r}: {module_name} has no function {attr!r}")
        registered = next((t for t in _REGISTRY.values() if t.fn is fn), None)
        return registered or Transform(name, fn, None)
    close = difflib.get_close_matches(name, known_transforms(), n=1)
    raise ConfigError(
        f"unknown transform {name!r}; known transforms: {', '.join(known_transforms())}",
        hint=(f"did you mean {close[0]!r}? " if close else "")
        + "or name your own function as package.module:function",
    )


def infer_kind(row: dict) -> str:
    if "messages" in row:
        return "conversations"
    if "chosen" in row and "rejected" in row:
        return "preferences"
    if "prompt" in row:
        return "prompts"
    raise InputError(
        f"a transform returned a row with columns {', '.join(map(repr, row))}, which is none "
        "of the row schemas",
        hint="return 'messages' (conversations), 'prompt' (+ 'answer') for prompts, or "
        "'prompt'/'chosen'/'rejected' for preferences",
    )


# --------------------------------------------------------------------------- helpers


def last_boxed(text: object) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced; None
    where there is none (or ``text`` is not a string)."""
    if not isinstance(text, str):
        return None
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = text.find("{", start)
    if i < 0:
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def gsm8k_final(answer: str) -> str | None:
    """The number after GSM8K's ``####`` marker, commas removed."""
    if not isinstance(answer, str) or "####" not in answer:
        return None
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def gold_text(value: Any) -> str:
    """A gold answer as a string: 27.0 -> '27', ['3'] -> '3', ['1', '2'] -> '1, 2'."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return ", ".join(gold_text(v) for v in value)
    return str(value).strip()


def _carry(row: dict, out: dict, keys=("id", "source", "answer", "tools")) -> dict:
    for k in keys:
        if k in row and k not in out and row[k] is not None:
            out[k] = gold_text(row[k]) if k == "answer" else row[k]
    return out


def _with_instruction(problem: str, instruction: str | None) -> str:
    return f"{problem}\n{instruction}" if instruction else problem


def _system(system: str | None) -> list[dict]:
    return [{"role": "system", "content": system}] if system else []


# --------------------------------------------------------------------------- conversations

_ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "model": "assistant",
    "bot": "assistant",
    "chatgpt": "assistant",
    "system": "system",
    "tool": "tool",
    "function": "tool",
}


@register_transform("messages", kind="conversations")
def messages(row: dict, key: str = "messages") -> dict:
    """Rows that already hold ``messages`` (role/content); ``key`` names another column."""
    require_columns(row, [key], "messages transform")
    return _carry(row, {"messages": as_turns(row[key], "user", key)})


@register_transform("prompt_completion", kind="conversations")
def prompt_completion(row: dict, system: str | None = None) -> dict:
    """``prompt`` + ``completion`` (strings or message lists), as in TRL's format."""
    require_columns(row, ["prompt", "completion"], "prompt_completion transform")
    msgs = as_turns(row["prompt"], "user", "prompt") + as_turns(
        row["completion"], "assistant", "completion"
    )
    if system and msgs[0]["role"] != "system":
        msgs = _system(system) + msgs
    return _carry(row, {"messages": msgs})


@register_transform("alpaca", kind="conversations")
def alpaca(row: dict, system: str | None = None) -> dict:
    """``instruction`` (+ optional ``input``) -> user, ``output`` -> assistant."""
    require_columns(row, ["instruction", "output"], "alpaca transform")
    user = row["instruction"]
    if row.get("input"):
        user = f"{user}\n\n{row['input']}"
    msgs = [*_system(system), {"role": "user", "content": user}]
    msgs.append({"role": "assistant", "content": row["output"]})
    return _carry(row, {"messages": msgs})


@register_transform("sharegpt", kind="conversations")
def sharegpt(row: dict, key: str = "conversations") -> dict:
    """ShareGPT turns ``[{from: human|gpt|system, value}]``."""
    require_columns(row, [key], "sharegpt transform")
    msgs = []
    for i, turn in enumerate(row[key]):
        who = str(turn.get("from", "")).lower()
        if who not in _ROLE_ALIASES:
            raise InputError(
                f"sharegpt turn {i} has from={turn.get('from')!r}; expected one of "
                f"{', '.join(sorted(_ROLE_ALIASES))}"
            )
        msgs.append({"role": _ROLE_ALIASES[who], "content": turn.get("value")})
    return _carry(row, {"messages": msgs})


@register_transform("gsm8k", kind="conversations")
def gsm8k(row: dict, instruction: str | None = MATH_INSTRUCTION, system: str | None = None):
    """GSM8K: ``question`` -> user; ``answer`` (steps, then ``#### N``) -> a worked answer
    ending in ``\\boxed{N}``; ``answer`` column -> N. Calculator marks ``<<3*4=12>>`` go."""
    require_columns(row, ["question", "answer"], "gsm8k transform")
    final = gsm8k_final(row["answer"])
    if final is None:
        raise InputError("gsm8k row: 'answer' has no '#### <number>' line")
    steps = re.sub(r"<<[^>]*>>", "", row["answer"].rsplit("####", 1)[0]).strip()
    reply = f"{steps}\nThe final answer is \\boxed{{{final}}}."
    msgs = [
        *_system(system),
        {"role": "user", "content": _with_instruction(row["question"], instruction)},
    ]
    msgs.append({"role": "assistant", "content": reply})
    return _carry(row, {"messages": msgs, "answer": final})


@register_transform("math", kind="conversations")
def math(row: dict, instruction: str | None = MATH_INSTRUCTION, system: str | None = None):
    """MATH / NuminaMath: ``problem`` -> user (with the step-by-step instruction),
    ``solution`` -> assistant; ``answer`` is kept, or taken from the last ``\\boxed{}``."""
    require_columns(row, ["problem", "solution"], "math transform")
    answer = row.get("answer")
    if answer is None:
        answer = last_boxed(row["solution"])
    msgs = [
        *_system(system),
        {"role": "user", "content": _with_instruction(row["problem"], instruction)},
    ]
    msgs.append({"role": "assistant", "content": row["solution"]})
    out: dict[str, Any] = {"messages": msgs}
    if answer is not None:
        out["answer"] = gold_text(answer)
    return _carry(row, out)


register_transform("numina", kind="conversations")(math)


# --------------------------------------------------------------------------- preferences


@register_transform("preferences", kind="preferences")
def preferences(row: dict) -> dict:
    """``chosen``/``rejected`` (+ ``prompt``): answers, whole conversations or HH texts ->
    ``prompt`` messages and assistant ``chosen``/``rejected`` (see pt_data.preferences)."""
    from pt_data.preferences import normalize_preference_row

    out, reason = normalize_preference_row(row)
    if out is None:
        assert reason is not None  # a row it cannot normalize comes with the reason
        raise SkipRow(reason)
    return out


# --------------------------------------------------------------------------- prompts

_PROBLEM_KEYS = ("problem", "question", "prompt", "query", "instruction")
_GOLD_KEYS = ("answer", "final_answer", "gold", "gt", "expected_answer")
_ID_KEYS = ("id", "unique_id", "idx", "index", "problem_id")


@register_transform("math_prompts", kind="prompts")
def math_prompts(
    row: dict,
    instruction: str | None = MATH_INSTRUCTION,
    system: str | None = None,
    as_messages: bool = True,
    problem_key: str | None = None,
    answer_key: str | None = None,
) -> dict:
    """A math problem as a prompt for rollout or evaluation, with its gold ``answer``.

    The problem comes from ``problem``/``question``/``prompt`` (or ``problem_key``); the
    gold from ``answer``/``final_answer``/``gold``/``gt`` (or ``answer_key``), where a GSM8K
    ``#### N`` answer gives N; else the last ``\\boxed{}`` of ``solution``. Other columns
    are carried through.
    """
    key = problem_key or next((k for k in _PROBLEM_KEYS if k in row), None)
    if key is None or key not in row:
        require_columns(row, [problem_key or "problem"], "math_prompts transform")
    problem = row[key]
    gold_key, answer = _gold_column(row, answer_key, "math_prompts transform")
    if answer is None:
        answer = last_boxed(row.get("solution"))
    text = _with_instruction(problem, instruction)
    prompt: Any = [*_system(system), {"role": "user", "content": text}] if as_messages else text
    return _prompt_row(row, prompt, answer, consumed=(key, gold_key))


def _gold_column(row: dict, answer_key: str | None, where: str) -> tuple[str | None, Any]:
    """The gold answer's column and value: ``answer_key``, else the first of ``answer``,
    ``final_answer``, ``gold``, ``gt``, ``expected_answer``; a GSM8K ``#### N`` gives N."""
    if answer_key is not None:
        require_columns(row, [answer_key], where)
    gold_key = answer_key or next((k for k in _GOLD_KEYS if row.get(k) is not None), None)
    if gold_key is None:
        return None, None
    value = row[gold_key]
    return gold_key, gsm8k_final(value) if isinstance(value, str) and "####" in value else value


def _prompt_row(row: dict, prompt: Any, answer: Any, consumed: tuple) -> dict:
    """A prompts row: ``id`` (from the first id-like column), ``prompt``, ``answer``, and the
    row's other columns except those ``consumed``."""
    out: dict[str, Any] = {}
    id_key = next((k for k in _ID_KEYS if row.get(k) is not None), None)
    if id_key is not None:
        out["id"] = str(row[id_key])
    out["prompt"] = prompt
    out["answer"] = gold_text(answer) if answer is not None else None
    for k, v in row.items():
        if k not in out and k not in consumed:
            out[k] = v
    return out


@register_transform("conversation_prompts", kind="prompts")
def conversation_prompts(row: dict, key: str = "messages", answer_key: str | None = None) -> dict:
    """Conversations as prompts for generation and RL: the turns through the last user turn
    (the final assistant reply is dropped); gold ``answer`` from the row's answer column, else
    the last ``\\boxed{}`` of the dropped reply. Other columns are carried through."""
    require_columns(row, [key], "conversation_prompts transform")
    messages = as_turns(row[key], "user", key)
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise SkipRow("no_user_turn")
    prompt, dropped = messages[: users[-1] + 1], messages[users[-1] + 1 :]
    gold_key, answer = _gold_column(row, answer_key, "conversation_prompts transform")
    for message in reversed(dropped):
        if answer is not None:
            break
        if message["role"] == "assistant":
            answer = last_boxed(message["content"])
    return _prompt_row(row, prompt, answer, consumed=(key, gold_key))


@register_transform("prompts", kind="prompts")
def prompts(row: dict, key: str = "prompt", answer_key: str | None = "answer") -> dict:
    """Rows that are prompts already: ``prompt`` (string or messages), optional ``answer``."""
    require_columns(row, [key], "prompts transform")
    out = {k: v for k, v in row.items() if k not in (key,)}
    out["prompt"] = row[key]
    if answer_key and row.get(answer_key) is not None:
        out["answer"] = gold_text(row[answer_key])
    if "id" in out:
        out["id"] = str(out["id"])
    return out
