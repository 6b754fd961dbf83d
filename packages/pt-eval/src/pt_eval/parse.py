"""LaTeX and plain-text math answers into values we can compare, without ``eval``.

A small tokenizer and a recursive-descent parser build sympy objects directly
from their constructors (``Integer``, ``Rational``, ``Add``, ``Mul``, ``Pow``,
``Symbol``...). Nothing here passes model text to ``eval``, ``sympify`` or
``parse_expr``, so a prediction like ``__import__('os').system(...)`` is only
ever a product of symbols.

The result of :func:`parse_answer` is one of the small value types below:

- :class:`Scalar`: a sympy expression, with a note of how it was written (a
  decimal with its digits, a percentage, degrees, a number in another base, a unit);
- :class:`Seq`: items in brackets, ``(1, 2)``, ``[0, 1)``, or a bare list ``1, 2``;
- :class:`SetOf`: ``\\{1, 2\\}``; :class:`SetBuilder`: ``\\{x \\mid x > 2\\}``;
- :class:`Matrix`: ``\\begin{pmatrix} ... \\end{pmatrix}``, ``\\langle 1, 2\\rangle``, and
  sums, scalar multiples, products and transposes of them;
- :class:`Relation`: ``y = 2x + 1``, ``0 < x \\le 3``, ``x \\in [2, 5)``;
- :class:`SetOp`: ``(-\\infty, 2) \\cup (3, \\infty)``, ``\\mathbb{R} \\setminus \\{0\\}``;
- :class:`Ratio`: ``3:4``; :class:`Choice`: ``\\textbf{(B)}\\ 27``;
- :class:`Text`: words, ``\\text{Evelyn}``, a multiple-choice letter.

Work is bounded: the input length, nesting depth, literal length and the size
of every exact power or factorial are limited, and going past a limit raises
:class:`TooLarge` instead of computing for ever.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import TypeGuard

import sympy

from pt_eval.normalize import (
    CHOICE,
    CURRENCIES,
    MAX_ANSWER_CHARS,
    clean,
    normalize_text,
    strip_text_wrappers,
)
from pt_eval.numbers import DEGREE_WORDS, NOT_UNITS, PERCENT_WORDS, TWO_LETTER_UNITS

MAX_DEPTH = 60  # brackets, braces and operators nested deeper than this are refused
MAX_LITERAL_DIGITS = 4_000  # Python refuses to read longer integers anyway
MAX_RESULT_DIGITS = 20_000  # largest exact integer a power or factorial may build
MAX_LIST_ITEMS = 200
MAX_PM_SIGNS = 4  # independent plus-minus signs in one item (16 values)
MAX_SUM_TERMS = 1_000  # a sum with numeric limits is added up when it has at most this many


class ParseError(ValueError):
    """The text is not a math answer this parser understands."""


class TooLarge(ValueError):
    """The answer asks for more work than a grader should do (huge power, deep nesting)."""


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Scalar:
    expr: sympy.Expr
    decimal_places: int | None = None  # set when written as a plain decimal, e.g. 0.333 -> 3
    significant_digits: int | None = None
    unit: str | None = None  # "percent" or "degree" when written with % or ^\circ
    base: int | None = None  # 52_8 is the digits 52 in base 8
    digits: str | None = None
    unit_word: str | None = None  # cm, dollar, \text{ apples}: any unit after the number


@dataclass(frozen=True)
class Seq:
    items: tuple
    open: str = ""  # "(", "[" or "" for a bare comma list
    close: str = ""
    seps: tuple = ()  # the words that joined a bare list ("and", "or"), if any


@dataclass(frozen=True)
class SetOf:
    items: tuple


@dataclass(frozen=True)
class SetBuilder:
    var: sympy.Symbol
    condition: object  # a Relation, or a Seq of relations joined by "or" / "and"


@dataclass(frozen=True)
class Matrix:
    rows: tuple  # tuple of tuples of values


@dataclass(frozen=True)
class Relation:
    parts: tuple  # values, len(ops) + 1 of them
    ops: tuple  # "=", "<", "<=", ">", ">=", "!=", "in"


@dataclass(frozen=True)
class SetOp:
    parts: tuple  # intervals, sets, number sets
    ops: tuple  # "cup", "cap", "setminus" between them


@dataclass(frozen=True)
class NumberSet:
    name: str  # R, Z, N, Q, C


@dataclass(frozen=True)
class Ratio:
    parts: tuple  # Scalars: 3:4 is (3, 4)


@dataclass(frozen=True)
class Choice:
    letter: str
    value: object  # what follows the letter: \text{(C) } 12


@dataclass(frozen=True)
class Text:
    text: str


@dataclass
class _Token:
    kind: str  # num, sym, word, cmd, text, op, env_begin, env_end, eof
    value: str
    space_before: bool = False
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- tokenizer

# Words read as one token in plain text (longer letter runs are text, not products).
_FUNCTIONS = {
    "sin", "cos", "tan", "cot", "sec", "csc", "arcsin", "arccos", "arctan", "arccot", "arcsec",
    "arccsc", "sinh", "cosh", "tanh", "coth", "log", "ln", "lg", "exp", "sqrt", "gcd", "lcm",
    "max", "min", "floor", "ceil", "abs", "deg",
}  # fmt: skip
_CONSTANT_WORDS = {"pi": sympy.pi, "infty": sympy.oo, "infinity": sympy.oo, "inf": sympy.oo}
_SEPARATOR_WORDS = {"or", "and"}
_TEXT_COMMANDS = {"text", "textbf", "textit", "textrm", "mathrm", "mbox", "operatorname",
                  "textnormal", "textsf", "texttt", "hbox"}  # fmt: skip
_DROPPED_COMMANDS = {"dots", "ldots", "cdots"}
_SUBSTITUTE_SYMBOLS = {"e": sympy.E, "i": sympy.I}
_FUNCTION_LETTERS = set("fgh") | set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


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
            if m is None:  # a digit Python knows but a number does not use: ①, ¹
                raise ParseError(f"unexpected character {c!r}")
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
            elif (len(run) == 2 and run not in TWO_LETTER_UNITS) or (
                run.isupper() and len(run) <= 4
            ):
                # ab is a*b; AB, ABC are segment and polygon names, products of points
                tokens.append(_Token("sym", run[0], space))
                tokens.extend(_Token("sym", ch, False) for ch in run[1:])
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
            if name in _TEXT_COMMANDS:
                content, i = _read_group(s, i)
                tokens.append(_Token("text", content.strip(), space, {"command": name}))
            elif name in ("begin", "end"):
                env, i = _read_group(s, i)
                tokens.append(_Token("env_" + name, env.strip().rstrip("*"), space))
            elif name not in _DROPPED_COMMANDS:
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
              "approx": "~", "equiv": "=", "simeq": "~", "sim": "~"}  # fmt: skip
_INFIX_TIMES = {"cdot", "times", "ast"}
_NOT_FACTOR_COMMANDS = {
    "pm", "mp", "cup", "cap", "newrow", "}", "cdot", "times", "div", "ast", "to", "rfloor",
    "rceil", "circ", "setminus", "rangle", "mid", *CURRENCIES,
}  # fmt: skip
_DECORATIONS = {
    "overline", "vec", "hat", "bar", "widehat", "overrightarrow", "mathring", "dot", "ddot",
    "tilde", "widetilde", "underline",
}  # fmt: skip
_MATRIX_ENVS = {"pmatrix", "bmatrix", "matrix", "vmatrix", "Bmatrix", "smallmatrix", "array"}
_TRANSPOSE = {"T", "top", "intercal", "mathsf{T}"}
_NUMBER_SETS = {"setR": "R", "setZ": "Z", "setN": "N", "setQ": "Q", "setC": "C"}


def _log10_abs(value: sympy.Basic) -> float | None:
    """log10 of |value| for a rational value, without building huge decimals."""
    if not isinstance(value, sympy.Rational) or value == 0:
        return None
    p, q = abs(int(value.p)), int(value.q)
    return (p.bit_length() - q.bit_length()) * math.log10(2)


def _guard_power(base: sympy.Basic, exp: sympy.Basic) -> None:
    """Refuse an exact power whose result would have more than MAX_RESULT_DIGITS digits.
    (An irrational exponent stays unevaluated; the worker's time limit bounds the rest.)"""
    if not (isinstance(exp, sympy.Number) and getattr(base, "is_number", False)):
        return
    if isinstance(base, sympy.Rational):
        size = _log10_abs(base)
        if size is None or abs(size) < 1e-12:
            return
        if abs(float(exp)) * (abs(size) + 1) > MAX_RESULT_DIGITS:
            raise TooLarge("power too large to evaluate exactly")
    elif abs(exp) > MAX_RESULT_DIGITS:
        raise TooLarge("exponent too large")


def _is_matrix(value) -> TypeGuard[sympy.MatrixBase]:
    return isinstance(value, sympy.MatrixBase)


def _arith(op: str, left, right):
    """left op right for expressions and matrices; a shape mismatch is a parse error."""
    try:
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            if _is_matrix(left) and _is_matrix(right):
                return left * right
            return left * right
        if op == "/":
            if _is_matrix(right):
                raise ParseError("division by a matrix")
            if right == 0:
                raise ParseError("division by zero")
            return left * sympy.Pow(right, -1) if not _is_matrix(left) else left / right
    except (TypeError, ValueError, sympy.ShapeError) as exc:
        if isinstance(exc, ParseError):
            raise
        raise ParseError(f"cannot combine these values ({type(exc).__name__})") from None
    raise AssertionError(op)


class _Parser:
    def __init__(self, tokens: list[_Token], plain_letters: frozenset = frozenset()):
        self.toks = tokens
        self.pos = 0
        self.depth = 0
        self.pm_sign = 1  # \pm read as + on a first pass, - on a second
        self.pm_seen = False
        self.pm_count = 0  # \pm signs met in this reading
        self.mp_seen = False
        self.pm_signs: tuple | None = None  # a sign per \pm, when they are independent
        self.plain_letters = plain_letters  # capitals the gold uses as symbols: never called
        self.pm_level = 0  # items inside an item being read for \pm are not split again
        self._int_frac = False  # the last \frac read had integer parts (for mixed numbers)
        self.currency: str | None = None  # \$18: the whole answer is in dollars
        kept = []
        for t in tokens:
            if t.kind == "cmd" and t.value in CURRENCIES:
                if self.currency not in (None, CURRENCIES[t.value]):
                    raise ParseError("two currencies in one answer")
                self.currency = CURRENCIES[t.value]
            else:
                kept.append(t)
        self.toks = kept

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

    def at_scalar_end(self, k: int = 0) -> bool:
        """The token k ahead ends a scalar (for a trailing % that marks the whole value)."""
        t = self.peek(k)
        return (
            t.kind == "eof"
            or (t.kind == "op" and t.value in ",;)]}=<>:|")
            or (t.kind == "word" and t.value in _SEPARATOR_WORDS)
            or (t.kind == "text")
            or (t.kind == "cmd" and (t.value in _RELATIONS or t.value in ("cup", "newrow", "}")))
            or t.kind == "env_end"
            or (t.kind == "op" and t.value == "&")
        )

    # ------------------------------------------------------------------ answer
    def parse_answer(self):
        items, seps = self.parse_list(top=True)
        if not self.at("eof"):
            raise ParseError(f"unexpected {self.tok.value!r}")
        if len(items) == 1:
            return items[0]
        return Seq(tuple(items), seps=tuple(seps))

    def parse_list(self, top: bool = False) -> tuple[list, list]:
        items: list = []
        seps: list[str] = []
        while True:
            while self.at_separator():  # "x = 1, or x = 2"
                t = self.next()
                if t.kind != "op":
                    seps.append(t.value.lower())
            if self.at("eof") or (not top and self.tok.kind == "op" and self.tok.value in ")]}"):
                break
            if not top and (self.at("cmd", "}") or self.at("cmd", "rangle")):
                break
            items.extend(self.parse_item_with_pm())
            if len(items) > MAX_LIST_ITEMS:
                raise TooLarge(f"more than {MAX_LIST_ITEMS} answers")
            if not self.at_separator():
                break
        return items, seps

    def parse_item_with_pm(self) -> list:
        """An item with \\pm read once per sign: two values for one sign (a \\mp goes
        with it), four for two independent signs (\\pm 1 \\pm \\sqrt2), and so on."""
        if self.pm_level:  # inside (\pm 1, 2): the enclosing item is read twice instead
            return [self.parse_item()]
        start = self.pos
        self.pm_seen, self.pm_sign, self.pm_count, self.mp_seen = False, 1, 0, False
        self.pm_signs = None
        self.pm_level += 1
        try:
            first = self.parse_item()
            if not self.pm_seen:
                return [first]
            end = self.pos
            if self.pm_count > 1 and not self.mp_seen and self.pm_count <= MAX_PM_SIGNS:
                values = [first]
                for combo in itertools.product((1, -1), repeat=self.pm_count):
                    if all(sign == 1 for sign in combo):
                        continue
                    self.pos, self.pm_signs, self.pm_count = start, combo, 0
                    values.append(self.parse_item())
                    if self.pos != end:
                        raise ParseError("a plus-minus read two ways")
                return values
            self.pos, self.pm_sign = start, -1
            second = self.parse_item()
            if self.pos != end:
                raise ParseError("a plus-minus read two ways")
        finally:
            self.pm_level -= 1
            self.pm_sign = 1
            self.pm_signs = None
        return [first, second]

    def _pm(self, name: str) -> int:
        """The sign a \\pm or \\mp stands for in this reading of the item."""
        self.pm_seen = True
        if name == "mp":
            self.mp_seen = True
            return -self.pm_sign
        index = self.pm_count
        self.pm_count += 1
        if self.pm_signs is not None:
            return self.pm_signs[index]
        return self.pm_sign

    def parse_item(self):
        """A relation chain, a ratio, a set expression, or a plain expression."""
        first = self._ratio(self.parse_setexpr())
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
            parts.append(self._ratio(self.parse_setexpr()))
        if not ops:
            return first
        return _drop_approximation(Relation(tuple(parts), tuple(ops)))

    def _ratio(self, first):
        """``3:4``, ``S_{MBCN}:S``: a value followed by colons and more values."""
        if not (self.at("op", ":") and isinstance(first, Scalar)):
            return first
        parts: list[Scalar | Matrix] = [first]
        while self.at("op", ":"):
            self.next()
            parts.append(self.parse_scalar())
        return Ratio(tuple(parts))

    def parse_setexpr(self):
        first = self.parse_value()
        parts, ops = [first], []
        while self.tok.kind == "cmd" and self.tok.value in ("cup", "cap", "setminus"):
            ops.append(self.next().value)
            parts.append(self.parse_value())
        if not ops:
            return first
        return SetOp(tuple(parts), tuple(ops))

    def parse_value(self):
        """A bracketed sequence, a set, a number set, or a scalar expression."""
        t = self.tok
        if t.kind == "cmd" and t.value == "{":
            return self.parse_set()
        if t.kind == "cmd" and t.value in _NUMBER_SETS:
            self.next()
            return NumberSet(_NUMBER_SETS[t.value])
        if t.kind == "op" and t.value in "([{":
            save = self.pos
            seq = self.try_sequence()
            if seq is not None:
                return seq
            self.pos = save
        return self.parse_scalar()

    def try_sequence(self) -> Seq | Matrix | None:
        """``(a, b)``, ``[a, b)``, ``{1, 2}`` ...; None when the bracket holds one expression."""
        self.enter()
        opener = self.next().value
        items, _ = self.parse_list()
        if not (self.tok.kind == "op" and self.tok.value in ")]}"):
            self.leave()
            return None
        closer = self.next().value
        self.leave()
        if len(items) < 2 or (opener == "{") != (closer == "}"):
            return None
        if opener == "(" and self.at("op", "^") and all(isinstance(i, Scalar) for i in items):
            self.next()
            if not self._at_transpose():
                raise ParseError("a power of a bracketed list")
            return Matrix(tuple((item,) for item in items))  # (1, 2, 3)^T: a column
        # (1, 2) followed by an operator is not a finished sequence; let the scalar parser fail
        if not (self.at("eof") or self.at_separator() or
                (self.tok.kind == "cmd" and self.tok.value in ("cup", "cap", "setminus")) or
                (self.tok.kind == "op" and self.tok.value in ")]}=") or self.at("cmd", "}")
                or self.at("cmd", "rangle")):  # fmt: skip
            raise ParseError("a bracketed list cannot be part of an expression")
        if opener == "{":  # {1, 2} without backslashes: braces LaTeX does not print
            return Seq(tuple(items))
        return Seq(tuple(items), opener, closer)

    def parse_set(self):
        self.enter()
        self.expect("cmd", "{")
        builder = self._set_builder()
        if builder is not None:
            self.leave()
            return builder
        # \{1 \pm \sqrt5, -2\}: a \pm gives two elements of the set, not two sets
        saved = (self.pm_level, self.pm_seen, self.pm_sign, self.pm_count, self.mp_seen,
                 self.pm_signs)  # fmt: skip
        self.pm_level, self.pm_sign = 0, 1
        try:
            items, _ = self.parse_list()
        finally:
            (self.pm_level, self.pm_seen, self.pm_sign, self.pm_count, self.mp_seen,
             self.pm_signs) = saved  # fmt: skip
        self.expect("cmd", "}")
        self.leave()
        return SetOf(tuple(items))

    def _set_builder(self) -> SetBuilder | None:
        """``\\{x \\mid x > 2\\}``, ``\\{x : x < 0 \\text{ or } x > 1\\}``, ``\\{x \\in \\mathbb{R} | ...\\}``."""
        if self.tok.kind != "sym":
            return None
        k = 1
        if self.peek(1).kind == "cmd" and self.peek(1).value == "in":
            if not (self.peek(2).kind == "cmd" and self.peek(2).value in _NUMBER_SETS):
                return None
            k = 3
        marker = self.peek(k)
        if not ((marker.kind == "op" and marker.value in ":|") or
                (marker.kind == "cmd" and marker.value == "mid")):  # fmt: skip
            return None
        var = sympy.Symbol(self.tok.value)
        for _ in range(k + 1):
            self.next()
        items, seps = self.parse_list()
        self.expect("cmd", "}")
        condition = items[0] if len(items) == 1 else Seq(tuple(items), seps=tuple(seps))
        return SetBuilder(var, condition)

    def parse_matrix_rows(self) -> sympy.ImmutableMatrix:
        self.enter()
        env = self.expect("env_begin").value
        if env not in _MATRIX_ENVS:
            raise ParseError(f"unknown environment {env!r}")
        if env == "array" and self.at("op", "{"):  # column spec {cc}
            while not self.at("op", "}"):
                if self.at("eof"):
                    raise ParseError("unterminated array")
                self.next()
            self.next()
        rows, row = [], []
        while True:
            row.append(self.parse_entry())
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
        return sympy.ImmutableMatrix(rows)

    def parse_entry(self):
        if self.at("op", "&") or self.at("cmd", "newrow") or self.at("env_end"):
            return None
        value = self.parse_plain_additive()
        if _is_matrix(value):
            raise ParseError("a matrix inside a matrix")
        return value

    # ------------------------------------------------------------------ scalars
    def parse_scalar(self):
        start = self.pos
        expr = self.parse_additive()
        unit = None
        unit_words = []
        if self.at("op", "%"):
            self.next()
            unit = "percent"
        # a trailing unit: 5 cm, 864 inches^2, 18 dollars, 270/7 degrees, 3 \text{ apples}
        while self.tok.kind == "text" and not self.at_separator():
            t = self.next()
            word = t.value.strip().lower()
            if word in ("%", "\\%") or word in PERCENT_WORDS:
                unit = "percent" if unit is None else _two_units()
            elif word in DEGREE_WORDS:
                unit = "degree" if unit is None else _two_units()
            elif word in NOT_UNITS or any(w in NOT_UNITS for w in word.split()):
                raise ParseError(f"{word!r} after a value")
            else:
                unit_words.append(t.value)
            if self.at("op", "^"):
                self.next()
                power = self.parse_group_or_atom()
                unit_words.append(f"^{power}")
        unit_word = " ".join(unit_words) or self.currency
        if _is_matrix(expr):
            if unit is not None:
                raise ParseError("a unit on a matrix")
            return Matrix(tuple(tuple(Scalar(x) for x in row) for row in expr.tolist()))
        if isinstance(expr, _Marked):
            if unit is not None:
                raise ParseError("two units on one number")
            return expr.finish(unit_word)
        return self._scalar_from(expr, start, unit, unit_word)

    def _scalar_from(self, expr, start: int, unit: str | None, unit_word) -> Scalar:
        toks = self.toks[start : self.pos]
        places = sig = None
        body = [
            t for t in toks
            if not (t.kind == "op" and t.value in "+-")
            and t.kind != "text"
            and not (t.kind == "cmd" and t.value in CURRENCIES)
        ]  # fmt: skip
        if len(body) == 1 and body[0].kind == "num" and unit is None:
            mantissa, _, exponent = body[0].value.lower().partition("e")
            if "." in mantissa:  # 1.234e5 is good to the tens: 3 places minus 5
                places = len(mantissa.split(".")[1]) - int(exponent or 0)
                sig = len(mantissa.replace(".", "").lstrip("0")) or 1
        return Scalar(
            expr, decimal_places=places, significant_digits=sig, unit=unit, unit_word=unit_word
        )

    def parse_additive(self):
        self.enter()
        left = self.parse_term()
        while True:
            t = self.tok
            if t.kind == "op" and t.value in "+-":
                self.next()
                right = self.parse_term()
                left = _arith(t.value, _plain(left), _plain(right))
            elif t.kind == "cmd" and t.value in ("pm", "mp"):
                self.next()
                sign = self._pm(t.value)
                left = _arith("+", _plain(left), sign * _plain(self.parse_term()))
            else:
                break
        self.leave()
        return left

    def parse_term(self):
        self.enter()
        start = self.pos
        left = self.parse_unary()
        # a bare integer (maybe negated) can start a mixed number: -2\frac12, 1 4/5
        lead = self.toks[start : self.pos]
        integer_lead = (
            [t.kind for t in lead] in (["num"], ["op", "num"])
            and lead[-1].value.isdigit()
            and (lead[0].kind == "num" or lead[0].value == "-")
            and not isinstance(left, _Marked)
        )
        factors = 1
        while True:
            t = self.tok
            if (t.kind == "op" and t.value == "*") or (t.kind == "cmd" and t.value in _INFIX_TIMES):
                self.next()
                left = _arith("*", _plain(left), _plain(self.parse_unary()))
            elif (t.kind == "op" and t.value == "/") or (t.kind == "cmd" and t.value == "div"):
                self.next()
                left = _arith("/", _plain(left), _plain(self.parse_unary()))
            elif (
                factors == 1
                and integer_lead
                and not isinstance(left, _Marked)  # still the lead integer
                and self._at_plain_fraction()
            ):
                # 1 4/5: a whole number and a fraction written apart
                num = sympy.Integer(self.next().value)
                self.next()
                den = sympy.Integer(self.next().value)
                if den == 0:
                    raise ParseError("division by zero")
                left = left + num / den if left >= 0 else left - num / den
            elif self.starts_implicit_factor():
                if t.kind == "num" and self.toks[self.pos - 1].kind == "num":
                    raise ParseError("two numbers side by side")
                self._int_frac = False
                right = self.parse_power()
                mixed = factors == 1 and integer_lead and t.kind == "cmd" and t.value == "frac"
                if (
                    mixed
                    and not isinstance(left, _Marked)  # still the lead integer
                    and self._int_frac
                    and not isinstance(right, _Marked)
                    and right >= 0
                ):
                    # 12\frac{3}{5} is 12 + 3/5, and -2\frac12 is -(2 + 1/2)
                    left = left + right if left >= 0 else left - right
                else:
                    left = _arith("*", _plain(left), _plain(right))
            else:
                break
            factors += 1
        self.leave()
        return left

    def _at_plain_fraction(self) -> bool:
        t0, t1, t2 = self.tok, self.peek(1), self.peek(2)
        return (
            t0.kind == "num" and t0.space_before and t0.value.isdigit()
            and t1.kind == "op" and t1.value == "/"
            and t2.kind == "num" and t2.value.isdigit()
            and self.at_scalar_end(3)
        )  # fmt: skip

    def starts_implicit_factor(self) -> bool:
        t = self.tok
        if t.kind in ("num", "sym", "env_begin"):
            return True
        if t.kind == "word":
            return t.value not in _SEPARATOR_WORDS
        if t.kind == "cmd":
            return (
                t.value not in _RELATIONS
                and t.value not in _NOT_FACTOR_COMMANDS
                and t.value not in _NUMBER_SETS
            )
        if t.kind == "op":
            return t.value in "(["
        if t.kind == "text":  # \mathrm{e}, \operatorname{sin}; \text{ m} and words are units
            content = t.value.strip()
            if t.extra.get("command") in ("mathrm", "operatorname"):
                return (len(content) == 1 and content.isalpha()) or content.lower() in _FUNCTIONS
            return False
        return False

    def parse_unary(self):
        if self.at("op", "-"):
            self.next()
            self.enter()
            value = self.parse_unary()
            self.leave()
            return value.negated() if isinstance(value, _Marked) else _arith("*", -1, value)
        if self.at("op", "+"):
            self.next()
            return self.parse_unary()
        if self.at("cmd", "pm") or self.at("cmd", "mp"):  # \pm 2: two answers, 2 and -2
            sign = self._pm(self.next().value)
            return _arith("*", sign, _plain(self.parse_unary()))
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
                self.next()  # {
                self.next()  # \circ
                self.expect("op", "}")
                self.leave()
                return _Marked(base, "degree")
            if self._at_transpose():
                if not _is_matrix(base):
                    raise ParseError("a transpose of a non-matrix")
                base = base.T
            else:
                if _is_matrix(base):
                    raise ParseError("a power of a matrix")
                exp = _plain(self.parse_exponent())
                _guard_power(base, exp)
                base = self.parse_postfix_ops(sympy.Pow(_plain(base), exp))
        self.leave()
        return base

    def _at_transpose(self) -> bool:
        t = self.tok
        if (t.kind == "sym" and t.value == "T") or (t.kind == "cmd" and t.value in _TRANSPOSE):
            self.next()
            return True
        if t.kind == "op" and t.value == "{":
            inner, close = self.peek(1), self.peek(2)
            if (
                close.kind == "op"
                and close.value == "}"
                and (
                    (inner.kind == "sym" and inner.value == "T")
                    or (inner.kind == "cmd" and inner.value in _TRANSPOSE)
                )
            ):
                self.next()  # {
                self.next()  # T
                self.next()  # }
                return True
        return False

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
                if self.at_scalar_end(1):
                    return value  # 20% at the end marks the whole value (parse_scalar)
                self.next()
                value = _plain(value) / 100  # 100\% - 72\%: percentages inside a formula
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
        if _is_matrix(value):
            raise ParseError("factorial of a matrix")
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
        return _plain(self.parse_primary())

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
            named = self._primed(sym if sym is not None else self._symbol(t.value))
            return self._applied(t.value, named)
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
        if t.kind == "env_begin":
            return self.parse_matrix_rows()
        if t.kind == "op":
            if t.value == "(" or t.value == "[":
                start = self.pos
                self.next()
                value = self.parse_plain_additive()
                self.expect("op", ")" if t.value == "(" else "]")
                inner = self.toks[start + 1 : self.pos - 1]
                if (self.at("op", "_") and len(inner) == 1 and inner[0].kind == "num"
                        and inner[0].value.isdigit()):  # fmt: skip
                    self.next()  # (2516)_8
                    base = self.parse_group_or_atom()
                    return _Marked(value, "base", base=base, digits=inner[0].value)
                return value
            if t.value == "{":
                return self.parse_group()
            if t.value == "|":
                self.next()
                value = self.parse_plain_additive()
                self.expect("op", "|")
                if _is_matrix(value):
                    raise ParseError("|.| of a matrix")
                return sympy.Abs(value)
            raise ParseError(f"unexpected {t.value!r}")
        if t.kind == "cmd":
            return self._command()
        raise ParseError(f"unexpected {t.value or 'end of answer'!r}")

    def _applied(self, letter: str, named):
        """``f(x)``, ``P(A)``, ``I(0)``: a function applied, not a product (f, g, h and
        capital letters, written with no space before the bracket)."""
        if not (
            letter in _FUNCTION_LETTERS
            and letter not in self.plain_letters
            and isinstance(named, sympy.Symbol)
            and self.at("op", "(")
            and not self.tok.space_before
        ):
            return named
        save = self.pos
        self.next()
        args, _ = self.parse_list()
        if not self.at("op", ")") or not args or not all(isinstance(a, Scalar) for a in args):
            self.pos = save
            return named
        self.next()
        return sympy.Function(named.name)(*(a.expr for a in args))

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
                self.next()  # ^
                self.next()  # \prime
                primes += 1
            elif (self.at("op", "^") and self.peek().kind == "op" and self.peek().value == "{"
                  and self.peek(2).kind == "cmd" and self.peek(2).value == "prime"):  # fmt: skip
                self.next()  # ^
                self.next()  # {
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
            args, _ = self.parse_list()
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
        """``f(x)``, ``f{x}``, or ``f x`` / ``f 2x`` / ``\\cos 120^\\circ`` (a product)."""
        if self.at("op", "("):
            self.next()
            value = self.parse_plain_additive()
            self.expect("op", ")")
            return value
        if self.at("op", "{"):
            return self.parse_group()
        value = _plain(self.parse_power())
        while self.tok.kind in ("num", "sym") or (
            self.tok.kind == "cmd" and self.tok.value in _GREEK | {"pi"}
        ):
            value = sympy.Mul(value, _plain(self.parse_power()))
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

    def _derivative(self) -> sympy.Symbol | None:
        """``\\frac{dy}{dx}`` and ``\\frac{d^2y}{dx^2}`` are the names y' and y''."""
        t = _Window(self.toks)
        p = self.pos
        if not (t[p].kind == "op" and t[p].value == "{" and t[p + 1].kind == "sym"
                and t[p + 1].value == "d"):  # fmt: skip
            return None
        order, q = 1, p + 2
        if t[q].kind == "op" and t[q].value == "^" and t[q + 1].kind == "num":
            order, q = int(t[q + 1].value), q + 2
        if not (t[q].kind == "sym" and t[q + 1].kind == "op" and t[q + 1].value == "}"):
            return None
        name = t[q].value
        r = q + 2
        if not (t[r].kind == "op" and t[r].value == "{" and t[r + 1].kind == "sym"
                and t[r + 1].value == "d" and t[r + 2].kind == "sym"):  # fmt: skip
            return None
        s = r + 3
        if order > 1:
            if not (t[s].kind == "op" and t[s].value == "^" and t[s + 1].value == str(order)):
                return None
            s += 2
        if not (t[s].kind == "op" and t[s].value == "}") or order > 3:
            return None
        self.pos = s + 1
        return sympy.Symbol(name + "'" * order)

    def _sum(self, kind: str):
        """``\\sum_{k=a}^{b} term`` and ``\\prod``: added up when the limits are small numbers."""
        self.expect("op", "_")
        self.expect("op", "{")
        var = self.expect("sym").value
        self.expect("op", "=")
        lower = self.parse_plain_additive()
        self.expect("op", "}")
        self.expect("op", "^")
        upper = _plain(self.parse_exponent())
        term = _plain(self.parse_term())
        cls = sympy.Sum if kind == "sum" else sympy.Product
        value = cls(term, (sympy.Symbol(var), lower, upper))
        if (isinstance(lower, sympy.Integer) and isinstance(upper, sympy.Integer)
                and 0 <= upper - lower < MAX_SUM_TERMS):  # fmt: skip
            value = value.doit()
        return value

    def _command(self):
        t = self.next()
        name = t.value
        if name == "frac" or name == "cfrac":
            derivative = self._derivative()
            if derivative is not None:
                return derivative
            num = self.parse_group_or_atom()
            den = self.parse_group_or_atom()
            if den == 0:
                raise ParseError("division by zero")
            self._int_frac = isinstance(num, sympy.Integer) and isinstance(den, sympy.Integer)
            return _arith("/", num, den)
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
        if name in ("sum", "prod"):
            return self._sum(name)
        if name == "lfloor":
            value = self.parse_plain_additive()
            self.expect("cmd", "rfloor")
            return sympy.floor(value)
        if name == "lceil":
            value = self.parse_plain_additive()
            self.expect("cmd", "rceil")
            return sympy.ceiling(value)
        if name == "langle":  # \langle 1, 2 \rangle: a vector
            items, _ = self.parse_list()
            self.expect("cmd", "rangle")
            if len(items) < 2 or not all(isinstance(i, Scalar) for i in items):
                raise ParseError("a vector needs two or more numbers")
            return sympy.ImmutableMatrix([[i.expr] for i in items])
        if name == "angle" or name == "measuredangle":  # \angle ABC: the name of an angle
            letters = []
            while self.tok.kind == "sym" and (not letters or not self.tok.space_before):
                letters.append(self.next().value)
            if not letters and self.tok.kind == "text" and self.tok.value.isalpha():
                letters.append(self.next().value)
            if not letters:
                raise ParseError("\\angle without a name")
            return sympy.Symbol("angle " + "".join(letters))
        if name == "triangle":
            raise ParseError("\\triangle is not a value")
        if name == "circ":
            raise ParseError("a lone degree sign")
        if name.isalpha() and not self.at("op", "{"):
            return sympy.Symbol(name)  # an unknown macro such as \zzz: a name of its own
        raise ParseError(f"unknown command \\{name}")


class _EmptySet(Exception):
    pass


def _two_units():
    raise ParseError("two units on one number")


class _Marked:
    """A number that ends in a mark (30^\\circ, 52_8); it must end its scalar, or, inside a
    formula, count as what it means (30^\\circ as pi/6)."""

    def __init__(self, expr, unit: str, base=None, digits=None):
        self.expr, self.unit, self.base, self.digits = expr, unit, base, digits

    def negated(self) -> _Marked:
        return _Marked(-self.expr, self.unit, self.base, self.digits)

    def finish(self, unit_word=None) -> Scalar:
        if self.unit == "base":
            if not isinstance(self.base, sympy.Integer) or not 2 <= int(self.base) <= 36:
                raise ParseError("bad number base")
            return Scalar(self.expr, base=int(self.base), digits=self.digits)
        return Scalar(self.expr, unit=self.unit, unit_word=unit_word)


def _plain(value):
    """A value inside a formula: degrees become radians; a base mark cannot be computed with."""
    if isinstance(value, _Marked):
        if value.unit == "degree":
            return value.expr * sympy.pi / 180
        raise ParseError("a base mark inside an expression")
    return value


# --------------------------------------------------------------------------- names


def is_name(value) -> bool:
    """A left-hand side that only names the answer: y, a_1, f(x), |AB|, A:B, \\angle ABC,
    NO/BO, (x, y). Not an equation to solve: 2x + z, a^2 + b."""
    if isinstance(value, Ratio):
        return all(is_name(p) for p in value.parts)
    if isinstance(value, Seq) and value.open == "(":
        return all(is_name(item) for item in value.items)
    if not isinstance(value, Scalar) or value.unit or value.base:
        return False
    return _names_a_quantity(value.expr)


def _names_a_quantity(expr) -> bool:
    if isinstance(expr, sympy.Symbol):
        return True
    if isinstance(expr, sympy.core.function.AppliedUndef):
        return True
    if isinstance(expr, sympy.Abs):
        return _names_a_quantity(expr.args[0])
    if isinstance(expr, sympy.Pow):
        return expr.exp == -1 and _names_a_quantity(expr.base)
    if isinstance(expr, sympy.Mul):
        return all(_names_a_quantity(a) for a in expr.args)
    return False


def _drop_approximation(rel: Relation):
    """``x \\approx 11`` is x = 11; in ``x = 1/3 \\approx 0.33`` the exact value is the
    answer and what follows the approximation sign is dropped."""
    if "~" not in rel.ops:
        return rel
    i = rel.ops.index("~")
    if i == 0 and is_name(rel.parts[0]):
        return _drop_approximation(Relation(rel.parts, ("=", *rel.ops[1:])))
    parts, ops = rel.parts[: i + 1], rel.ops[:i]
    return Relation(parts, ops) if ops else parts[0]


class _Window:
    """Tokens by index, the end-of-answer token past the end (for lookahead)."""

    def __init__(self, toks: list[_Token]):
        self.toks = toks

    def __getitem__(self, i: int) -> _Token:
        return self.toks[min(i, len(self.toks) - 1)]


# --------------------------------------------------------------------------- entry points

_CHOICE_WITH_VALUE = re.compile(
    r"(?:\\text(?:bf|rm)?\s*\{\s*\(([A-E])\)\s*\}|\(([A-E])\))\s*(\S.*)", re.DOTALL
)


def parse_answer(text: str, plain_letters: frozenset = frozenset()):
    """Parse one answer (already extracted from a response) into a comparable value.

    ``plain_letters``: capital letters read as symbols before a bracket (``B(2+i)`` is B
    times 2+i), because the gold answer uses them as symbols."""
    if len(text) > MAX_ANSWER_CHARS:
        raise TooLarge(f"answer longer than {MAX_ANSWER_CHARS} characters")
    s = clean(text)
    if not s:
        raise ParseError("empty answer")
    choice = CHOICE.fullmatch(s)
    if choice and s not in "abcde":
        return Text((choice.group(1) or choice.group(2)).upper())
    with_value = _CHOICE_WITH_VALUE.fullmatch(s)
    if with_value:
        letter = with_value.group(1) or with_value.group(2)
        return Choice(letter, _parse_clean(with_value.group(3), plain_letters))
    if is_text_answer(s):
        return Text(normalize_text(s))
    groups = _top_level_split(s, ";")
    if len(groups) > 1 and any(_top_level_split(g, ",")[1:] for g in groups):
        # p=5,q=2; p=7,q=2: solutions apart by semicolons, coordinates by commas
        return Seq(tuple(_parse_clean(g, plain_letters) for g in groups))
    return _parse_clean(s, plain_letters)


def _parse_clean(s: str, plain_letters: frozenset = frozenset()):
    parser = _Parser(tokenize(s), plain_letters)
    try:
        value = parser.parse_answer()
    except _EmptySet:
        if re.fullmatch(r"\\(?:emptyset|varnothing)|\\\{\s*\\\}", s):
            return SetOf(())
        raise ParseError("empty set inside an expression") from None
    except RecursionError:
        raise TooLarge("expression nested too deeply") from None
    return value


def _top_level_split(s: str, sep: str) -> list[str]:
    parts, depth, last = [], 0, 0
    for i, c in enumerate(s):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == sep and depth == 0:
            parts.append(s[last:i])
            last = i + 1
    parts.append(s[last:])
    return [p for p in parts if p.strip()]


def is_text_answer(text: str) -> bool:
    """Words rather than math: ``Evelyn``, ``\\text{east}``, ``odd``."""
    s = strip_text_wrappers(clean(text))
    if "\\" in s:
        return False
    words = s.replace(" ", "")
    return (
        len(words) >= 3 and words.isalpha() and words.lower() not in _FUNCTIONS
        and words.lower() not in _CONSTANT_WORDS
    )  # fmt: skip


def symbol_letters(value) -> frozenset:
    """The capital letters a parsed answer uses as plain symbols (not as function names)."""
    found: set[str] = set()
    stack, seen = [value], 0
    while stack and seen < 10_000:
        v = stack.pop()
        seen += 1
        if isinstance(v, Scalar):
            found.update(
                s.name
                for s in v.expr.free_symbols
                if isinstance(s, sympy.Symbol) and len(s.name) == 1 and s.name.isupper()
            )
        elif isinstance(v, tuple):
            stack.extend(v)
        elif hasattr(v, "__dataclass_fields__"):
            stack.extend(getattr(v, f) for f in v.__dataclass_fields__)
    return frozenset(found)
