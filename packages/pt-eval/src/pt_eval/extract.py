"""Find the final answer in a model's response.

The answer is the last thing the response states as its answer: a ``\\boxed{...}`` (or
several boxes joined by "and", "or" or commas, as in ``x=\\boxed{1}`` or
``x=\\boxed{5}``), "the final answer is X", "the answer is therefore X", "Answer: X",
GSM8K's ``#### X``. A later statement replaces an earlier one, so a retracted answer is
not taken. A ``%`` or degree sign right after a box belongs to the answer.

When a response states nothing, a short response that is itself an answer (``\\frac12``,
``Evelyn``) is taken; a finished response is then searched for its last math span
(``$...$``, ``\\(...\\)``, ``\\[...\\]``) and, unless switched off, its last number. A
response that was cut off (finish_reason ``length``, an unclosed ``<think>``, or text
that stops mid-sentence) gets neither fallback unless ``last_number=True`` asks for it:
the last number of an unfinished computation is not an answer.

Only the text after the last ``</think>`` is searched, and nothing after an end-of-turn
token (``<|im_end|>``, ``<|im_start|>``, ``<|endoftext|>``...).

Every search is a fixed number of linear scans (no regex that can backtrack over the
whole text) and nothing here imports sympy, so extraction runs in the main process.
"""

from __future__ import annotations

import re

from pt_eval.normalize import undouble_escapes

SHORT_ANSWER_CHARS = 120
STATEMENT_WINDOW = 600  # characters after "the answer is" that may hold the answer
MAX_STATEMENTS = 50  # answer statements looked at, from the last one back
MAX_GAP_CHARS = 80  # text between two boxes that still joins them into one answer

_END_OF_TURN = re.compile(r"<\|(?:im_end|im_start|endoftext|eot_id|end_of_text|end)\|>|</s>")
_BOX_SCAN = re.compile(r"\\(?:boxed|fbox)[ \t]*\{|\\.|[{}]", re.DOTALL)
_BARE_BOX = re.compile(r"\\boxed +([^\s${}\\]+)")
_STATEMENT = re.compile(
    r"(?<![A-Za-z])(?:answers?|(?:correct|right|best)\s+(?:option|choice))(?:\*\*|__)?[ \t]*"
    r"(?:is|are|was|were|would be|will be|should be|becomes|:|=|：)(?![A-Za-z])"
    r"(?:[ \t]*(?:therefore|thus|then|simply|just|clearly|indeed|actually|now|still|finally|"
    r"given by|as follows|:|\*\*|__|,)(?![A-Za-z]))*[ \t]*",
    re.IGNORECASE,
)
_GSM8K = re.compile(r"(?<!#)####(?!#)[ \t]*([^\n]{1,200})")
_SENTENCE_END = re.compile(r"\.(?=\s|$)|[!?](?=\s|$)|;\s|\s-{1,2}\s")
_QUOTE = re.compile(r"^(?:\\?[\"`]|“)+")
_QUOTED = re.compile(r"(?:\\?[\"`]|“)(.*?)(?:\\?[\"`]|”)", re.DOTALL)
_INLINE_SPAN = re.compile(r"\$([^$\n]+)\$")
_LEADING_SPANS = re.compile(
    r"\$[^$\n]+\$(?:[ \t]*(?:,|and|or|\\text\{\s*(?:and|or)\s*\})[ \t]*\$[^$\n]+\$)+"
)
_HEAD_SPLIT = re.compile(
    r",\s+(?=(?:which|so|since|because|as|where|but|the|this|that|we|it|i\.e\.|namely|hence|"
    r"thus|therefore|giving|given)\b)|\s+(?:because|since|as it|where)\s+",
    re.IGNORECASE,
)
_COPULA = re.compile(r"\s(?:is|are|was|equals|equal to|=|be|becomes|gives)\s", re.IGNORECASE)
# "the answer is not ...", "I hope the answer is correct": judgements, not answers
_DENY_PHRASE = re.compile(
    r"(?:not|the following|as follows|below|above|shown|given)\b"
    r"|(?:correct|incorrect|wrong|right|unclear|unknown|valid|invalid)\W*\Z",
    re.IGNORECASE,
)
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_SPANS_INLINE = re.compile(r"\$[^$\n]*\$")
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\s*\{[^{}]*\}(?:\{[^{}]*\})?")
_CONNECTORS = {"and", "or"}
_GAP_NOISE = re.compile(
    r"\$+|\\[()\[\]]|\\q?quad(?![a-zA-Z])|\\[,;:! ]|~|&|"
    r"\\(?:text|textbf|textrm|textit|mathrm|mbox)\s*\{([^{}]*)\}"
)
_GAP_NAME = re.compile(
    r"\(?[A-Za-z](?:_\{?\w+\}?)?'*(?:\([a-z]\))?(?:\s*,\s*[A-Za-z](?:_\{?\w+\}?)?)*\)?\s*="
)
_GAP_DENY = {
    "so", "then", "thus", "hence", "therefore", "which", "because", "since", "but", "wait",
    "however", "giving", "gives", "get", "got", "where", "if", "not", "check", "is", "are",
    "was", "the", "final", "answer", "correct", "wrong", "no", "yes",
}  # fmt: skip
_AFTER_BOX = re.compile(r"[ \t]*(\\%|%|\^\s*\{?\s*\\circ\s*\}?|°|\\text\s*\{\s*(?:\\%|%)\s*\})")
_UNIT_AFTER_BOX = re.compile(
    r"[ \t]*\\(?:text|mathrm|mbox|textrm)\s*\{\s*([A-Za-z ]{1,30}?)\s*\}(\^\s*\{?\d\}?)?"
)
_NOT_A_UNIT = {"and", "or", "is", "are", "the", "of", "for", "so", "which", "where", "to", "as",
               "with", "when", "if", "then", "thus", "hence", "a", "an", "answer", "final"}  # fmt: skip
_SPAN_TOKEN = re.compile(r"\\\$|\$\$|\$|\\\(|\\\)|\\\[|\\\]|\n")
_NUMBER = re.compile(
    r"(?<![\w.,])(-?(?:\d+,\d{1,2}(?![\d,])|\d{1,3}(?:,\d{3})+(?!\d)|\d{1,3}(?: \d{3})+(?!\d)|\d+)"
    r"(?:\.\d+)?(?:/\d+)?|-?\.\d+)([ \t]?\\?%)?"
)
_EXPLICIT_THOUSANDS = re.compile(r"(?<=\d)\s*(?:\{\s*,\s*\}|,\\!\s*|,\\,\s*)(?=\d{3}(?!\d))")
_UNFINISHED_END = re.compile(r"[A-Za-z0-9,(+\-=*/^_{\\&]\Z")


def extract_answer(
    text: str, *, last_number: bool | None = None, truncated: bool | None = None
) -> str | None:
    """The final answer in ``text`` as a string, or None when there is none.

    ``last_number``: None (default) falls back to the last math span and the last number
    of a finished response only; True also for a cut-off one; False never to a number.
    ``truncated``: True when the response is known to be cut off (finish_reason length).
    """
    if not isinstance(text, str) or not text.strip():
        return None
    text = undouble_escapes(text)
    end = _END_OF_TURN.search(text)
    if end is not None:
        text = text[: end.start()]
    end_think = text.rfind("</think>")
    if end_think >= 0:
        text = text[end_think + len("</think>") :]
    elif "<think>" in text:
        truncated = True  # still thinking when it stopped
    stated = stated_answer(text)
    if stated is not None:
        return stated
    stripped = text.strip()
    if len(stripped) <= SHORT_ANSWER_CHARS and "\n" not in stripped:
        short = _trim(stripped)
        if short and looks_like_answer(short):
            return short
    if last_number is not True and (truncated or not finished(text)):
        return None
    # the last math span, or the last number when it comes after that span
    text = _EXPLICIT_THOUSANDS.sub("", text)
    span, span_end = _last_span(text)
    if last_number is not False:
        number, number_start = _last_number(text)
        if number is not None and number_start >= span_end:
            return number
    return span


def finished(text: str) -> bool:
    """The response ends as a statement ends, not in the middle of a word or formula."""
    if text.rstrip().endswith(("**", "__")):
        return True  # a bold last line: "The total is **18**"
    tail = text.rstrip().rstrip("*_\"'` \t\n")
    return bool(tail) and _UNFINISHED_END.search(tail) is None


# --------------------------------------------------------------------------- statements


def stated_answer(text: str) -> str | None:
    """The last answer the text states: a box group, an answer sentence, or ``#### X``."""
    best: tuple[int, str] | None = None  # (position, answer) of the last math-like statement
    words: tuple[int, str] | None = None  # the last statement that is only a word
    boxes = find_boxes(text)
    after = 0  # only a statement after the last box can replace it
    if boxes:
        best = (boxes[-1][0], box_group_answer(text, boxes))
        after = boxes[-1][0]
    # the last statements first: the first math-like one found is the answer
    statements = list(_STATEMENT.finditer(text, after))[-MAX_STATEMENTS:]
    for m in reversed(statements):
        phrase = answer_phrase(text[m.end() : m.end() + STATEMENT_WINDOW])
        if phrase is None:
            continue
        if _is_math_like(phrase):
            best = (m.start(), phrase)
            break
        if words is None:
            words = (m.start(), phrase)
    for m in reversed(list(_GSM8K.finditer(text, after))[-MAX_STATEMENTS:]):
        if best is not None and m.start() < best[0]:
            break
        phrase = answer_phrase(m.group(1))
        if phrase is not None and _is_math_like(phrase):
            best = (m.start(), phrase)
            break
    if best is not None:
        return best[1]
    return words[1] if words is not None else None


def answer_phrase(rest: str) -> str | None:
    """What follows "the answer is": a math span, a choice, or the clause that states it."""
    s = rest.lstrip(" \t*_:")
    if not s.strip():
        return None
    if not s.split("\n", 1)[0].strip():  # "The answer is:\n\n42"
        s = s.lstrip()
    s = _QUOTE.sub("", s, count=1)
    spans = _LEADING_SPANS.match(s)
    if spans is not None and "$" in spans.group(0):  # "$12$ and $13$"
        parts = [m.group(1) for m in _INLINE_SPAN.finditer(spans.group(0))]
        return ", ".join(_trim(p) for p in parts if _trim(p)) or None
    span = _leading_span(s)
    if span is not None:
        return _trim(span) or None
    if s.startswith(("\\boxed", "\\fbox")):
        return None  # the box itself is a later candidate
    line = s.split("\n", 1)[0]
    clause = _SENTENCE_END.split(line, maxsplit=1)[0].strip().strip("*_").strip()
    if not clause or _DENY_PHRASE.match(clause):
        return None
    head = _HEAD_SPLIT.split(clause, maxsplit=1)[0].strip()
    if len(prose_words(head)) <= 1:
        return _trim(head) or None
    # a sentence that restates the answer: "The largest $n$ is 34", "... 3 hours ago"
    copulas = list(_COPULA.finditer(_SPANS_INLINE.sub(lambda m: "_" * len(m.group(0)), clause)))
    if copulas:
        tail = clause[copulas[-1].end() :].strip()
        span = _leading_span(tail)
        if span is not None:
            return _trim(span) or None
        if tail and len(prose_words(tail)) <= 1:
            return _trim(tail)
    span = last_math_span(clause)
    if span is not None:
        return span
    number = last_number_in(clause)
    return number if number is not None else _trim(clause)


def _leading_span(s: str) -> str | None:
    for opener, closer in (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")):
        if s.startswith(opener):
            close = s.find(closer, len(opener))
            if close > len(opener):
                content = s[len(opener) : close]
                if opener in ("$", "\\(") and "\n" in content:
                    return None
                return content
            return None
    return None


def _is_math_like(answer: str) -> bool:
    """An answer with a digit, a formula or a choice letter, as opposed to a word."""
    return bool(re.search(r"[\d\\^=+\-/()]", answer)) or bool(
        re.fullmatch(r"\(?[A-Ea-e]\)?", answer.strip())
    )


def prose_words(s: str) -> list[str]:
    """Words of two letters or more outside math spans, command names and environment
    names, "and"/"or" aside."""
    s = _ENVIRONMENT.sub(" ", _SPANS_INLINE.sub(" ", s))
    return [w for w in _PROSE_WORD.findall(s) if w.lower() not in _CONNECTORS]


def looks_like_answer(s: str) -> bool:
    """A short text that is an answer on its own: a formula, a number with a unit, or a
    single word (``Evelyn``); not a sentence such as "No idea"."""
    words = prose_words(s)
    if not words:
        return True
    if len(words) == 1 and not re.search(r"\d", s):
        return True
    # a number and a unit: "12 apples", "5 \text{ square units}", "28 percent"
    return bool(re.fullmatch(r"[^A-Za-z]*\d[^A-Za-z]*(?:\\text\s*\{)?\s*[A-Za-z ]+\}?[\s.^\d]*", s))


# --------------------------------------------------------------------------- boxes


def find_boxes(text: str) -> list[tuple[int, int, str]]:
    """Every complete top-level ``\\boxed{...}`` / ``\\fbox{...}`` as (start, end, content),
    in order; escaped braces do not count, a box cut off by the end of the text is left out."""
    boxes: list[tuple[int, int, str]] = []
    first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first < 0:
        return boxes
    stack: list[tuple[bool, int, int]] = []  # (opens a box, box start, content start)
    open_boxes = 0
    for m in _BOX_SCAN.finditer(text, first):
        token = m.group(0)
        if token == "{":
            stack.append((False, 0, 0))
        elif token == "}":
            if not stack:
                continue
            is_box, start, content_start = stack.pop()
            if is_box:
                open_boxes -= 1
                content = text[content_start : m.start()].strip()
                if open_boxes == 0 and content:
                    boxes.append((start, m.end(), content))
        elif len(token) > 2:  # \boxed{ (an escape such as \{ is two characters)
            stack.append((True, m.start(), m.end()))
            open_boxes += 1
    if "\\boxed " in text:
        for m in _BARE_BOX.finditer(text):
            boxes.append((m.start(), m.end(), m.group(1)))
        boxes.sort()
    return boxes


def last_boxed(text: str) -> str | None:
    """The content of the last complete box in ``text``."""
    boxes = find_boxes(text)
    return boxes[-1][2] if boxes else None


def box_group_answer(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The last box, with the boxes before it that join it into one answer
    (``\\boxed{2}`` and ``\\boxed{3}``), and a ``%`` or degree sign written after it."""
    group = [boxes[-1]]
    for previous in reversed(boxes[:-1]):
        if not _joins(text[previous[1] : group[0][0]]):
            break
        group.insert(0, previous)
    answer = ", ".join(_unbox(content) for _, _, content in group)
    after = _AFTER_BOX.match(text, boxes[-1][1])
    if after is not None and len(group) == 1:
        mark = after.group(1)
        answer += "\\%" if "%" in mark else "^\\circ"
    unit = _UNIT_AFTER_BOX.match(text, boxes[-1][1])
    if unit is not None and len(group) == 1 and after is None:
        words = unit.group(1).split()
        if len(words) <= 2 and not any(w.lower() in _NOT_A_UNIT for w in words):
            # \boxed{5}\text{ cm}: the unit counts
            answer += f" \\text{{ {' '.join(words)}}}" + (unit.group(2) or "")
    return answer


def _unbox(content: str) -> str:
    inner = find_boxes(content)
    if len(inner) == 1 and inner[0][0] == 0 and inner[0][1] == len(content):
        return inner[0][2]
    return content


def _joins(gap: str) -> bool:
    """Does the text between two boxes join them into one answer ("and", "or", a comma)?"""
    if len(gap) > MAX_GAP_CHARS or "\n" in gap.strip(" \t$\\[]"):
        return False
    rest = _GAP_NOISE.sub(lambda m: " " + (m.group(1) or "") + " ", gap)
    rest = _GAP_NAME.sub(" ", rest)
    words = re.findall(r"[A-Za-z]+", rest)
    symbols = re.sub(r"[A-Za-z\s]+|\([a-z]\)", "", rest)
    if not words and not symbols.replace(",", "").replace(";", "").strip():
        return True  # boxes side by side, or separated by commas
    if re.search(r"[=+*/^<>|-]", symbols):
        return False
    if any(w.lower() in _GAP_DENY for w in words):
        return False
    connected = any(c in symbols for c in ",;") or any(w.lower() in _CONNECTORS for w in words)
    others = [w for w in words if w.lower() not in _CONNECTORS]
    return connected and len(others) <= 4 and "." not in symbols


# --------------------------------------------------------------------------- fallbacks


def last_math_span(text: str) -> str | None:
    """The content of the last ``$...$``, ``$$...$$``, ``\\(...\\)`` or ``\\[...\\]`` span.

    An inline span stays on one line; a ``$`` that opens a span of prose ("$10 and gets $")
    is a currency sign, not math, and the next ``$`` opens instead.
    """
    return _last_span(text)[0]


def _last_span(text: str) -> tuple[str | None, int]:
    last: tuple[str | None, int] = (None, -1)
    opener: str | None = None
    start = 0
    for m in _SPAN_TOKEN.finditer(text):
        token = m.group(0)
        if token == "\\$":
            continue
        if token == "\n":
            if opener in ("$", "\\("):
                opener = None
            continue
        if opener is None:
            if token in ("$", "$$", "\\(", "\\["):
                opener, start = token, m.end()
            continue
        closes = {"$": "$", "$$": "$$", "\\(": "\\)", "\\[": "\\]"}[opener]
        if token != closes:
            if opener == "$" and token == "$$":  # "$x$$y$": two spans side by side
                last = _span(text[start : m.start()], m.start(), last)
                opener, start = "$", m.end()
            continue
        content = text[start : m.start()]
        if opener == "$" and _currency_like(content):
            start = m.end()  # this "$" opens the next span instead
            continue
        last = _span(content, m.end(), last)
        opener = None
    return last


def _span(content: str, end: int, previous: tuple) -> tuple[str | None, int]:
    if not content.strip():
        return previous
    trimmed = _trim(content)
    return (trimmed, end) if trimmed else previous


def _currency_like(content: str) -> bool:
    return bool(content) and (
        (content[0].isdigit() and content[-1].isspace()) or len(prose_words(content)) >= 2
    )


def last_number_in(text: str) -> str | None:
    return _last_number(_EXPLICIT_THOUSANDS.sub("", text))[0]


def _last_number(text: str) -> tuple[str | None, int]:
    found = None
    for match in _NUMBER.finditer(text):
        found = match
    if found is None:
        return None, -1
    number = found.group(1)
    percent = "\\%" if found.group(2) else ""  # 3.5% keeps its percent sign
    if re.fullmatch(r"-?\d+,\d{1,2}", number):
        return number.replace(",", ".") + percent, found.start()  # 2,74: a decimal comma
    return number.replace(",", "").replace(" ", "") + percent, found.start()


def _trim(answer: str) -> str:
    answer = answer.strip()
    for _ in range(3):
        answer = answer.strip().rstrip(".").strip().strip("*").strip()
        quoted = _QUOTED.fullmatch(answer)
        if quoted is not None:
            answer = quoted.group(1)
        if len(answer) >= 2 and answer[0] == "$" and answer[-1] == "$":
            answer = answer.strip("$")
        for opener, closer in (("\\(", "\\)"), ("\\[", "\\]")):
            if answer.startswith(opener) and answer.endswith(closer):
                answer = answer[2:-2]
        answer = _unbox(answer.strip())
    return answer.strip()


# --------------------------------------------------------------------------- gold


def gold_answer(value) -> str | None:
    """A gold answer column as a string: numbers written plainly, lists joined, and the
    stated answer of a solution text (its boxes, ``####``, "the final answer is") taken out."""
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
    text = undouble_escapes(str(value).strip())
    if not text:
        return None
    boxes = find_boxes(text)
    if boxes:
        return box_group_answer(text, boxes)
    if "####" in text or len(text) > SHORT_ANSWER_CHARS or "\n" in text:
        stated = stated_answer(text)
        if stated is not None:
            return stated
    return _trim(text)
