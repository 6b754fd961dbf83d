"""Find the final answer in a model's response.

In order of trust: the last ``\\boxed{...}`` (nested braces, ``\\boxed 5``,
``\\fbox{}``); Minerva's "final answer is $X$. I hope"; "the answer is X";
GSM8K's ``#### N``; a multiple-choice letter ("Answer: (C)"); a short response
that is itself an answer; and, unless switched off, the last number.

When the response contains ``</think>``, only the text after the last one is
searched: what a reasoning model thinks is not its answer.

Every search is linear in the length of the response (no regex that can
backtrack over the whole text), so a 5 MB response costs milliseconds.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_FINAL_ANSWER = re.compile(r"final answer is[:\s]*\$([^$]{1,2000})\$", re.IGNORECASE)
_ANSWER_IS = re.compile(
    r"(?:the|my|final)\s+answer\s*(?:is|:|=)\s*:?\s*([^\n]{1,500})", re.IGNORECASE
)
_ANSWER_LINE = re.compile(r"(?:^|\n)\s*\**answer\**\s*[:：]\s*([^\n]{1,500})", re.IGNORECASE)
_GSM8K = re.compile(r"####\s*([^\n]{1,200})")
_CHOICE = re.compile(r"^\(?([A-E])\)?(?:[.:)]|\s|$)")
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_NUMBER_GROUP = re.compile(f"({_NUMBER.pattern})")
_BRACE_OR_ESCAPE = re.compile(r"\\.|[{}]", re.DOTALL)  # \{ and \} are not braces
_BARE_ARGUMENT = re.compile(r"[^\s$]*")
SHORT_ANSWER_CHARS = 120
MAX_BOX_TRIES = 20  # unfinished boxes looked at from the end before giving up


def extract_answer(text: str, *, last_number: bool = True) -> str | None:
    """The final answer in ``text`` as a string, or None when there is none."""
    if not isinstance(text, str) or not text.strip():
        return None
    end_think = text.rfind("</think>")
    if end_think >= 0:
        text = text[end_think + len("</think>") :]
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    for found in (_last_match(_FINAL_ANSWER, text), _last_match(_GSM8K, text)):
        if found:
            return _trim(found)
    for pattern in (_ANSWER_IS, _ANSWER_LINE):
        found = _last_match(pattern, text)
        if found:
            answer = _answer_phrase(found)
            if answer:
                return answer
    stripped = text.strip()
    if len(stripped) <= SHORT_ANSWER_CHARS and "\n" not in stripped and _is_answer(stripped):
        return _trim(stripped)
    if last_number:
        number = _last_match(_NUMBER_GROUP, text)
        if number:
            return number.replace(",", "")
    return None


def last_boxed(text: str) -> str | None:
    """The content of the last complete ``\\boxed{...}`` or ``\\fbox{...}`` in ``text``."""
    end = len(text)
    for _ in range(MAX_BOX_TRIES):
        start = max(text.rfind(cmd, 0, end) for cmd in _BOX_COMMANDS)
        if start < 0:
            return None
        content = _box_content(text, start)
        if content is not None and content.strip():
            return content.strip()
        end = start
    return None


def _box_content(text: str, start: int) -> str | None:
    i = text.index("\\", start) + 1
    while i < len(text) and text[i].isalpha():
        i += 1
    if i < len(text) and text[i] == " " and i + 1 < len(text) and text[i + 1] != "{":
        # \boxed 5: the argument runs to the next space or dollar
        return _BARE_ARGUMENT.match(text, i + 1).group(0)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for m in _BRACE_OR_ESCAPE.finditer(text, i):
        c = m.group(0)
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : m.start()]
    return None  # the response was cut off inside the box


def _last_match(pattern: re.Pattern, text: str) -> str | None:
    found = None
    for m in pattern.finditer(text):
        found = m.group(1)
    return found


def _trim(answer: str) -> str:
    answer = answer.strip()
    for _ in range(3):
        answer = answer.strip().rstrip(".").strip()
        if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
            answer = answer.strip("$")
        if answer.startswith("\\(") and answer.endswith("\\)"):
            answer = answer[2:-2]
        if answer.startswith("\\[") and answer.endswith("\\]"):
            answer = answer[2:-2]
    return answer.strip()


def _answer_phrase(found: str) -> str | None:
    """What follows "the answer is": a $...$ span, a choice letter, or the clause up to a period."""
    found = found.strip().lstrip("*").strip()
    if found.startswith("$"):
        close = found.find("$", 1)
        if close > 1:
            return _trim(found[1:close])
    if found.startswith("\\(") and "\\)" in found:
        return _trim(found[2 : found.index("\\)")])
    choice = _CHOICE.match(found)
    if choice:
        return choice.group(1)
    clause = re.split(r"\.(?:\s|$)|,\s+(?:so|which|because|since)\b", found, maxsplit=1)[0]
    clause = clause.rstrip("*").strip()
    return _trim(clause) or None


def _is_answer(text: str) -> bool:
    """A short response that parses as an answer on its own (a bare ``\\frac{1}{2}``, a
    single word like ``Evelyn``; a sentence such as "No idea." is not an answer)."""
    from pt_eval.parse import ParseError, Text, TooLarge, parse_answer  # sympy: workers only

    text = _trim(text)
    try:
        value = parse_answer(text)
    except (ParseError, TooLarge):
        return False
    return not (isinstance(value, Text) and " " in text.strip())


def gold_answer(value) -> str | None:
    """A gold answer column as a string: numbers written plainly, lists joined, and a
    ``\\boxed{}`` or ``####`` inside a solution text taken out."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, list | tuple):
        parts = [gold_answer(v) for v in value]
        return ", ".join(p for p in parts if p)
    text = str(value).strip()
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    gsm = _last_match(_GSM8K, text)
    if gsm is not None:
        return _trim(gsm)
    return _trim(text)
