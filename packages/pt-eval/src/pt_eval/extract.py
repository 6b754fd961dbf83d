"""Find the final answer in a model's response.

The answer is the last thing the response states as its answer: a ``\\boxed{...}`` (or
several boxes joined by "and", "or" or commas, as in ``x=\\boxed{1}`` or
``x=\\boxed{5}``), "the final answer is X", "the answer is therefore X", "Answer: X",
GSM8K's ``#### X``, a "Final Answer" heading, and the usual markers in Chinese, Japanese,
Russian, Spanish, German and French. A later statement replaces an earlier one, so a
retracted answer is not taken, nor a box the text rejects (``\\boxed{5}, not \\boxed{6}``)
or denies (``\\boxed{15} is not it``). A ``%`` or degree sign right after a box belongs to
the answer.

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

from pt_eval.normalize import squash, undouble_escapes

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
# after a box, "so the only solution is $x = 5$" retracts it (before any box it may be one
# case of several: "if x = 1, the only solution is ...")
_RETRACTION = re.compile(
    r"(?<![A-Za-z])(?:only|unique|sole|valid)\s+(?:real\s+|possible\s+)?(?:solutions?|values?)"
    r"[ \t]*(?:is|are|=|:)(?![A-Za-z])[ \t]*",
    re.IGNORECASE,
)
# a "Final Answer" heading with the answer on the lines below: "**Final Answer**\n\n14"
_HEADING = re.compile(
    r"(?im)^[ \t]*(?:#{1,6}[ \t]*)?(?:\*\*|__)?[ \t]*final[ \t]+answer[ \t]*:?[ \t]*"
    r"(?:\*\*|__)?[ \t]*:?[ \t]*(?=\n)"
)
# answer markers in other languages: Chinese, Japanese, Russian, Spanish, German, French
_FOREIGN_STATEMENT = re.compile(
    r"(?:最终答案|最后答案|答案|答え|正解|解答)[ \t]*(?:是|为|為|は|:|：)[ \t]*"
    r"|(?:故|所以|因此|因而|从而|從而|则|則)[ \t，,]*(?:应)?选(?:择|擇)?[ \t]*[:：]?[ \t]*"
    r"|(?<![^\W\d_])(?:правильный[ \t]+|окончательный[ \t]+)?ответ"
    r"[ \t]*(?:—|–|-|:|：|будет|равен)[ \t]*"
    r"|(?<![^\W\d_])respuesta(?:[ \t]+(?:correcta|final))?[ \t]*(?:es|será|:)"
    r"(?:[ \t]+(?:la|el)(?![^\W\d_]))?[ \t]*"
    r"|(?<![^\W\d_])(?:richtige[ \t]+|endgültige[ \t]+)?antwort[ \t]*(?:ist|lautet|:)[ \t]*"
    r"|(?<![^\W\d_])ist[ \t]+die[ \t]+(?:richtige[ \t]+)?antwort[ \t]*:?[ \t]*"
    r"|(?<![^\W\d_])réponse(?:[ \t]+(?:finale|correcte))?[ \t]*(?:est|:)"
    r"(?:[ \t]+la(?![^\W\d_]))?[ \t]*",
    re.IGNORECASE,
)
# letters of scripts whose words are prose, never a formula (Greek letters are math)
_NON_LATIN_WORD = re.compile(
    "[\u0400-\u04ff\u0590-\u06ff\u0e00-\u0e7f\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]"
)
_GSM8K = re.compile(r"(?<!#)####(?!#)[ \t]*([^\n]{1,200})")
_SENTENCE_END = re.compile(r"\.(?=\s|$)|[!?](?=\s|$)|;\s|\s-{1,2}\s|[。！？；，、]")
_QUOTE = re.compile(r"^(?:\\?[\"`]|“)+")
_QUOTED = re.compile(r"(?:\\?[\"`]|“)(.*?)(?:\\?[\"`]|”)", re.DOTALL)
_INLINE_SPAN = re.compile(r"\$([^$\n]+)\$")
_LEADING_SPANS = re.compile(
    r"\$[^$\n]+\$(?:[ \t]*(?:,|and|or|\\text\{\s*(?:and|or)\s*\})[ \t]*\$[^$\n]+\$)+"
)
_HEAD_SPLIT = re.compile(
    r",\s+(?=(?:which|so|since|because|as|where|but|the|this|that|we|it|i\.e\.|namely|hence|"
    r"thus|therefore|giving|given|not)\b)|\s+(?:because|since|as it|where|rather than|instead of|not)\s+"
    r"|\s*\((?=\s*(?:not|rather than|instead of)\b)",
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
# a response that ends like this stopped mid-word or mid-formula; a bare number at the end
# ("... 6 + 8 = 14") is a finished statement
_UNFINISHED_END = re.compile(r"[A-Za-z,(+\-=*/^_{\\&]\Z")


def extract_answer(
    text: str, *, last_number: bool | None = None, truncated: bool | None = None
) -> str | None:
    """The final answer in ``text`` as a string, or None when there is none.

    ``last_number``: None (default) falls back to the last math span and the last number
    of a finished response only; True also for a cut-off one; False never to a number.
    ``truncated``: True when the response is known to be cut off (finish_reason length),
    False when it is known to have finished (finish_reason stop): then its text is not
    judged; None (unknown) judges it by how it ends (:func:`finished`).
    """
    return extract_with_source(text, last_number=last_number, truncated=truncated)[0]


def extract_with_source(
    text: str, *, last_number: bool | None = None, truncated: bool | None = None
) -> tuple[str | None, str | None]:
    """``(answer, source)``: source is "stated" (a box or an answer sentence), "short"
    (the whole response is the answer), "fallback" (the last math span or number) or
    None (no answer)."""
    if not isinstance(text, str) or not text.strip():
        return None, None
    final = final_text(text)
    if final is None:
        return None, None
    text = blank_denied_boxes(final)
    think_open = "<think>" in text and "</think>" not in text
    if think_open:
        truncated = True  # still thinking when it stopped
    stated = stated_answer(text)
    if stated is not None:
        return stated, "stated"
    stripped = text.strip()
    if len(stripped) <= SHORT_ANSWER_CHARS and "\n" not in stripped:
        short = _trim(stripped)
        if short and looks_like_answer(short):
            return short, "short"
    if last_number is not True and (truncated or (truncated is None and not finished(text))):
        return None, None
    # the last math span, or the last number when it comes after that span
    text = _EXPLICIT_THOUSANDS.sub("", text)
    span, span_end = _last_span(text)
    if last_number is not False:
        number, number_start = _last_number(text)
        if number is not None and number_start >= span_end:
            expression = latex_around(text, number_start)
            if expression is not None:  # x = \frac{3}{4}: the fraction, never its 4
                return (expression or None), ("fallback" if expression else None)
            return number, "fallback"
    return span, ("fallback" if span is not None else None)


def final_text(text: str) -> str | None:
    """The part of a response that may state its answer: after the last ``</think>``,
    before an end-of-turn token, NULs read as spaces."""
    if "\x00" in text:
        text = text.replace("\x00", " ")
    text = undouble_escapes(text)
    end = _END_OF_TURN.search(text)
    if end is not None:
        text = text[: end.start()]
    end_think = text.rfind("</think>")
    if end_think >= 0:
        text = text[end_think + len("</think>") :]
    return text if text.strip() else None


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
    boxes = _drop_rejected(text, find_boxes(text))
    after = 0  # only a statement after the last box can replace it
    if boxes:
        best = (boxes[-1][0], box_group_answer(text, boxes))
        after = boxes[-1][0]
    # the last statements first: the first math-like one found is the answer
    statements = list(_STATEMENT.finditer(text, after))[-MAX_STATEMENTS:]
    if boxes:
        statements += list(_RETRACTION.finditer(text, after))[-MAX_STATEMENTS:]
    if "\n" in text:
        statements += list(_HEADING.finditer(text, after))[-MAX_STATEMENTS:]
    statements += list(_FOREIGN_STATEMENT.finditer(text, after))[-MAX_STATEMENTS:]
    statements.sort(key=lambda m: m.start())
    for m in reversed(statements[-MAX_STATEMENTS:]):
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
    if not line.isascii():  # 12 です, (B) を選ぶ: the answer ends where the prose resumes
        clause = _NON_LATIN_WORD.split(clause, maxsplit=1)[0].strip()
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
            while opener == "$" and close > 0 and s[close - 1] == "\\":
                close = s.find(closer, close + 1)  # $\$4.25$: an escaped dollar is inside
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
    if not s.isascii() and _NON_LATIN_WORD.search(s):
        return False  # "我不知道", "Я не знаю": a sentence, not an answer
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
    contents: dict[str, str] = {}  # one answer boxed twice is one answer, not a list of two
    for _, _, content in group:
        content = _box_content(_unbox(content))
        contents.setdefault(squash(content), content)
    answer = ", ".join(contents.values())
    single = len(contents) == 1
    after = _AFTER_BOX.match(text, boxes[-1][1])
    if after is not None and single:
        mark = after.group(1)
        answer += "\\%" if "%" in mark else "^\\circ"
    unit = _UNIT_AFTER_BOX.match(text, boxes[-1][1])
    if unit is not None and single and after is None:
        words = unit.group(1).split()
        if len(words) <= 2 and not any(w.lower() in _NOT_A_UNIT for w in words):
            # \boxed{5}\text{ cm}: the unit counts
            answer += f" \\text{{ {' '.join(words)}}}" + (unit.group(2) or "")
    return answer


_TEXT_LEAD = re.compile(r"\\(?:text|textbf|textrm|textit|mbox)\s*\{([^{}]*)\}\s*")
_YES_NO = re.compile(r"(yes|no)\b\s*[,.;:!\-–—]", re.IGNORECASE)
_REJECTION = re.compile(
    r"[\s$(\[,;]*(?:\\\(|\\\[)?[\s$(]*(?:not|rather than|instead of|but not|and not)\b[^.\n]{0,20}\Z",
    re.IGNORECASE,
)


# "\\boxed{15} is not it", "\\boxed{15} is wrong": the text denies the box it just wrote
_DENIED = re.compile(
    r"[ \t$)\]]*(?:\\[)\]])?[ \t$]*(?:"
    r"(?:is|was)(?:[ \t]+not|n't)[ \t]+(?:it|right|correct|valid|possible"
    r"|the[ \t]+(?:(?:right|correct|final)[ \t]+)?answer)"
    r"|(?:is|was)[ \t]+(?:wrong|incorrect|invalid)"
    r"|(?:does[ \t]+not|doesn't)[ \t]+work"
    r")(?![A-Za-z])",
    re.IGNORECASE,
)


def blank_denied_boxes(text: str) -> str:
    """``text`` with every box that the words right after it deny (``\\boxed{15} is not
    it``) blanked out (the same length), so that neither a statement nor a fallback takes it."""
    pieces, last = [], 0
    for start, end, _ in find_boxes(text):
        if _DENIED.match(text, end):
            pieces += [text[last:start], " " * (end - start)]
            last = end
    return "".join(pieces) + text[last:] if pieces else text


def _box_content(content: str) -> str:
    """A box holding prose: ``\\text{so the total is } 9`` is 9; ``\\text{Yes, such a set
    exists}`` is Yes. Anything else is kept as it is."""
    if "\\text" not in content and "\\mbox" not in content:
        return content
    lead = _TEXT_LEAD.match(content)
    if lead is None:
        return content
    rest = content[lead.end() :].strip()
    words = prose_words(lead.group(1))
    if rest and len(words) >= 2 and not prose_words(rest):
        return rest  # \text{so the total is } 9
    if not rest:
        yes_no = _YES_NO.match(lead.group(1).strip())
        if yes_no is not None and len(words) >= 3:
            return yes_no.group(1)  # \text{Yes, such a set exists}
    return content


def _drop_rejected(text: str, boxes: list) -> list:
    """Boxes written as rejected right after another box: ``\\boxed{12}`` (not
    ``\\boxed{15}``, ...)."""
    if len(boxes) < 2:
        return boxes
    kept = [boxes[0]]
    for box in boxes[1:]:
        gap = text[kept[-1][1] : box[0]]
        if len(gap) <= 40 and _REJECTION.match(gap):
            continue
        kept.append(box)
    return kept


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


_MATH_END = re.compile(r"\\end\s*\{|\\\]|\\\)|\$|&|\\\\|\\(?:quad|qquad)(?![a-zA-Z])")
_MATH_START = re.compile(r"\A(?:\$+|\\\(|\\\[)")
_UNIT_WORD = re.compile(r"\\(?:mathrm|text|mbox|textrm|rm)\s*\{")
_MODULUS = re.compile(r"\\(?:pmod|bmod|mod)(?![a-zA-Z])")
_LATEX_OPERATOR = re.compile(r"[+\-*/]|\\(?:cdot|times|pm|mp|div)")
_LATEX_MARK = re.compile(r"[\\^_{}]")
_LINE_BREAK = re.compile(r"\n|(?<=[.!?])\s")


def latex_around(text: str, start: int) -> str | None:
    """When the number at ``start`` is part of a LaTeX expression (``\\frac{3}{4}``,
    ``\\sqrt{2}``, ``2^{10}``), that whole expression; "" when it cannot be read out;
    None when the number stands on its own."""
    line_start = max(text.rfind("\n", 0, start), 0)
    line_end = text.find("\n", start)
    line_end = len(text) if line_end < 0 else line_end
    line = text[line_start:line_end]
    at = start - line_start
    # words of the line, a brace group never split: "\frac{3}{4}." is one word
    words: list[tuple[int, int]] = []
    depth, begin = 0, None
    for i, c in enumerate(line):
        if c == "{" and line[i - 1 : i] != "\\":
            depth += 1
        elif c == "}" and line[i - 1 : i] != "\\":
            depth = max(0, depth - 1)
        if c.isspace() and depth == 0:
            if begin is not None:
                words.append((begin, i))
                begin = None
        elif begin is None:
            begin = i
    if begin is not None:
        words.append((begin, len(line)))
    index = next((k for k, (a, b) in enumerate(words) if a <= at < b), None)
    if index is None:
        return None
    word = line[words[index][0] : words[index][1]]
    if not _LATEX_MARK.search(word):
        return None
    first = last = index
    # a unit with a power after its number: 0.53 \mathrm{yr}^{-1}
    if (
        first >= 1
        and _UNIT_WORD.match(line[slice(*words[first])])
        and _is_operand(line[slice(*words[first - 1])])
    ):
        first -= 1
    # joined by operators: 3 + \sqrt{2}, 2 \cdot 3^{4}
    while (
        first >= 2
        and _LATEX_OPERATOR.fullmatch(line[slice(*words[first - 1])])
        and (_is_operand(line[slice(*words[first - 2])]))
    ):
        first -= 2
    while (
        last + 2 < len(words)
        and _LATEX_OPERATOR.fullmatch(line[slice(*words[last + 1])])
        and (_is_operand(line[slice(*words[last + 2])].rstrip(".,;:!?")))
    ):
        last += 2
    expression = line[words[first][0] : words[last][1]]
    # outside braces: the right side of the last "=" or "&", up to where the math ends
    # ("&={5}.\end{align*}" is {5}, "\frac12$." is \frac12, "3 \\" is 3)
    expression = _MATH_START.sub("", expression)
    masked = _outside_braces(expression)
    sides = list(_RIGHT_SIDE.finditer(masked))
    begin = sides[-1].end() if sides else 0
    end = _MATH_END.search(masked, begin)
    expression = expression[begin : end.start() if end else len(expression)].rstrip(".,;:!? ")
    if _MODULUS.search(expression):
        return ""  # 3 \pmod{11}: neither 11 nor the residue alone
    expression = _trim(expression.strip("$").strip())
    if expression.count("{") != expression.count("}") or not expression:
        return ""
    return expression


_RIGHT_SIDE = re.compile(r"=|&|\\(?:Rightarrow|implies|to|approx)(?![a-zA-Z])")


def _outside_braces(s: str) -> str:
    """``s`` with everything inside braces blanked out (same length)."""
    out, depth = [], 0
    for i, c in enumerate(s):
        if c == "{" and s[i - 1 : i] != "\\":
            depth += 1
            out.append(c if depth == 1 else " ")
        elif c == "}" and s[i - 1 : i] != "\\" and depth:
            depth -= 1
            out.append(c if depth == 0 else " ")
        else:
            out.append(" " if depth else c)
    return "".join(out)


def _is_operand(word: str) -> bool:
    return (
        bool(word)
        and not prose_words(word)
        and "=" not in word
        and bool(re.search(r"[\d\\]", word))
    )


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
