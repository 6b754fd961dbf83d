"""Plain numbers, read and compared without sympy.

Most answers are integers, decimals, fractions or mixed numbers, now and then with a
``%``, a degree sign, a currency or a unit word. This module reads exactly those into a
:class:`Number` (an exact ``Fraction`` and how it was written) and compares two of them
by the same rules as :mod:`pt_eval.equivalence`, so the grader needs neither sympy nor a
worker process for them. Anything else returns None and goes to the full parser.

The size of every number is bounded (digits, exponent), so nothing here can run long.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from pt_eval.normalize import CURRENCIES, clean, strip_text_wrappers, units_differ

MAX_DIGITS = 4_000  # the full parser's literal limit (pt_eval.parse.MAX_LITERAL_DIGITS)
MAX_EXPONENT = 400  # e-notation beyond this goes to the full parser
PERCENT_WORDS = {"percent", "percentage", "percents", "pct"}
DEGREE_WORDS = {"degree", "degrees", "deg"}
# words that are never a unit: separators and the words of a sentence ("5 is impossible")
NOT_UNITS = {
    "and", "or", "is", "are", "was", "were", "be", "not", "no", "can", "cannot", "it", "this",
    "that", "there", "if", "when", "because", "since", "so", "but", "only", "none",
    "impossible", "undefined", "more", "less", "than", "at", "least", "most", "about",
    "approximately", "times", "cdot", "div", "frac", "mod", "pmod",
}  # fmt: skip
# function and constant names: a unit only inside \text{} ("5 \text{ min}"), not bare
FUNCTION_WORDS = {
    "sin", "cos", "tan", "cot", "sec", "csc", "log", "ln", "lg", "exp", "sqrt", "gcd", "lcm",
    "max", "min", "inf", "infty", "infinity", "arcsin", "arccos", "arctan", "sinh", "cosh",
    "tanh", "floor", "ceil", "abs", "deg", "pi",
}  # fmt: skip
# two-letter runs read as a unit (a longer run is always a word; a single letter never is)
TWO_LETTER_UNITS = {"cm", "mm", "km", "in", "ft", "yd", "mi", "kg", "lb", "oz", "ml", "hr",
                    "sq", "cu", "mg", "ms", "mL", "kW", "Hz"}  # fmt: skip

_CURRENCY = r"\\(?:" + "|".join(CURRENCIES) + r")(?![a-zA-Z])"
_SIMPLE = re.compile(
    rf"(?P<cur>{_CURRENCY})?\s*(?P<sign>[+-])?\s*(?P<cur2>{_CURRENCY})?\s*"
    r"(?:"
    r"(?P<whole>\d+)?\s*\\frac\s*(?:\{\s*(?P<fn>-?\d+)\s*\}|(?P<fn1>\d))\s*"
    r"(?:\{\s*(?P<fd>\d+)\s*\}|(?P<fd1>\d))"
    r"|(?P<mixw>\d+) (?P<mixn>\d+)\s*/\s*(?P<mixd>\d+)"
    r"|(?P<num>\d+)\s*/\s*(?P<den>\d+)"
    r"|(?P<dec>\d+\.\d*|\.\d+|\d+)(?:[eE](?P<exp>[+-]?\d+))?"
    r")"
    r"\s*(?P<mark>%|\^\s*\\circ|\^\s*\{\s*\\circ\s*\})?"
    rf"\s*(?P<cur3>{_CURRENCY})?"
    r"\s*(?P<unit>(?:\\(?:text|textrm|textnormal|mathrm|mbox)\s*\{[^{}]*\}|[A-Za-z]{2,}"
    r"(?:\s+[A-Za-z]{2,})*)(?:\s*\^\s*\{?\d\}?)?)?\s*"
)


@dataclass(frozen=True)
class Number:
    value: Fraction
    places: int | None = None  # decimals as written (0.330 -> 3); None unless a plain decimal
    unit: str | None = None  # "percent" or "degree"
    unit_word: str | None = None  # cm, dollar, \text{ apples}


@lru_cache(maxsize=8192)
def parse_number(text: str) -> Number | None:
    """``text`` as a plain number, or None when it is anything else (or too big)."""
    if len(text) > MAX_DIGITS + 200:
        return None
    s = clean(text)
    m = _SIMPLE.fullmatch(s)
    if m is None:
        return None
    unit = unit_word = None
    currencies = [g for g in (m.group("cur"), m.group("cur2"), m.group("cur3")) if g]
    if len(currencies) > 1:
        return None
    if currencies:
        unit_word = CURRENCIES[currencies[0][1:]]
    if m.group("unit"):
        words = m.group("unit")
        inner = strip_text_wrappers(words)
        if any(w.lower() in NOT_UNITS for w in re.findall(r"[A-Za-z]+", inner)):
            return None
        plain = re.fullmatch(r"\s*([A-Za-z ]+?)\s*(?:\^\s*\{?\d\}?)?", inner)
        if plain is not None:
            parts = plain.group(1).split()
            if inner == words and any(
                (len(p) == 2 and p not in TWO_LETTER_UNITS) or p.lower() in FUNCTION_WORDS
                for p in parts
            ):
                return None  # "5 ab" is 5ab and "5 min" a function: not five of a unit
            low = plain.group(1).strip().lower()
            if low in PERCENT_WORDS:
                unit = "percent"
            elif low in DEGREE_WORDS:
                unit = "degree"
        if unit is None:
            if unit_word is not None:
                return None  # a currency and a unit word together
            unit_word = words
    if m.group("mark"):
        if unit is not None:
            return None
        unit = "percent" if m.group("mark") == "%" else "degree"
    places = None
    if m.group("dec") is not None:
        mantissa = m.group("dec")
        digits = mantissa.replace(".", "")
        exponent = int(m.group("exp") or 0)
        if len(digits) > MAX_DIGITS or abs(exponent) > MAX_EXPONENT:
            return None
        whole, _, frac = mantissa.partition(".")
        value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
        value *= Fraction(10) ** exponent
        if "." in mantissa and unit is None:
            places = len(frac) - exponent
    else:
        parts = [m.group(k) for k in ("whole", "fn", "fn1", "fd", "fd1", "mixw", "mixn", "mixd",
                                      "num", "den")]  # fmt: skip
        if sum(len(p) for p in parts if p) > MAX_DIGITS:
            return None
        if m.group("num") is not None:
            den = int(m.group("den"))
            if den == 0:
                return None
            value = Fraction(int(m.group("num")), den)
        elif m.group("mixw") is not None:
            den = int(m.group("mixd"))
            if den == 0:
                return None
            value = int(m.group("mixw")) + Fraction(int(m.group("mixn")), den)
        else:
            numerator = int(m.group("fn") if m.group("fn") is not None else m.group("fn1"))
            den = int(m.group("fd") if m.group("fd") is not None else m.group("fd1"))
            if den == 0:
                return None
            value = Fraction(numerator, den)
            if m.group("whole") is not None:
                if numerator < 0:
                    return None  # 2\frac{-1}{3} is not a mixed number
                value = int(m.group("whole")) + value
    if m.group("sign") == "-":
        value = -value
    return Number(value, places, unit, unit_word)


def terminates(value: Fraction) -> bool:
    """True when ``value`` has a finite decimal expansion (1/8 does, 1/3 does not)."""
    q = value.denominator
    for prime in (2, 5):
        while q % prime == 0:
            q //= prime
    return q == 1


def within_tolerance(a: Fraction, b: Fraction, tolerance: Fraction | None) -> bool:
    return tolerance is not None and abs(a - b) <= tolerance * max(abs(a), abs(b))


def rounds_to(decimal: Fraction, places: int, exact: Fraction) -> bool:
    """``decimal`` (written with ``places`` decimals) is ``exact`` correctly rounded."""
    half_ulp = Fraction(1, 2) * Fraction(10) ** (-places)
    return abs(exact - decimal) <= half_ulp * (1 + Fraction(1, 10**9))


def values_equal(a: Fraction, b: Fraction, gold: Number | None, pred: Number | None,
                 tolerance: Fraction | None) -> bool:  # fmt: skip
    """Gold value ``a`` against predicted ``b`` under the precision policy."""
    if a == b:
        return True
    if (
        gold is not None
        and pred is not None
        and gold.places is not None
        and pred.places is None
        and not terminates(b)
        and rounds_to(a, gold.places, b)
    ):
        return True  # a decimal gold is judged at the precision it is written with
    return within_tolerance(a, b, tolerance)


def numbers_equal(gold: Number, pred: Number, tolerance: Fraction | None = None) -> bool:
    """The rules of ``pt_eval.equivalence.scalars_equal``, for two plain numbers."""
    if units_differ(gold.unit_word, pred.unit_word):
        return False
    if gold.unit != pred.unit:
        marked, other = (gold, pred) if gold.unit else (pred, gold)
        if other.unit is not None:
            return False
        a, b = (marked.value, other.value) if marked is gold else (other.value, marked.value)
        if values_equal(a, b, gold, pred, tolerance):
            return True  # "20%" answered "20", "30^\circ" answered "30"
        if marked.unit == "percent":
            scaled = marked.value / 100
            a, b = (scaled, other.value) if marked is gold else (other.value, scaled)
            return values_equal(a, b, None, None, tolerance)
        return False  # a rational number of degrees is an irrational number of radians
    return values_equal(gold.value, pred.value, gold, pred, tolerance)


def rational_key(value: Fraction) -> str:
    """sympy's ``srepr`` of the value, so both graders give one answer one majority key."""
    if value.denominator == 1:
        return f"Integer({value.numerator})"
    return f"Rational({value.numerator}, {value.denominator})"


def number_key(number: Number) -> str:
    return f"value:{rational_key(number.value)}|{number.unit}|None|"
