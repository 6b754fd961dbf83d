"""LaTeX and plain-text math answers into values we can compare, without ``eval``.

A small tokenizer and a recursive-descent parser build sympy objects directly
from their constructors (``Integer``, ``Rational``, ``Add``, ``Mul``, ``Pow``,
``Symbol``...). Nothing here passes model text to ``eval``, ``sympify`` or
``parse_expr``, so a prediction like ``__import__('os').system(...)`` is only
ever a product of symbols.

The result of :func:`parse_answer` is one of the small value types below:

- :class:`Scalar`: a sympy expression, with a note of how it was written (a
  decimal with its digits, a percentage, degrees, a number in another base);
- :class:`Seq`: items in brackets, ``(1, 2)``, ``[0, 1)``, or a bare list ``1, 2``;
- :class:`SetOf`: ``\\{1, 2\\}``;
- :class:`Matrix`: ``\\begin{pmatrix} ... \\end{pmatrix}``;
- :class:`Relation`: ``y = 2x + 1``, ``0 < x \\le 3``, ``x \\in [2, 5)``;
- :class:`SetUnion`: ``(-\\infty, 2) \\cup (3, \\infty)``;
- :class:`Text`: words, ``\\text{Evelyn}``, a multiple-choice letter.

Work is bounded: the input length, nesting depth, literal length and the size
of every exact power or factorial are limited, and going past a limit raises
:class:`TooLarge` instead of computing for ever.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import sympy

MAX_ANSWER_CHARS = 10_000  # an extracted answer longer than this is not graded
MAX_DEPTH = 60  # brackets, braces and operators nested deeper than this are refused
MAX_LITERAL_DIGITS = 4_000  # Python refuses to read longer integers anyway
MAX_RESULT_DIGITS = 20_000  # largest exact integer a power or factorial may build
MAX_LIST_ITEMS = 200


class ParseError(ValueError):
    """The text is not a math answer this parser understands."""


class TooLarge(ValueError):
    """The answer asks for more work than a grader should do (huge power, deep nesting)."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Scalar:
    expr: sympy.Basic
    decimal_places: int | None = None  # set when written as a plain decimal, e.g. 0.333 -> 3
    significant_digits: int | None = None
    unit: str | None = None  # "percent" or "degree" when written with % or ^\circ
    base: int | None = None  # 52_8 is the digits 52 in base 8
    digits: str | None = None


@dataclass(frozen=True)
class Seq:
    items: tuple
    open: str = ""  # "(", "[" or "" for a bare comma list
    close: str = ""


@dataclass(frozen=True)
class SetOf:
    items: tuple


@dataclass(frozen=True)
class Matrix:
    rows: tuple  # tuple of tuples of values


@dataclass(frozen=True)
class Relation:
    parts: tuple  # values, len(ops) + 1 of them
    ops: tuple  # "=", "<", "<=", ">", ">=", "!=", "in"


@dataclass(frozen=True)
class SetUnion:
    parts: tuple  # Seq intervals or SetOf, joined by \cup


@dataclass(frozen=True)
class Text:
    text: str


@dataclass
class _Token:
    kind: str  # num, sym, word, cmd, text, op, env_begin, env_end, eof
    value: str
    space_before: bool = False
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- cleaning

_SPACING = re.compile(
    r"\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits|,|;|:|!| |quad|qquad|enspace|thinspace"
    r"|medspace|thickspace|negthinspace|hfill|big|Big|bigg|Bigg|bigl|bigr|Bigl|Bigr|biggl|biggr)(?![a-zA-Z])"
)
_STYLE = re.compile(
    r"\\(?:mathbf|boldsymbol|bm|mathit|mathsf|mathtt|mathnormal|mathcal|mathscr|mathbb|mathfrak)(?![a-zA-Z])"
)
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
    "\u00b0": r"^\circ ",
    "\u222a": r"\cup ",
    "\u2229": r"\cap ",
    "\u2208": r"\in ",
    "\u00b1": r"\pm ",
    "\u2205": r"\emptyset ",
}
_THOUSANDS = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+)(?![\d,]|\.\d)")
_THOUSANDS_DECIMAL = re.compile(r"(?<![\d.,])(\d{1,3}(?:,\d{3})+)(\.\d+)(?![\d,])")


def clean(text: str) -> str:
    """Spacing, delimiters and spellings that never change the value, removed or unified."""
    s = text.strip()
    for ch, repl in _UNICODE.items():
        if ch in s:
            s = s.replace(ch, repl)
    s = s.replace("{,}", ",")
    s = re.sub(r",\\[!,;: ]\s*(?=\d{3}(?!\d))", ",", s)  # 10,\!000 written with a thin space
    s = s.replace("\\\\", " \\newrow ")  # a matrix row break, kept apart from "\ " spacing
    s = s.replace("\\$", "").replace("$", "")
    s = s.replace("\\(", "").replace("\\)", "").replace("\\[", "").replace("\\]", "")
    s = re.sub(r"\\left\s*\.|\\right\s*\.", " ", s)
    s = re.sub(r"\\(?:left|right|middle)(?![a-zA-Z])", "", s)
    s = _SPACING.sub(" ", s)
    s = _STYLE.sub("", s)
    s = re.sub(r"\\[dt]frac(?![a-zA-Z])", r"\\frac", s)
    s = re.sub(r"\\[dt]binom(?![a-zA-Z])", r"\\binom", s)
    s = re.sub(r"\\(?:lvert|rvert|vert)(?![a-zA-Z])", "|", s)
    s = re.sub(r"\\(?:lVert|rVert|Vert)(?![a-zA-Z])", "|", s)
    s = re.sub(r"\\(?:leqslant|leq|le)(?![a-zA-Z])", r"\\le ", s)
    s = re.sub(r"\\(?:geqslant|geq|ge)(?![a-zA-Z])", r"\\ge ", s)
    s = re.sub(r"\\(?:neq|ne)(?![a-zA-Z])", r"\\ne ", s)
    s = s.replace("<=", r"\le ").replace(">=", r"\ge ").replace("!=", r"\ne ")
    s = s.replace("~", " ").replace("\\%", "%")
    s = _THOUSANDS_DECIMAL.sub(lambda m: m.group(1).replace(",", "") + m.group(2), s)
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = re.sub(r"\s+", " ", s).strip()
    s = s.rstrip(".").strip()
    return s


def normalize_text(text: str) -> str:
    """The spelling-insensitive form of an answer, for answers that are words."""
    s = clean(text)
    s = re.sub(r"\\(?:text|textbf|textit|textrm|mathrm|mbox|operatorname)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("{", "").replace("}", "").replace("\\", "")
    return re.sub(r"\s+", "", s).lower()


# --------------------------------------------------------------------------- tokenizer

# Words read as one token in plain text (longer letter runs are text, not products).
_FUNCTIONS = {
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "arccot", "arcsec",
    "arccsc", "sinh", "cosh", "tanh", "coth", "log", "ln", "lg", "exp", "sqrt", "gcd", "lcm",
    "max", "min", "floor", "ceil", "abs", "deg",
}  # fmt: skip
_CONSTANT_WORDS = {"pi": sympy.pi, "infty": sympy.oo, "infinity": sympy.oo, "inf": sympy.oo}
_SEPARATOR_WORDS = {"or", "and"}
UNIT_WORDS = {
    "cm", "mm", "km", "m", "meter", "meters", "metre", "metres", "centimeters", "centimeter",
    "kilometers", "kilometer", "millimeters", "inch", "inches", "in", "ft", "foot", "feet",
    "yard", "yards", "yd", "mile", "miles", "mph", "kg", "g", "gram", "grams", "pound", "pounds",
    "lb", "lbs", "ounce", "ounces", "oz", "l", "liter", "liters", "litre", "ml", "gallon",
    "gallons", "s", "sec", "second", "seconds", "min", "minute", "minutes", "h", "hr", "hrs",
    "hour", "hours", "day", "days", "week", "weeks", "month", "months", "year", "years",
    "dollar", "dollars", "cent", "cents", "unit", "units", "sq", "square", "cubic", "degree",
    "degrees", "deg", "radian", "radians", "rad", "percent", "people", "students", "points",
    "times", "ways", "page", "pages", "apples", "marbles", "books", "coins", "cars", "eggs",
}  # fmt: skip
_SUBSTITUTE_SYMBOLS = {"e": sympy.E, "i": sympy.I}


def tokenize(s: str) -> list[_Token]:
    tokens: list[_Token] = []
    n = len(s)
    i = 0
    space = False
    depth = 0
    while i < n:
        c = s[i]
        if c.isspace():
            space = True
            i += 1
            continue
        if c.isdigit() or (c == "." and i + 1 < n and s[i + 1].isdigit()):
            m = _NUMBER.match(s, i)
            assert m is not None
            tokens.append(_Token("num", m.group(0), space))
            i = m.end()
        elif c.isalpha():
            j = i
            while j < n and s[j].isalpha():
                j += 1
            run = s[i:j]
            low = run.lower()
            if len(run) == 1:
                tokens.append(_Token("sym", run, space))
            elif low in _FUNCTIONS or low in _CONSTANT_WORDS or low in _SEPARATOR_WORDS:
                tokens.append(_Token("word", low, space))
            elif len(run) == 2 and low not in UNIT_WORDS:
                tokens.append(_Token("sym", run[0], space))
                tokens.append(_Token("sym", run[1], False))
            else:
                tokens.append(_Token("text", run, space))
            i = j
        elif c == "\\":
            j = i + 1
            if j < n and s[j].isalpha():
                while j < n and s[j].isalpha():
                    j += 1
                name = s[i + 1 : j]
            else:
                name = s[j : j + 1]
                j += 1
            i = j
            if name in ("text", "textbf", "textit", "textrm", "mathrm", "mbox", "operatorname",
                        "textnormal", "textsf", "texttt", "hbox"):  # fmt: skip
                content, i = _read_group(s, i)
                tokens.append(_Token("text", content.strip(), space))
            elif name in ("begin", "end"):
                env, i = _read_group(s, i)
                tokens.append(_Token("env_" + name, env.strip().rstrip("*"), space))
            else:
                tokens.append(_Token("cmd", name, space))
        else:
            if c in "{([":
                depth += 1
                if depth > MAX_DEPTH:
                    raise TooLarge(f"brackets nested deeper than {MAX_DEPTH}")
            elif c in "})]":
                depth = max(0, depth - 1)
            tokens.append(_Token("op", c, space))
            i += 1
        space = False
    tokens.append(_Token("eof", "", space))
    return tokens


_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+(?![a-zA-Z]))?")


def _read_group(s: str, i: int) -> tuple[str, int]:
    """The text of a brace group starting at ``s[i]`` (after spaces), and the index after it."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s) or s[i] != "{":
        # \text x: a single character argument
        return (s[i : i + 1], i + 1) if i < len(s) else ("", i)
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{" and s[j - 1 : j] != "\\":
            depth += 1
        elif s[j] == "}" and s[j - 1 : j] != "\\":
            depth -= 1
            if depth == 0:
                return s[i + 1 : j], j + 1
    raise ParseError("unbalanced braces")


# --------------------------------------------------------------------------- parser

_GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "vartheta", "iota", "kappa", "lambda", "mu", "nu", "xi", "rho", "sigma", "tau", "upsilon",
    "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi",
    "Sigma", "Upsilon", "Phi", "Psi", "Omega", "ell", "hbar",
}  # fmt: skip
_SYMPY_FUNCS = {
    "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "cot": sympy.cot, "sec": sympy.sec,
    "csc": sympy.csc, "arcsin": sympy.asin, "arccos": sympy.acos, "arctan": sympy.atan,
    "arccot": sympy.acot, "arcsec": sympy.asec, "arccsc": sympy.acsc, "sinh": sympy.sinh,
    "cosh": sympy.cosh, "tanh": sympy.tanh, "coth": sympy.coth, "ln": sympy.log,
    "exp": sympy.exp, "floor": sympy.floor, "ceil": sympy.ceiling, "abs": sympy.Abs,
}  # fmt: skip
_RELATIONS = {"=": "=", "<": "<", ">": ">", "le": "<=", "ge": ">=", "ne": "!=", "in": "in",
              "approx": "=", "equiv": "="}  # fmt: skip
_INFIX_TIMES = {"cdot", "times", "ast"}
_NOT_FACTOR_COMMANDS = {
    "pm", "mp", "cup", "cap", "newrow", "}", "cdot", "times", "div", "ast", "to", "rfloor",
    "rceil", "circ", "setminus",
}  # fmt: skip
_DECORATIONS = {
    "overline", "vec", "hat", "bar", "widehat", "overrightarrow", "mathring", "dot", "ddot",
    "tilde", "widetilde", "underline",
}  # fmt: skip
_MATRIX_ENVS = {"pmatrix", "bmatrix", "matrix", "vmatrix", "Bmatrix", "smallmatrix", "array"}


def _log10_abs(value: sympy.Basic) -> float | None:
    """log10 of |value| for a rational value, without building huge decimals."""
    if not isinstance(value, sympy.Rational) or value == 0:
        return None
    p, q = abs(int(value.p)), int(value.q)
    return (p.bit_length() - q.bit_length()) * math.log10(2)


def _guard_power(base: sympy.Basic, exp: sympy.Basic) -> None:
    """Refuse an exact power whose result would have more than MAX_RESULT_DIGITS digits.
    (An irrational exponent stays unevaluated; the worker's time limit bounds the rest.)"""
    if not (isinstance(exp, sympy.Number) and base.is_number):
        return
    if isinstance(base, sympy.Rational):
        size = _log10_abs(base)
        if size is None or abs(size) < 1e-12:
            return
        if abs(float(exp)) * (abs(size) + 1) > MAX_RESULT_DIGITS:
            raise TooLarge("power too large to evaluate exactly")
    elif abs(exp) > MAX_RESULT_DIGITS:
        raise TooLarge("exponent too large")


class _Parser:
    def __init__(self, tokens: list[_Token]):
        self.toks = tokens
        self.pos = 0
        self.depth = 0
        self.pm_sign = 1  # \pm read as + on a first pass, - on a second
        self.pm_seen = False
        self._int_frac = False  # the last \frac read had integer parts (for mixed numbers)

    # ------------------------------------------------------------------ helpers
    @property
    def tok(self) -> _Token:
        return self.toks[self.pos]

    def peek(self, k: int = 1) -> _Token:
        return self.toks[min(self.pos + k, len(self.toks) - 1)]

    def next(self) -> _Token:
        t = self.toks[self.pos]
        if t.kind != "eof":
            self.pos += 1
        return t

    def at(self, kind: str, value: str | None = None) -> bool:
        t = self.tok
        return t.kind == kind and (value is None or t.value == value)

    def expect(self, kind: str, value: str | None = None) -> _Token:
        if not self.at(kind, value):
            raise ParseError(f"expected {value or kind}, found {self.tok.value!r}")
        return self.next()

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise TooLarge(f"expression nested deeper than {MAX_DEPTH}")

    def leave(self) -> None:
        self.depth -= 1

    def at_separator(self) -> bool:
        t = self.tok
        return (
            (t.kind == "op" and t.value in ",;")
            or (t.kind == "word" and t.value in _SEPARATOR_WORDS)
            or (t.kind == "text" and t.value.lower() in _SEPARATOR_WORDS)
        )

    # ------------------------------------------------------------------ answer
    def parse_answer(self):
        items = self.parse_list(top=True)
        if not self.at("eof"):
            raise ParseError(f"unexpected {self.tok.value!r}")
        if len(items) == 1:
            return items[0]
        return Seq(tuple(items))

    def parse_list(self, top: bool = False) -> list:
        items: list = []
        while True:
            while self.at_separator():  # "x = 1, or x = 2"
                self.next()
            if self.at("eof") or (not top and self.tok.kind == "op" and self.tok.value in ")]}"):
                break
            if not top and self.at("cmd", "}"):
                break
            items.extend(self.parse_item_with_pm())
            if len(items) > MAX_LIST_ITEMS:
                raise TooLarge(f"more than {MAX_LIST_ITEMS} answers")
            if not self.at_separator():
                break
        return items

    def parse_item_with_pm(self) -> list:
        start = self.pos
        self.pm_seen, self.pm_sign = False, 1
        first = self.parse_item()
        if not self.pm_seen:
            return [first]
        end = self.pos
        self.pos, self.pm_sign = start, -1
        second = self.parse_item()
        assert self.pos == end
        self.pm_sign = 1
        return [first, second]

    def parse_item(self):
        """A relation chain, a set union, or a plain expression."""
        first = self.parse_setexpr()
        parts, ops = [first], []
        while True:
            t = self.tok
            op = None
            if t.kind == "op" and t.value in "=<>":
                op = t.value
            elif t.kind == "cmd" and t.value in _RELATIONS:
                op = _RELATIONS[t.value]
            if op is None:
                break
            self.next()
            ops.append(op)
            parts.append(self.parse_setexpr())
        if ops:
            return Relation(tuple(parts), tuple(ops))
        return first

    def parse_setexpr(self):
        first = self.parse_value()
        if not self.at("cmd", "cup"):
            return first
        parts = [first]
        while self.at("cmd", "cup"):
            self.next()
            parts.append(self.parse_value())
        return SetUnion(tuple(parts))

    def parse_value(self):
        """A bracketed sequence, a set, a matrix, or a scalar expression."""
        t = self.tok
        if t.kind == "cmd" and t.value == "{":
            return self.parse_set()
        if t.kind == "env_begin" and t.value in _MATRIX_ENVS:
            matrix = self.parse_matrix()
            return matrix
        if t.kind == "op" and t.value in "([":
            save = self.pos
            seq = self.try_sequence()
            if seq is not None:
                return seq
            self.pos = save
        return self.parse_scalar()

    def try_sequence(self) -> Seq | None:
        """``(a, b)``, ``[a, b)`` ...; None when the bracket holds a single expression."""
        self.enter()
        opener = self.next().value
        items = self.parse_list()
        if not (self.tok.kind == "op" and self.tok.value in ")]"):
            self.leave()
            return None
        closer = self.next().value
        self.leave()
        if len(items) < 2:
            return None
        # (1, 2) followed by an operator is not a finished sequence; let the scalar parser fail
        if not (self.at("eof") or self.at_separator() or self.at("cmd", "cup") or
                (self.tok.kind == "op" and self.tok.value in ")]=") or self.at("cmd", "}")):  # fmt: skip
            raise ParseError("a bracketed list cannot be part of an expression")
        return Seq(tuple(items), opener, closer)

    def parse_set(self) -> SetOf:
        self.enter()
        self.expect("cmd", "{")
        items = self.parse_list()
        self.expect("cmd", "}")
        self.leave()
        return SetOf(tuple(items))

    def parse_matrix(self) -> Matrix:
        self.enter()
        env = self.expect("env_begin").value
        if env == "array" and self.at("op", "{"):  # column spec {cc}
            while not self.at("op", "}"):
                if self.at("eof"):
                    raise ParseError("unterminated array")
                self.next()
            self.next()
        rows, row = [], []
        while True:
            row.append(self.parse_scalar_or_empty())
            if self.at("op", "&"):
                self.next()
                continue
            if self.at("cmd", "newrow"):
                self.next()
                rows.append(tuple(row))
                row = []
                if self.at("env_end"):
                    break
                continue
            if self.at("env_end"):
                if row != [None]:
                    rows.append(tuple(row))
                break
            raise ParseError(f"unexpected {self.tok.value!r} in a matrix")
        self.expect("env_end")
        self.leave()
        rows = [r for r in rows if r and any(x is not None for x in r)]
        if not rows or len({len(r) for r in rows}) != 1 or any(x is None for r in rows for x in r):
            raise ParseError("ragged matrix")
        return Matrix(tuple(rows))

    def parse_scalar_or_empty(self):
        if self.at("op", "&") or self.at("cmd", "newrow") or self.at("env_end"):
            return None
        return self.parse_scalar()

    # ------------------------------------------------------------------ scalars
    def parse_scalar(self) -> Scalar:
        start = self.pos
        expr = self.parse_additive()
        unit = None
        # a trailing unit word: 5 cm, 864 inches^2, 18 dollars, 270/7 degrees
        while self.tok.kind == "text" and self._is_unit(self.tok.value):
            word = self.tok.value.lower()
            if word.startswith("degree"):
                unit = "degree"
            elif word == "percent":
                unit = "percent"
            self.next()
            if self.at("op", "^"):
                self.next()
                self.parse_group_or_atom()
        if isinstance(expr, _Marked):
            if unit is not None:
                raise ParseError("two units on one number")
            return expr.finish()
        return self._scalar_from(expr, start, unit)

    def _scalar_from(self, expr, start: int, unit: str | None) -> Scalar:
        toks = self.toks[start : self.pos]
        places = sig = None
        body = [t for t in toks if not (t.kind == "op" and t.value in "+-") and t.kind != "text"]
        if len(body) == 1 and body[0].kind == "num":
            mantissa, _, exponent = body[0].value.lower().partition("e")
            if "." in mantissa:  # 1.234e5 is good to the tens: 3 places minus 5
                places = len(mantissa.split(".")[1]) - int(exponent or 0)
                sig = len(mantissa.replace(".", "").lstrip("0")) or 1
        return Scalar(expr, decimal_places=places, significant_digits=sig, unit=unit)

    @staticmethod
    def _is_unit(word: str) -> bool:
        w = word.strip().lower()
        if not w:
            return True
        parts = [p for p in re.split(r"[\s/^.\-]+", w) if p]
        return w in UNIT_WORDS or (bool(parts) and all(p in UNIT_WORDS for p in parts))

    def parse_additive(self):
        self.enter()
        left = self.parse_term()
        while True:
            t = self.tok
            if t.kind == "op" and t.value in "+-":
                self.next()
                right = self.parse_term()
                left = sympy.Add(_plain(left), _plain(right) if t.value == "+" else -_plain(right))
            elif t.kind == "cmd" and t.value in ("pm", "mp"):
                self.next()
                self.pm_seen = True
                sign = self.pm_sign if t.value == "pm" else -self.pm_sign
                left = sympy.Add(_plain(left), sign * _plain(self.parse_term()))
            else:
                break
        self.leave()
        return left

    def parse_term(self):
        self.enter()
        first_tok = self.tok
        left = self.parse_unary()
        factors = 1
        while True:
            t = self.tok
            if (t.kind == "op" and t.value == "*") or (t.kind == "cmd" and t.value in _INFIX_TIMES):
                self.next()
                left = sympy.Mul(_plain(left), _plain(self.parse_unary()))
            elif (t.kind == "op" and t.value == "/") or (t.kind == "cmd" and t.value == "div"):
                self.next()
                right = _plain(self.parse_unary())
                if right == 0:
                    raise ParseError("division by zero")
                left = sympy.Mul(_plain(left), sympy.Pow(right, -1))
            elif self.starts_implicit_factor():
                if t.kind == "num" and self.toks[self.pos - 1].kind == "num":
                    raise ParseError("two numbers side by side")
                self._int_frac = False
                right = self.parse_power()
                mixed = (
                    factors == 1
                    and first_tok.kind == "num"
                    and first_tok.value.isdigit()
                    and t.kind == "cmd"
                    and t.value == "frac"
                    and self._int_frac
                )
                if mixed:  # 12\frac{3}{5} is 12 + 3/5
                    left = sympy.Add(_plain(left), _plain(right))
                else:
                    left = sympy.Mul(_plain(left), _plain(right))
            else:
                break
            factors += 1
        self.leave()
        return left

    def starts_implicit_factor(self) -> bool:
        t = self.tok
        if t.kind in ("num", "sym", "env_begin"):
            return True
        if t.kind == "word":
            return t.value not in _SEPARATOR_WORDS
        if t.kind == "cmd":
            return t.value not in _RELATIONS and t.value not in _NOT_FACTOR_COMMANDS
        if t.kind == "op":
            return t.value in "(["
        if t.kind == "text":
            return not self._is_unit(t.value) and t.value.lower() not in _SEPARATOR_WORDS
        return False

    def parse_unary(self):
        if self.at("op", "-"):
            self.next()
            self.enter()
            value = self.parse_unary()
            self.leave()
            return value.negated() if isinstance(value, _Marked) else -value
        if self.at("op", "+"):
            self.next()
            return self.parse_unary()
        if self.at("cmd", "pm") or self.at("cmd", "mp"):  # \pm 2: two answers, 2 and -2
            sign = self.pm_sign if self.next().value == "pm" else -self.pm_sign
            self.pm_seen = True
            return sign * _plain(self.parse_unary())
        return self.parse_power()

    def parse_power(self):
        self.enter()
        base = self.parse_postfix()
        if self.at("op", "^") and not isinstance(base, _Marked):
            self.next()
            if self.at("cmd", "circ"):  # 30^\circ
                self.next()
                self.leave()
                return _Marked(base, "degree")
            if self.at("op", "{") and self.peek().kind == "cmd" and self.peek().value == "circ":
                self.next(), self.next()
                self.expect("op", "}")
                self.leave()
                return _Marked(base, "degree")
            exp = _plain(self.parse_exponent())
            _guard_power(base, exp)
            base = self.parse_postfix_ops(sympy.Pow(base, exp))
        self.leave()
        return base

    def parse_exponent(self):
        if self.at("op", "{"):
            return self.parse_group()
        if self.at("op", "-"):
            self.next()
            return -self.parse_exponent()
        t = self.tok
        if t.kind == "num":
            # x^23 in LaTeX means x^2 3; keep the first digit only
            self.next()
            if len(t.value) > 1 and t.value.isdigit():
                rest = _Token("num", t.value[1:], False)
                self.toks.insert(self.pos, rest)
                return sympy.Integer(t.value[0])
            return self._number(t.value)
        return self.parse_postfix()

    def parse_postfix(self):
        value = self.parse_primary()
        return self.parse_postfix_ops(value)

    def parse_postfix_ops(self, value):
        while True:
            if isinstance(value, _Marked) and (self.at("op", "!") or self.at("op", "%")):
                raise ParseError("a mark after a marked number")
            if self.at("op", "!"):
                self.next()
                value = self._factorial(value)
            elif self.at("op", "%"):
                self.next()
                return _Marked(value, "percent")
            elif self.at("op", "'") or self.at("cmd", "prime"):
                raise ParseError("derivatives are not supported")
            else:
                return value

    @staticmethod
    def _factorial(value):
        if isinstance(value, sympy.Integer):
            if value < 0:
                raise ParseError("factorial of a negative number")
            if value > 5000:
                raise TooLarge("factorial too large to evaluate")
        return sympy.factorial(value)

    def parse_group(self):
        self.enter()
        self.expect("op", "{")
        if self.at("op", "}"):
            raise ParseError("empty group")
        value = self.parse_plain_additive()
        self.expect("op", "}")
        self.leave()
        return value

    def parse_plain_additive(self):
        return _plain(self.parse_additive())

    def parse_group_or_atom(self):
        """A command argument: ``{...}`` or a single token (``\\frac12``, ``\\sqrt2``)."""
        t = self.tok
        if t.kind == "op" and t.value == "{":
            return self.parse_group()
        if t.kind == "num":
            self.next()
            if len(t.value) > 1 and t.value.isdigit():  # \frac12: one digit per argument
                self.toks.insert(self.pos, _Token("num", t.value[1:], False))
                return sympy.Integer(t.value[0])
            if len(t.value) > 1:
                raise ParseError(f"ambiguous command argument {t.value!r}")
            return self._number(t.value)
        return self.parse_primary()

    def parse_primary(self):
        self.enter()
        try:
            return self._primary()
        finally:
            self.leave()

    def _primary(self):
        t = self.tok
        if t.kind == "num":
            self.next()
            value = self._number(t.value)
            if self.at("op", "_"):  # 52_8: a number in base 8
                self.next()
                base = self.parse_group_or_atom()
                return _Marked(value, "base", base=base, digits=t.value)
            return value
        if t.kind == "sym":
            self.next()
            sym = self._subscripted(t.value)
            return self._primed(sym if sym is not None else self._symbol(t.value))
        if t.kind == "word":
            return self._word()
        if t.kind == "text":
            self.next()
            content = t.value.strip()
            if len(content) == 1 and content.isalpha():
                return self._symbol(content)
            if content.lower() in _FUNCTIONS:
                return self._apply_function(content.lower())
            raise ParseError(f"text {content!r} inside an expression")
        if t.kind == "op":
            if t.value == "(" or t.value == "[":
                self.next()
                value = self.parse_plain_additive()
                self.expect("op", ")" if t.value == "(" else "]")
                return value
            if t.value == "{":
                return self.parse_group()
            if t.value == "|":
                self.next()
                value = self.parse_plain_additive()
                self.expect("op", "|")
                return sympy.Abs(value)
            raise ParseError(f"unexpected {t.value!r}")
        if t.kind == "cmd":
            return self._command()
        raise ParseError(f"unexpected {t.value or 'end of answer'!r}")

    def _number(self, text: str):
        mantissa, _, exponent = text.replace("E", "e").partition("e")
        digits = mantissa.replace(".", "")
        if len(digits) > MAX_LITERAL_DIGITS:
            raise TooLarge(f"a number with more than {MAX_LITERAL_DIGITS} digits")
        if "." in mantissa:
            whole, frac = mantissa.split(".")
            value = sympy.Rational(
                int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac)
            )
        else:
            value = sympy.Integer(int(mantissa))
        if exponent:
            e = int(exponent)
            if abs(e) > MAX_RESULT_DIGITS:
                raise TooLarge("exponent too large")
            value = value * sympy.Integer(10) ** e
        return value

    @staticmethod
    def _symbol(name: str):
        if name in _SUBSTITUTE_SYMBOLS:
            return _SUBSTITUTE_SYMBOLS[name]
        return sympy.Symbol(name)

    def _primed(self, symbol):
        """y' and y^\\prime are names of their own (a derivative is not evaluated)."""
        if not isinstance(symbol, sympy.Symbol):
            return symbol
        primes = 0
        while True:
            if self.at("op", "'"):
                self.next()
                primes += 1
            elif self.at("op", "^") and self.peek().kind == "cmd" and self.peek().value == "prime":
                self.next(), self.next()
                primes += 1
            elif (self.at("op", "^") and self.peek().kind == "op" and self.peek().value == "{"
                  and self.peek(2).kind == "cmd" and self.peek(2).value == "prime"):  # fmt: skip
                self.next(), self.next()
                while self.at("cmd", "prime"):
                    self.next()
                    primes += 1
                self.expect("op", "}")
            else:
                break
        return sympy.Symbol(symbol.name + "'" * primes) if primes else symbol

    def _subscripted(self, name: str):
        if self.at("op", "_"):
            self.next()
            sub = self._raw_argument()
            return sympy.Symbol(f"{name}_{sub}")
        return None

    def _raw_argument(self) -> str:
        """The literal text of a subscript: ``{max}``, ``1``, ``n``."""
        t = self.tok
        if t.kind == "op" and t.value == "{":
            self.next()
            parts, depth = [], 1
            while True:
                t = self.next()
                if t.kind == "eof":
                    raise ParseError("unbalanced subscript")
                if t.kind == "op" and t.value == "{":
                    depth += 1
                elif t.kind == "op" and t.value == "}":
                    depth -= 1
                    if depth == 0:
                        break
                parts.append(t.value)
            return "".join(parts)
        self.next()
        return t.value

    def _word(self):
        t = self.next()
        if t.value in _CONSTANT_WORDS:
            return _CONSTANT_WORDS[t.value]
        return self._apply_function(t.value)

    def _apply_function(self, name: str):
        if name == "sqrt":
            return sympy.sqrt(self._function_argument())
        if name in ("log", "lg"):
            return self._log(default_base=10 if name == "lg" else None)
        if name in ("gcd", "lcm", "max", "min"):
            self.expect("op", "(")
            args = self.parse_list()
            self.expect("op", ")")
            if not args or not all(isinstance(a, Scalar) for a in args):
                raise ParseError(f"bad arguments to {name}")
            fn = {"gcd": sympy.gcd, "lcm": sympy.lcm, "max": sympy.Max, "min": sympy.Min}[name]
            exprs = [a.expr for a in args]
            result = exprs[0]
            for e in exprs[1:]:
                result = fn(result, e)
            return result
        if name == "deg":
            raise ParseError("deg is not a value")
        fn = _SYMPY_FUNCS.get(name)
        if fn is None:
            raise ParseError(f"unknown function {name!r}")
        power = None
        if self.at("op", "^"):  # \sin^2 x
            self.next()
            power = self.parse_exponent()
        arg = self._function_argument()
        value = fn(arg)
        if power is not None:
            if power == -1 and name in ("sin", "cos", "tan"):
                value = {"sin": sympy.asin, "cos": sympy.acos, "tan": sympy.atan}[name](arg)
            else:
                _guard_power(value, power)
                value = sympy.Pow(value, power)
        return value

    def _function_argument(self):
        """``f(x)``, ``f{x}``, or ``f x`` / ``f 2x`` (a product of factors)."""
        if self.at("op", "("):
            self.next()
            value = self.parse_plain_additive()
            self.expect("op", ")")
            return value
        if self.at("op", "{"):
            return self.parse_group()
        value = self.parse_power()
        while self.tok.kind in ("num", "sym") or (
            self.tok.kind == "cmd" and self.tok.value in _GREEK | {"pi"}
        ):
            value = sympy.Mul(value, self.parse_power())
        return value

    def _log(self, default_base):
        base = default_base
        if self.at("op", "_"):
            self.next()
            base = self.parse_group_or_atom()
        power = None
        if self.at("op", "^"):
            self.next()
            power = self.parse_exponent()
        arg = self._function_argument()
        value = sympy.log(arg) if base is None else sympy.log(arg, base)
        if power is not None:
            _guard_power(value, power)
            value = sympy.Pow(value, power)
        return value

    def _command(self):
        t = self.next()
        name = t.value
        if name == "frac" or name == "cfrac":
            num = self.parse_group_or_atom()
            den = self.parse_group_or_atom()
            if den == 0:
                raise ParseError("division by zero")
            value = sympy.Mul(num, sympy.Pow(den, -1))
            self._int_frac = isinstance(num, sympy.Integer) and isinstance(den, sympy.Integer)
            return value
        if name == "sqrt":
            index = None
            if self.at("op", "["):
                self.next()
                index = self.parse_plain_additive()
                self.expect("op", "]")
            arg = self.parse_group_or_atom()
            if index is None:
                return sympy.sqrt(arg)
            _guard_power(arg, sympy.Pow(index, -1))
            return sympy.root(arg, index)
        if name == "binom":
            n = self.parse_group_or_atom()
            k = self.parse_group_or_atom()
            if isinstance(n, sympy.Integer) and n > 5000:
                raise TooLarge("binomial too large to evaluate")
            return sympy.binomial(n, k)
        if name == "pi":
            return sympy.pi
        if name == "infty":
            return sympy.oo
        if name in ("emptyset", "varnothing"):
            raise _EmptySet()
        if name in _GREEK:
            sym = self._subscripted(name)
            return self._primed(sym if sym is not None else sympy.Symbol(name))
        if name in _DECORATIONS:  # \dot{x}, \overline{AB}: a name of its own
            inner = self._raw_argument()
            sym = self._subscripted(f"{name}({inner})")
            return self._primed(sym if sym is not None else sympy.Symbol(f"{name}({inner})"))
        if name == "log" or name == "lg":
            return self._log(default_base=10 if name == "lg" else None)
        if name in _SYMPY_FUNCS or name in ("gcd", "max", "min", "exp", "ln"):
            return self._apply_function(name)
        if name == "lfloor":
            value = self.parse_plain_additive()
            self.expect("cmd", "rfloor")
            return sympy.floor(value)
        if name == "lceil":
            value = self.parse_plain_additive()
            self.expect("cmd", "rceil")
            return sympy.ceiling(value)
        if name in ("angle", "triangle"):
            raise ParseError(f"\\{name} is not a value")
        if name == "circ":
            raise ParseError("a lone degree sign")
        raise ParseError(f"unknown command \\{name}")


class _EmptySet(Exception):
    pass


class _Marked:
    """A number that ends in a mark (30^\\circ, 20%, 52_8); it must end its scalar."""

    def __init__(self, expr, unit: str, base=None, digits=None):
        self.expr, self.unit, self.base, self.digits = expr, unit, base, digits

    def negated(self) -> _Marked:
        return _Marked(-self.expr, self.unit, self.base, self.digits)

    def finish(self) -> Scalar:
        if self.unit == "base":
            if not isinstance(self.base, sympy.Integer) or not 2 <= int(self.base) <= 36:
                raise ParseError("bad number base")
            return Scalar(self.expr, base=int(self.base), digits=self.digits)
        return Scalar(self.expr, unit=self.unit)


def _plain(value):
    if isinstance(value, _Marked):
        raise ParseError("a unit or base mark inside an expression")
    return value


def parse_answer(text: str):
    """Parse one answer (already extracted from a response) into a comparable value."""
    if len(text) > MAX_ANSWER_CHARS:
        raise TooLarge(f"answer longer than {MAX_ANSWER_CHARS} characters")
    s = clean(text)
    if not s:
        raise ParseError("empty answer")
    choice = re.fullmatch(r"\(?([A-Ea-e])\)?|\\text\{\s*\(?([A-E])\)?\s*\}", s)
    if choice and s not in "abcde":
        return Text((choice.group(1) or choice.group(2)).upper())
    if is_text_answer(s):
        return Text(normalize_text(s))
    parser = _Parser(tokenize(s))
    try:
        value = parser.parse_answer()
    except _EmptySet:
        if re.fullmatch(r"\\(?:emptyset|varnothing)|\\\{\s*\\\}", s):
            return SetOf(())
        raise ParseError("empty set inside an expression") from None
    except RecursionError:
        raise TooLarge("expression nested too deeply") from None
    return value


def is_text_answer(text: str) -> bool:
    """Words rather than math: ``Evelyn``, ``\\text{east}``, ``odd``."""
    s = re.sub(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", clean(text))
    if "\\" in s:
        return False
    words = s.replace(" ", "")
    return (
        len(words) >= 3 and words.isalpha() and words.lower() not in _FUNCTIONS
        and words.lower() not in _CONSTANT_WORDS
    )  # fmt: skip
