"""Spellings that never change an answer's value, unified before it is parsed.

Nothing here imports sympy: the extractor and the number fast path use it in the main
process. Every function is a fixed number of linear passes over its input.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_ANSWER_CHARS = 10_000  # an extracted answer longer than this is not graded
# LaTeX commands that a doubly escaped text (JSON inside JSON) writes with two backslashes
_COMMANDS = (
    "boxed|fbox|frac|dfrac|tfrac|cfrac|sqrt|left|right|text|textbf|textit|textrm|mathrm|mbox|"
    "le|leq|ge|geq|lt|gt|ne|neq|pi|cdot|times|div|in|cup|cap|infty|pm|mp|circ|begin|end|quad|"
    "qquad|angle|sin|cos|tan|log|ln|exp|binom|dbinom|overline|approx|mid|emptyset|varnothing|"
    "mathbf|mathbb|operatorname|displaystyle|langle|rangle|setminus|sum|prod|alpha|beta|gamma|"
    "theta|lambda|mu|sigma|omega|phi|dots|ldots|cdots"
)
_DOUBLED = re.compile(rf"(?<!\\)\\\\(?=(?:{_COMMANDS})(?![a-zA-Z]))")


def undouble_escapes(text: str) -> str:
    """``\\\\frac`` written for ``\\frac`` (a text escaped twice) read as the command.

    A real row break ``\\\\`` is followed by a space, a digit or a third backslash, never
    directly by a command name, so it is left alone.
    """
    if "\\\\" not in text:
        return text
    return _DOUBLED.sub(r"\\", text)


_SPACING = re.compile(
    r"\\[,;:! ]|\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits|quad|qquad|enspace"
    r"|thinspace|medspace|thickspace|negthinspace|hfill|big|Big|bigg|Bigg|bigl|bigr|Bigl|Bigr"
    r"|biggl|biggr)(?![a-zA-Z])"
)
_GLUED_QUAD = re.compile(r"\\q?quad(?=[a-zA-Z])")  # \quadx_2 is \quad x_2
_STYLE = re.compile(
    r"\\(?:mathbf|boldsymbol|bm|mathit|mathsf|mathtt|mathnormal|mathcal|mathscr|mathfrak)"
    r"(?![a-zA-Z])"
)
_STYLED_LETTER = re.compile(r"\\(?:mathbf|boldsymbol|bm|mathit)\s*\{\s*([A-Za-z])\s*\}")
_NUMBER_SETS = re.compile(r"\\mathbb\s*\{?\s*([RZNQC])\s*\}?")
_UNICODE = {
    "\u2212": "-",
    "\u2013": "-",
    "\u00d7": r"\times ",
    "\u22c5": r"\cdot ",
    "\u00b7": r"\cdot ",
    "\u03c0": r"\pi ",
    "\u221e": r"\infty ",
    "\u221a": r"\sqrt",
    "\u2264": r"\le ",
    "\u2265": r"\ge ",
    "\u2260": r"\ne ",
    "\u2248": r"\approx ",
    "\u00b0": r"^\circ ",
    "\u222a": r"\cup ",
    "\u2229": r"\cap ",
    "\u2208": r"\in ",
    "\u00b1": r"\pm ",
    "\u2205": r"\emptyset ",
    "\u2009": " ",  # thin space
    "\u202f": " ",  # narrow no-break space
    "\u00a0": " ",
    "\u20ac": r" \EUR ",
    "\u00a3": r" \GBP ",
    "\u00a5": r" \JPY ",
    "\u20b9": r" \INR ",
    "\u20a9": r" \KRW ",
    "\u20bd": r" \RUB ",
    "\u5143": r" \CNY ",  # 元, written after the amount
    "\u00a2": r" \CENT ",
    "\u2044": "/",  # fraction slash
}
CURRENCIES = {"USD": "dollar", "EUR": "euro", "GBP": "pound sterling", "JPY": "yen",
              "INR": "rupee", "KRW": "won", "RUB": "ruble", "CNY": "yuan", "CENT": "cent"}  # fmt: skip
# currency codes and TeX currency commands, read as the signs
_CURRENCY_WORDS = re.compile(
    r"\\(?:textdollar|dollar)(?![a-zA-Z])|(?<![A-Za-z])US\s*\\?\$"
    r"|(?<![A-Za-z\\])(USD|EUR|GBP|JPY|CNY|RMB|INR|KRW|RUB)(?![A-Za-z])"
    r"|\\(euro|texteuro|pounds|textsterling|yen|textyen|textcent)(?![a-zA-Z])"
)
_CURRENCY_COMMANDS = {"euro": "EUR", "texteuro": "EUR", "pounds": "GBP", "textsterling": "GBP",
                      "yen": "JPY", "textyen": "JPY", "textcent": "CENT", "RMB": "CNY"}  # fmt: skip


def _currency_word(m: re.Match) -> str:
    code = m.group(1) or m.group(2)
    if code is None:
        return " \\$"
    return f" \\{_CURRENCY_COMMANDS.get(code, code)} "


# Unicode vulgar fractions, superscripts and subscripts
_VULGAR = {
    "\u00bd": (1, 2), "\u2153": (1, 3), "\u2154": (2, 3), "\u00bc": (1, 4), "\u00be": (3, 4),
    "\u2155": (1, 5), "\u2156": (2, 5), "\u2157": (3, 5), "\u2158": (4, 5), "\u2159": (1, 6),
    "\u215a": (5, 6), "\u2150": (1, 7), "\u215b": (1, 8), "\u215c": (3, 8), "\u215d": (5, 8),
    "\u215e": (7, 8), "\u2151": (1, 9), "\u2152": (1, 10),
}  # fmt: skip
_SUPERSCRIPTS = "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079"
_SUBSCRIPTS = "\u2080\u2081\u2082\u2083\u2084\u2085\u2086\u2087\u2088\u2089"
_SUP_MAP = {c: str(d) for d, c in enumerate(_SUPERSCRIPTS)} | {"\u207b": "-", "\u207a": "+"}
_SUB_MAP = {c: str(d) for d, c in enumerate(_SUBSCRIPTS)} | {"\u208b": "-", "\u208a": "+"}
_SUP_RUN = re.compile(f"[{_SUPERSCRIPTS}\u207b\u207a]+")
_SUB_RUN = re.compile(f"[{_SUBSCRIPTS}\u208b\u208a]+")
_SUP_OVER_SUB = re.compile(f"([{_SUPERSCRIPTS}]+)\\s*[/\u2044]\\s*([{_SUBSCRIPTS}]+)")


def _unicode_math(s: str) -> str:
    """Vulgar fractions (½), superscripts (10³³, x⁻²) and subscripts as TeX."""
    for ch, (a, b) in _VULGAR.items():
        if ch in s:
            s = s.replace(ch, f"\\frac{{{a}}}{{{b}}}")
    s = _SUP_OVER_SUB.sub(
        lambda m: "\\frac{" + "".join(_SUP_MAP[c] for c in m.group(1)) + "}{"
        + "".join(_SUB_MAP[c] for c in m.group(2)) + "}",
        s,
    )  # fmt: skip
    s = _SUP_RUN.sub(lambda m: "^{" + "".join(_SUP_MAP[c] for c in m.group(0)) + "}", s)
    return _SUB_RUN.sub(lambda m: "_{" + "".join(_SUB_MAP[c] for c in m.group(0)) + "}", s)


# 75 million, 2 billion, 32.348 \text{ thousand}: a number word multiplies the number
_SCALE_WORDS = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12}
_SCALED = re.compile(
    r"(?<![\d.])(\d+(?:\.\d+)?)(\s*\\(?:text|textrm|mathrm|mbox)\s*\{\s*|\s*)"
    r"(thousand|million|billion|trillion)s?(?![A-Za-z])",
    re.IGNORECASE,
)
_EMPTY_TEXT = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{\s*\}")


def _scaled(m: re.Match) -> str:
    whole, _, frac = m.group(1).partition(".")
    power = _SCALE_WORDS[m.group(3).lower()]
    if len(frac) > power or len(m.group(1)) > 100:
        value = m.group(1) + f"e{power}"
    else:
        value = str(int(whole + frac.ljust(power, "0")))
    brace = "{" in m.group(2)
    return value + (" \\text{" if brace else "")


# a unit written in pieces after the number: \mathrm{~g} / \mathrm{cm}^{3}, \text{ erg} \cdot
# \mathrm{s}^{-1}: joined into one \text{} so it reads as one unit
_UNIT_PIECE = r"\\(?:text|textrm|mathrm|mbox)\s*\{[^{}\\]*\}(?:\s*\^\s*(?:\{\s*-?\d+\s*\}|-?\d))?"
_UNIT_JOIN = r"\s*(?:/|\\cdot|\s)\s*"
_UNIT_RUN = re.compile(rf"(?<=[\d}}\s])\s*({_UNIT_PIECE}(?:{_UNIT_JOIN}{_UNIT_PIECE})+)\s*\Z")
_UNIT_PIECE_PARTS = re.compile(
    r"(/)|\\(?:text|textrm|mathrm|mbox)\s*\{([^{}\\]*)\}(?:\s*\^\s*\{?\s*(-?\d+)\s*\}?)?"
)


def _join_unit_pieces(m: re.Match) -> str:
    out = []
    for piece in _UNIT_PIECE_PARTS.finditer(m.group(1)):
        if piece.group(1):
            out.append("/")
            continue
        word = piece.group(2).replace("~", " ").strip()
        if not word:
            continue
        if out and out[-1] != "/":
            out.append(" ")
        out.append(word + (f"^{piece.group(3)}" if piece.group(3) else ""))
    return " \\text{ " + "".join(out) + "}"


# a unit in plain text at the end, after a number: unit symbols joined by "/", "\cdot" or a
# space, with a "/" or a negative power (4 m/s^2, 60 km/h, 9.8 m s^{-2}), read as one
# \text{} unit; one symbol alone (4 m, 4 m^2) or symbols side by side (2 A B, a product of
# points) stay variables
_UNIT_SYMBOL = (
    r"(?:km|cm|mm|nm|m|kg|mg|g|ms|s|min|h|hr|mL|ml|L|kN|N|kJ|J|kW|W|kPa|Pa|kHz|Hz|mol|eV|"
    r"V|A|K|C|ft|mi|lb|rad)(?![A-Za-z])(?:\^\s*(?:\{\s*-?\d+\s*\}|-?\d))?"
)
_PLAIN_UNIT = re.compile(
    rf"(?<=\d)[ \t]+({_UNIT_SYMBOL}(?:\s*(?:/|\\cdot|[ \t])\s*{_UNIT_SYMBOL})+)[ \t]*\Z"
)
_NEGATIVE_POWER = re.compile(r"\^\s*\{?\s*-")


def _plain_unit(m: re.Match) -> str:
    unit = m.group(1)
    if "/" not in unit and not _NEGATIVE_POWER.search(unit):
        return m.group(0)
    return " \\text{ " + unit + "}"


# 10{,}000 and 10,\!000: explicit thousands separators, joined wherever they are
_EXPLICIT_THOUSANDS = re.compile(r"(?<=\d)\s*(?:\{\s*,\s*\}|,\\!\s*|,\\,\s*)(?=\d{3}(?!\d))")
# 10\,000, 10\ 000, 10 000 (and thin spaces): a space between groups of three digits
_SPACED_THOUSANDS = re.compile(
    r"(?<![\d.,])(\d{1,3})((?:(?:\\[,;: !]|~| )\s*\d{3})+)(?![\d/]|\.\d|\s*\\frac|\s*/)"
)
_SPACED_GROUP_SEP = re.compile(r"\\[,;: !]|~| |\s")
# 1,234 and 1,234.5: comma thousands, only outside brackets, where (3,331) is a pair
_THOUSANDS = re.compile(r"(?<![\d.,])([1-9]\d{0,2}(?:,\d{3})+)(\.\d+)?(?![\d,]|\.\d)")
# 0.\overline{3}, 1.2\overline{45}, 0.1\dot{6}, 0.(3): repeating decimals
_REPEATING = re.compile(
    r"(?<![\d.])(\d*)\.(\d*)(?:\\overline\s*\{\s*(\d+)\s*\}|\\overline\s*(\d)|\\dot\s*\{\s*(\d)\s*\}"
    r"|\\dot\s*(\d)|\((\d+)\))"
)
MAX_REPEATING_DIGITS = 200


def repeating_fraction(whole: str, fixed: str, repeat: str) -> Fraction:
    """The value of ``whole.fixed(repeat)(repeat)...``: 0.1(6) is 1/6."""
    base = int(whole or "0") * 10 ** len(fixed) + int(fixed or "0")
    cycle = 10 ** len(repeat) - 1
    return Fraction(base * cycle + int(repeat), 10 ** len(fixed) * cycle)


def _repeating(m: re.Match) -> str:
    whole, fixed = m.group(1), m.group(2)
    repeat = next(g for g in m.groups()[2:] if g is not None)
    if len(fixed) + len(repeat) + len(whole) > MAX_REPEATING_DIGITS:
        return m.group(0)
    value = repeating_fraction(whole, fixed, repeat)
    return f"\\frac{{{value.numerator}}}{{{value.denominator}}}"


def _bracket_depths(s: str) -> list[int]:
    """Depth of ( [ \\{ brackets at every index of ``s``."""
    depths, depth = [], 0
    for i, c in enumerate(s):
        if c in "([" or (c == "{" and i and s[i - 1] == "\\"):
            depth += 1
        elif c in ")]" or (c == "}" and i and s[i - 1] == "\\"):
            depth = max(0, depth - 1)
        depths.append(depth)
    return depths


def _join_thousands(s: str) -> str:
    if "," not in s:
        return s
    depths = None
    out, last = [], 0
    for m in _THOUSANDS.finditer(s):
        if depths is None:
            depths = _bracket_depths(s)
        if depths[m.start()] > 0:
            continue
        out.append(s[last : m.start()])
        out.append(m.group(1).replace(",", "") + (m.group(2) or ""))
        last = m.end()
    out.append(s[last:])
    return "".join(out)


_REWRITES = [
    (re.compile(p), r)
    for p, r in (
        (r"\\left\s*\.|\\right\s*\.", " "),
        (r"\\(?:left|right|middle)(?![a-zA-Z])", ""),
    )
]
_COMMAND_REWRITES = [
    (re.compile(p), r)
    for p, r in (
        (r"\\[dtc]frac(?![a-zA-Z])", r"\\frac"),
        (r"\\[dt]binom(?![a-zA-Z])", r"\\binom"),
        (r"\\(?:lvert|rvert|vert|lVert|rVert|Vert)(?![a-zA-Z])", "|"),
        (r"\\(?:leqslant|leq|le)(?![a-zA-Z])", r"\\le "),
        (r"\\(?:geqslant|geq|ge)(?![a-zA-Z])", r"\\ge "),
        (r"\\(?:neq|ne)(?![a-zA-Z])", r"\\ne "),
        (r"\\lt(?![a-zA-Z])", "<"),
        (r"\\gt(?![a-zA-Z])", ">"),
        (r"\\(?:degree|textdegree)(?![a-zA-Z])", r"^\\circ "),
    )
]
_WHITESPACE = re.compile(r"\s+")


def clean(text: str) -> str:
    """Spacing, delimiters and spellings that never change the value, removed or unified."""
    s = undouble_escapes(text.strip())
    if "\x00" in s:
        s = s.replace("\x00", " ").strip()  # a NUL is read as a space
    if not s.isascii():
        s = _unicode_math(s)
    for ch, repl in _UNICODE.items():
        if ch in s:
            s = s.replace(ch, repl)
    if "," in s or "{" in s:
        s = _EXPLICIT_THOUSANDS.sub("", s)
    if " " in s or "\\" in s or "~" in s:
        s = _SPACED_THOUSANDS.sub(lambda m: m.group(1) + _SPACED_GROUP_SEP.sub("", m.group(2)), s)
    s = s.replace("{,}", ",")
    s = s.replace("\\\\", " \\newrow ")  # a matrix row break, kept apart from "\ " spacing
    if not s.isdigit():
        s = _CURRENCY_WORDS.sub(_currency_word, s)
    s = s.replace("\\$", " \\USD ").replace("$", "")
    if "\\over" in s:
        s = over_to_frac(s)
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    if "\\" in s:
        for pattern, repl in _REWRITES:
            s = pattern.sub(repl, s)
        s = _GLUED_QUAD.sub(" ", s)
        s = _SPACING.sub(" ", s)
        s = _NUMBER_SETS.sub(lambda m: f"\\set{m.group(1)} ", s)
        s = _STYLED_LETTER.sub(r" \1 ", s)  # \mathbf{i}: the letter
        s = _STYLE.sub("", s)
        for pattern, repl in _COMMAND_REWRITES:
            s = pattern.sub(repl, s)
    s = s.replace("<=", r"\le ").replace(">=", r"\ge ").replace("!=", r"\ne ")
    if "illion" in s or "housand" in s:
        s = _EMPTY_TEXT.sub("", _SCALED.sub(_scaled, s))
    if "}" in s and ("/" in s or "\\cdot" in s or s.count("{") > 1):
        s = _UNIT_RUN.sub(_join_unit_pieces, s)
    if " " in s and ("/" in s or "^" in s):
        s = _PLAIN_UNIT.sub(_plain_unit, s)
    s = s.replace("~", " ").replace("\\%", "%")
    if "." in s:
        s = _REPEATING.sub(_repeating, s)
    s = _join_thousands(s)
    s = _WHITESPACE.sub(" ", s).strip()
    s = s.rstrip(".").strip()
    return s


_OVER = re.compile(r"\\over(?![a-zA-Z])")


def over_to_frac(s: str) -> str:
    """TeX's ``{a \\over b}`` as ``\\frac{a}{b}`` (the braces around it, or the whole text)."""
    for _ in range(20):
        m = _OVER.search(s)
        if m is None:
            return s
        depth, left = 0, -1
        for i in range(m.start() - 1, -1, -1):
            c = s[i]
            if c == "}" and s[i - 1 : i] != "\\":
                depth += 1
            elif c == "{" and s[i - 1 : i] != "\\":
                if depth == 0:
                    left = i
                    break
                depth -= 1
        depth, right = 0, len(s)
        for i in range(m.end(), len(s)):
            c = s[i]
            if c == "{" and s[i - 1] != "\\":
                depth += 1
            elif c == "}" and s[i - 1] != "\\":
                if depth == 0:
                    right = i
                    break
                depth -= 1
        if (left < 0) != (right == len(s)):
            return s  # unbalanced: leave it to the parser to refuse
        num, den = s[left + 1 : m.start()].strip(), s[m.end() : right].strip()
        s = s[: max(left, 0)] + f"\\frac{{{num}}}{{{den}}}" + s[right + 1 :]
    return s


_SQUASH_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_SQUASH_SPACE = re.compile(r"(?<!\d) | (?!\d)")
CHOICE = re.compile(r"\(?([A-Ea-e])\)?|\\text(?:bf)?\{\s*\(?([A-E])\)?\s*\}")


def squash(text: str) -> str:
    """An answer with its spacing and text wrappers removed: equal squashes are one answer
    (digits apart stay apart: "2 1/2" is not "21/2")."""
    return _SQUASH_SPACE.sub("", _SQUASH_TEXT.sub(r"\1", clean(text)))


def choice_letter(text: str) -> str | None:
    """The letter of a multiple-choice answer (``C``, ``(C)``, ``\\text{(C)}``), else None."""
    s = clean(text)
    m = CHOICE.fullmatch(s)
    if m is None or s in "abcde":
        return None
    return (m.group(1) or m.group(2)).upper()


_TEXT_WRAPPERS = re.compile(
    r"\\(?:text|textbf|textit|textrm|textnormal|mathrm|mbox|operatorname)\s*\{([^{}]*)\}"
)


def strip_text_wrappers(s: str) -> str:
    return _TEXT_WRAPPERS.sub(r"\1", s)


def normalize_text(text: str) -> str:
    """The spelling-insensitive form of an answer, for answers that are words."""
    s = strip_text_wrappers(clean(text))
    s = s.replace("{", "").replace("}", "").replace("\\", "")
    return re.sub(r"\s+", "", s).lower()


# --------------------------------------------------------------------------- units

_UNIT_ALIASES = {
    "centimeter": "cm", "centimetre": "cm", "meter": "m", "metre": "m", "kilometer": "km",
    "kilometre": "km", "millimeter": "mm", "millimetre": "mm", "inch": "in", "inche": "in",
    "foot": "ft", "feet": "ft", "yard": "yd", "mile": "mi", "kilogram": "kg", "gram": "g",
    "pound": "lb", "lbs": "lb", "ounce": "oz", "liter": "l", "litre": "l", "milliliter": "ml",
    "millilitre": "ml", "second": "s", "sec": "s", "minute": "min", "hour": "h", "hr": "h",
    "hrs": "h", "day": "day", "week": "week", "month": "month", "year": "year", "yr": "year",
    "dollar": "dollar", "usd": "dollar", "buck": "dollar", "cent": "cent", "euro": "euro",
    "eur": "euro", "yuan": "yuan", "rmb": "yuan", "yen": "yen", "kmh": "km/h", "kph": "km/h",
    "mph": "mi/h", "sqft": "ft^2", "sqm": "m^2", "degree": "degree", "radian": "rad",
    "meterpersecond": "m/s", "milesperhour": "mi/h", "kilometersperhour": "km/h",
}  # fmt: skip
# words that say nothing about which unit: "5 units", "12 square units"
WILDCARD_UNITS = {"unit", "units", "squareunit", "squareunits", "unit^2", "unit^3", ""}
_POWER_WORDS = (("square", "^2"), ("sq", "^2"), ("cubic", "^3"), ("cu", "^3"))


def unit_key(unit: str) -> str:
    """A canonical spelling of a unit: ``\\text{ square centimeters}`` and ``cm^2`` agree."""
    s = strip_text_wrappers(unit).lower()
    s = s.replace("{", "").replace("}", "").replace("\\", "").replace(" ", "").replace(".", "")
    s = s.replace("²", "^2").replace("³", "^3")
    power = ""
    for word, exp in _POWER_WORDS:
        if s.startswith(word) and len(s) > len(word):
            s, power = s[len(word) :], exp
            break
    m = re.fullmatch(r"([a-z/]+)(\^\d)?", s)
    if m is None:
        return s + power
    word, exp = m.group(1), m.group(2) or power
    if word in WILDCARD_UNITS:
        return ""
    if word not in _UNIT_ALIASES and len(word) > 3 and word.endswith("s"):
        word = word[:-1]  # plural
    if word.endswith("es") and word[:-2] in _UNIT_ALIASES:
        word = word[:-2]
    return _UNIT_ALIASES.get(word, word) + exp


def units_differ(a: str | None, b: str | None) -> bool:
    """Both answers name a unit and the units are not the same (``cm`` vs ``m``)."""
    if not a or not b:
        return False
    ka, kb = unit_key(a), unit_key(b)
    return bool(ka) and bool(kb) and ka != kb
