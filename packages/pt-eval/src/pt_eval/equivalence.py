"""Is a predicted answer the same as the gold one?

Strict where strictness is right:

- numbers compare exactly (``0.5`` equals ``\\frac12``; ``1/2004!`` never equals
  ``1/2006!``); a decimal approximation of an irrational or non-terminating
  gold counts only when it is the correct rounding with at least three
  significant digits (``\\pi`` vs ``3.14``, ``\\frac13`` vs ``0.333``);
- a percentage is divided by 100 only when one side is written with ``%``, and
  degrees become radians only when one side is written with ``^\\circ``;
- symbolic expressions are equal when their difference expands to zero, or
  when they agree to 30 significant digits at several points (a relative test,
  so values as small as ``1/2006!`` are not mistaken for zero);
- tuples and intervals keep order and bracket type; sets and bare lists
  (``1, 2``) do not keep order; ``y = 2x + 1`` matches ``2x + 1``;
  inequalities match the interval they describe.

Nothing is ever evaluated from text: both sides come from :mod:`pt_eval.parse`.
"""

from __future__ import annotations

import random
import re

import sympy

from pt_eval.parse import (
    Matrix,
    ParseError,
    Relation,
    Scalar,
    Seq,
    SetOf,
    SetUnion,
    Text,
    clean,
    normalize_text,
    parse_answer,
)

NUMERIC_DIGITS = 60  # working precision of the numeric comparison
RELATIVE_TOLERANCE = sympy.Float("1e-30", NUMERIC_DIGITS)
PROBE_POINTS = 3
MIN_ROUNDED_DIGITS = 3  # a decimal approximation must carry at least this many digits


def answers_match(gold: str, pred: str) -> bool:
    """True when ``pred`` is the same answer as ``gold`` (both already extracted).

    Raises :class:`pt_eval.parse.TooLarge` when either side asks for too much work.
    """
    if _squash(gold) == _squash(pred):
        return True
    g = _try_parse(gold)
    p = _try_parse(pred)
    if g is None or p is None:
        if g is None and p is None:
            return normalize_text(gold) == normalize_text(pred)
        return False
    return values_equal(g, p)


def answer_key(pred: str) -> str:
    """A canonical form of an answer, for majority voting: equal keys mean equal answers."""
    value = _try_parse(pred)
    if value is None:
        return "text:" + normalize_text(pred)
    return "value:" + _key(value)


def _key(value) -> str:
    if isinstance(value, Scalar):
        return f"{sympy.srepr(value.expr)}|{value.unit}|{value.base}|{value.digits if value.base else ''}"
    if isinstance(value, Seq):
        items = [_key(v) for v in value.items]
        if not value.open:
            items.sort()
        return f"seq{value.open}{','.join(items)}{value.close}"
    if isinstance(value, SetOf):
        return "set{" + ",".join(sorted(_key(v) for v in value.items)) + "}"
    if isinstance(value, Matrix):
        return "mat[" + ";".join(",".join(_key(v) for v in row) for row in value.rows) + "]"
    if isinstance(value, Relation):
        return "rel(" + ",".join(_key(v) for v in value.parts) + "|" + ",".join(value.ops) + ")"
    if isinstance(value, SetUnion):
        return "union(" + ",".join(_key(v) for v in value.parts) + ")"
    if isinstance(value, Text):
        return "text:" + value.text
    raise AssertionError(f"unknown value {value!r}")


def _squash(text: str) -> str:
    s = clean(text)
    s = re.sub(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}", r"\1", s)
    return re.sub(r"(?<!\d) | (?!\d)", "", s)  # "2 1/2" is not "21/2"


def _try_parse(text: str):
    try:
        return parse_answer(text)
    except ParseError:
        return None


# --------------------------------------------------------------------------- values


def values_equal(g, p) -> bool:
    """Structural comparison of two parsed answers."""
    if isinstance(g, Relation) and not isinstance(p, Relation):
        return any(values_equal(form, p) for form in _relation_forms(g))
    if isinstance(p, Relation) and not isinstance(g, Relation):
        return any(values_equal(g, form) for form in _relation_forms(p))
    if isinstance(g, Relation) and isinstance(p, Relation):
        return _relations_equal(g, p)

    if isinstance(g, Text) or isinstance(p, Text):
        return _text_equal(g, p)
    if isinstance(g, Scalar) and isinstance(p, Scalar):
        return scalars_equal(g, p)
    if isinstance(g, SetUnion) or isinstance(p, SetUnion):
        return _sets_equal(g, p)
    if isinstance(g, Matrix) or isinstance(p, Matrix):
        return _matrix_equal(g, p)
    if isinstance(g, SetOf) or isinstance(p, SetOf):
        g_items, p_items = _set_items(g), _set_items(p)
        if g_items is None or p_items is None:
            return False
        return _unordered_equal(_dedupe(g_items), _dedupe(p_items))
    if isinstance(g, Seq) and isinstance(p, Seq):
        return _seqs_equal(g, p)
    return False  # a list against a single value


def _text_equal(g, p) -> bool:
    if isinstance(g, Text) and isinstance(p, Text):
        return g.text == p.text
    text, other = (g, p) if isinstance(g, Text) else (p, g)
    # a choice letter against a bare symbol: C vs \text{(C)}
    return (
        isinstance(other, Scalar)
        and isinstance(other.expr, sympy.Symbol)
        and other.expr.name.upper() == text.text
    )


def _set_items(value):
    if isinstance(value, SetOf):
        return value.items
    if isinstance(value, Seq) and not value.open:
        return value.items
    if isinstance(value, Scalar):
        return (value,)
    return None


def _dedupe(items) -> list:
    unique: list = []
    for item in items:
        if not any(values_equal(item, u) for u in unique):
            unique.append(item)
    return unique


def _unordered_equal(g_items, p_items) -> bool:
    if len(g_items) != len(p_items):
        return False
    unused = list(range(len(p_items)))
    for g in g_items:
        for k in unused:
            if values_equal(g, p_items[k]):
                unused.remove(k)
                break
        else:
            return False
    return True


def _seqs_equal(g: Seq, p: Seq) -> bool:
    if not g.open and not p.open:  # "1, 2" against "2, 1": several answers, any order
        return _unordered_equal(g.items, p.items)
    if not g.open or not p.open:  # "3, \pi/2" against "(3, \pi/2)": a point written bare
        bracketed = g if g.open else p
        if (bracketed.open, bracketed.close) != ("(", ")"):
            return False
    elif (g.open, g.close) != (p.open, p.close):  # [0, 1) is not (0, 1)
        return False
    return len(g.items) == len(p.items) and all(
        values_equal(a, b) for a, b in zip(g.items, p.items, strict=True)
    )


def _matrix_equal(g, p) -> bool:
    def rows_of(value):
        if isinstance(value, Matrix):
            return value.rows
        if isinstance(value, Seq) and (value.open, value.close) in (("(", ")"), ("[", "]")):
            return tuple((item,) for item in value.items)  # a vector written as a tuple
        return None

    g_rows, p_rows = rows_of(g), rows_of(p)
    if g_rows is None or p_rows is None:
        return False
    if isinstance(g, Matrix) != isinstance(p, Matrix):
        # a tuple matches a column or a row vector
        matrix_rows = g_rows if isinstance(g, Matrix) else p_rows
        if len(matrix_rows) == 1:
            matrix_rows = tuple((x,) for x in matrix_rows[0])
        g_rows, p_rows = (matrix_rows, p_rows) if isinstance(g, Matrix) else (g_rows, matrix_rows)
    if len(g_rows) != len(p_rows) or any(
        len(a) != len(b) for a, b in zip(g_rows, p_rows, strict=True)
    ):
        return False
    return all(
        values_equal(a, b)
        for g_row, p_row in zip(g_rows, p_rows, strict=True)
        for a, b in zip(g_row, p_row, strict=True)
    )


# --------------------------------------------------------------------------- relations


def _is_name(value) -> bool:
    """A left-hand side that only names the answer: y, f(x), a_1, (x, y)."""
    if isinstance(value, Scalar):
        expr = value.expr
        if isinstance(expr, sympy.Symbol):
            return True
        if isinstance(expr, sympy.Mul) and all(isinstance(a, sympy.Symbol) for a in expr.args):
            return len(expr.args) == 2  # f(x) reads as the product f*x
        return False
    if isinstance(value, Seq) and value.open == "(":
        return all(_is_name(item) for item in value.items)
    return False


def _relation_forms(rel: Relation) -> list:
    """What a relation may be compared with when the other side is a plain value."""
    forms = []
    if len(rel.ops) == 1 and rel.ops[0] in ("=", "in") and _is_name(rel.parts[0]):
        forms.append(rel.parts[1])
    interval = _inequality_interval(rel)
    if interval is not None:
        forms.append(interval)
    return forms


_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "!=": "!="}


def _ascending(rel: Relation) -> Relation:
    """Write a chain with < and <= only (x > 3 becomes 3 < x)."""
    if all(op in (">", ">=") for op in rel.ops):
        return Relation(tuple(reversed(rel.parts)), tuple(_FLIP[op] for op in reversed(rel.ops)))
    return rel


def _inequality_interval(rel: Relation) -> Seq | None:
    rel = _ascending(rel)
    if any(op not in ("<", "<=") for op in rel.ops) or not all(
        isinstance(p, Scalar) for p in rel.parts
    ):
        return None
    exprs = [p.expr for p in rel.parts]
    if len(exprs) == 2:
        if isinstance(exprs[0], sympy.Symbol) and not exprs[1].free_symbols:
            lo, hi, lo_open, hi_open = -sympy.oo, exprs[1], True, rel.ops[0] == "<"
        elif isinstance(exprs[1], sympy.Symbol) and not exprs[0].free_symbols:
            lo, hi, lo_open, hi_open = exprs[0], sympy.oo, rel.ops[0] == "<", True
        else:
            return None
    elif len(exprs) == 3 and isinstance(exprs[1], sympy.Symbol):
        if exprs[0].free_symbols or exprs[2].free_symbols:
            return None
        lo, hi = exprs[0], exprs[2]
        lo_open, hi_open = rel.ops[0] == "<", rel.ops[1] == "<"
    else:
        return None
    return Seq((Scalar(lo), Scalar(hi)), "(" if lo_open else "[", ")" if hi_open else "]")


def _variable(rel: Relation):
    """The one variable an inequality or a membership is about, if there is one."""
    if rel.ops == ("in",) and isinstance(rel.parts[0], Scalar):
        expr = rel.parts[0].expr
        return expr if isinstance(expr, sympy.Symbol) else None
    if all(isinstance(p, Scalar) for p in rel.parts):
        symbols = set().union(*(p.expr.free_symbols for p in rel.parts))
        return symbols.pop() if len(symbols) == 1 else None
    return None


def _relations_equal(g: Relation, p: Relation) -> bool:
    g, p = _ascending(g), _ascending(p)
    if g.ops != p.ops:
        # x \in (3, \infty) against x > 3: the same set of one variable, written two ways
        if _variable(g) is None or _variable(g) != _variable(p):
            return False
        g_sets, p_sets = _relation_forms(g), _relation_forms(p)
        return any(values_equal(a, b) for a in g_sets for b in p_sets)
    if len(g.ops) > 1:
        return all(values_equal(a, b) for a, b in zip(g.parts, p.parts, strict=True))
    op = g.ops[0]
    (gl, gr), (pl, pr) = g.parts, p.parts
    if values_equal(gl, pl) and values_equal(gr, pr):
        return True
    if op in ("=", "!=") and values_equal(gl, pr) and values_equal(gr, pl):
        return True
    if op == "in" or not all(isinstance(x, Scalar) for x in (gl, gr, pl, pr)):
        return False
    # the same equation or inequality scaled: 2y = 4x + 2 is y = 2x + 1
    g_diff = gl.expr - gr.expr
    p_diff = pl.expr - pr.expr
    if p_diff == 0 or g_diff == 0:
        return False
    ratio = sympy.cancel(sympy.together(g_diff / p_diff))
    if ratio.free_symbols or ratio == 0 or not ratio.is_number:
        return False
    if op in ("=", "!="):
        return True
    return bool(ratio.is_positive)


# --------------------------------------------------------------------------- sets


def _as_sympy_set(value):
    if isinstance(value, SetUnion):
        parts = [_as_sympy_set(p) for p in value.parts]
        return None if any(p is None for p in parts) else sympy.Union(*parts)
    if isinstance(value, Seq) and len(value.items) == 2 and value.open:
        lo, hi = value.items
        if not (isinstance(lo, Scalar) and isinstance(hi, Scalar)):
            return None
        if lo.expr.free_symbols or hi.expr.free_symbols:
            return None
        if not (lo.expr.is_extended_real and hi.expr.is_extended_real) or not bool(
            lo.expr < hi.expr
        ):
            return None
        return sympy.Interval(lo.expr, hi.expr, value.open == "(", value.close == ")")
    if isinstance(value, SetOf) and all(isinstance(i, Scalar) for i in value.items):
        return sympy.FiniteSet(*[i.expr for i in value.items])
    return None


def _sets_equal(g, p) -> bool:
    gs, ps = _as_sympy_set(g), _as_sympy_set(p)
    if gs is None or ps is None:
        if isinstance(g, SetUnion) and isinstance(p, SetUnion):
            return _unordered_equal(g.parts, p.parts)
        return False
    return bool(gs == ps)


# --------------------------------------------------------------------------- scalars


def scalars_equal(g: Scalar, p: Scalar) -> bool:
    if g.base is not None or p.base is not None:
        # 52_8: the same digits, with or without the base written
        if g.base is not None and p.base is not None:
            return g.base == p.base and g.expr == p.expr
        return g.expr == p.expr and (g.base or p.base) is not None
    if g.unit != p.unit and (g.unit or p.unit):
        marked, other = (g, p) if g.unit else (p, g)
        if other.unit is not None:
            return False
        factor = sympy.Rational(1, 100) if marked.unit == "percent" else sympy.pi / 180
        # "20%" may be answered "20" or "0.2"; "30^\circ" as "30" or "\pi/6"
        return _exprs_equal(marked.expr, other.expr, marked, other) or _exprs_equal(
            marked.expr * factor, other.expr, None, None
        )
    return _exprs_equal(g.expr, p.expr, g, p)


def _exprs_equal(a, b, g: Scalar | None, p: Scalar | None) -> bool:
    if a == b:
        return True
    if a.free_symbols != b.free_symbols:
        return False
    diff = a - b
    if diff.is_Number and not (a.is_Rational and b.is_Rational):
        # the difference cancelled to a constant: x vs x + 1 differ however large x is
        return bool(diff == 0) or _rounding_matches(g, p, a, b)
    if a.free_symbols:
        return _symbolic_equal(a, b)
    if a.is_Rational and b.is_Rational:
        return _rounding_matches(g, p, a, b)
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(
        sympy.oo, -sympy.oo, sympy.zoo, sympy.nan
    ):
        return False
    va, vb = _evaluate(a), _evaluate(b)
    if va is None or vb is None:
        return bool(sympy.simplify(a - b) == 0)
    if _close(va, vb):
        return True
    return _rounding_matches(g, p, a, b)


def _evaluate(expr, subs=None):
    value = expr.evalf(NUMERIC_DIGITS, subs=subs)
    if not value.is_number or value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return None
    re_part, im_part = value.as_real_imag()
    if not (re_part.is_Number and im_part.is_Number):
        return None
    return sympy.Float(re_part, NUMERIC_DIGITS), sympy.Float(im_part, NUMERIC_DIGITS)


def _close(va, vb) -> bool:
    (ar, ai), (br, bi) = va, vb
    diff = abs(ar - br) + abs(ai - bi)
    scale = max(abs(ar) + abs(ai), abs(br) + abs(bi))
    if scale.is_zero:
        return bool(diff.is_zero)
    return bool(diff <= scale * RELATIVE_TOLERANCE)


def _rounding_matches(g: Scalar | None, p: Scalar | None, a, b) -> bool:
    """A decimal written on one side is the correct rounding of an exact value on the other
    that has no terminating decimal (\\pi vs 3.14, 1/3 vs 0.333)."""
    for decimal, exact_side, exact in ((g, p, b), (p, g, a)):
        if decimal is None or decimal.decimal_places is None:
            continue
        if exact_side is not None and exact_side.decimal_places is not None:
            continue
        if (decimal.significant_digits or 0) < MIN_ROUNDED_DIGITS or _terminates(exact):
            continue
        approx = decimal.expr
        value = _evaluate(exact)
        if value is None or not value[1].is_zero:
            continue
        half_ulp = sympy.Rational(1, 2) * sympy.Rational(10) ** (-decimal.decimal_places)
        if abs(value[0] - sympy.Float(approx, NUMERIC_DIGITS)) <= half_ulp * (
            1 + sympy.Rational(1, 10**9)
        ):
            return True
    return False


def _terminates(value) -> bool:
    if not value.is_Rational:
        return False
    q = int(value.q)
    for prime in (2, 5):
        while q % prime == 0:
            q //= prime
    return q == 1


def _symbolic_equal(a, b) -> bool:
    """Equal at several points to 30 digits (decides fast, both ways), else equal by algebra."""
    symbols = sorted((a - b).free_symbols, key=lambda s: s.name)
    rng = random.Random(20240229)
    checked = 0
    for _ in range(PROBE_POINTS * 2):
        # positive irrational points on both sides of 1: sqrt(x^2) = x holds, |x - 1| != x - 1
        point = {
            s: sympy.Rational(rng.randint(100, 2900), 1000) + sympy.sqrt(2) / 97 for s in symbols
        }
        va, vb = _evaluate(a, point), _evaluate(b, point)
        if va is None or vb is None:
            continue
        if not _close(va, vb):
            return False
        checked += 1
        if checked == PROBE_POINTS:
            return True
    diff = a - b
    if not _has_big_power(diff) and sympy.expand(diff) == 0:
        return True
    return bool(sympy.simplify(diff) == 0)


def _has_big_power(expr) -> bool:
    return any(
        isinstance(node, sympy.Pow) and node.exp.is_Integer and abs(node.exp) > 64
        for node in sympy.preorder_traversal(expr)
    )
