"""Is a predicted answer the same as the gold one?

Strict where strictness is right:

- numbers compare exactly (``0.5`` equals ``\\frac12``; ``1/2004!`` never equals
  ``1/2006!``); a decimal gold is judged at the precision it is written with (gold
  ``0.33`` accepts ``1/3``), an exact gold accepts only its exact value (gold ``\\pi``
  does not accept ``3.14``) unless a numeric tolerance is set (:class:`Policy`);
- a percentage is divided by 100 only when one side is written with ``%``, and
  degrees become radians only when one side is written with ``^\\circ``; units are
  dropped, but two different units (``cm`` and ``m``) never match;
- symbolic expressions are equal when their difference expands to zero, or when they
  agree to 30 significant digits at points that include negatives and zero (a
  relative test, so values as small as ``1/2006!`` are not mistaken for zero), falling
  back to sympy's ``simplify``;
- tuples and intervals keep order and bracket type; sets and bare lists
  (``1, 2``) do not keep order; ``y = 2x + 1`` matches ``2x + 1``; inequalities and
  set-builder notation match the set they describe.

Nothing is ever evaluated from text: both sides come from :mod:`pt_eval.parse`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import cast

import sympy

from pt_eval.normalize import normalize_text, squash, units_differ
from pt_eval.numbers import Number, rational_key
from pt_eval.numbers import values_equal as rationals_equal
from pt_eval.parse import (
    Choice,
    Matrix,
    NumberSet,
    ParseError,
    Ratio,
    Relation,
    Scalar,
    Seq,
    SetBuilder,
    SetOf,
    SetOp,
    Text,
    is_name,
    parse_answer,
    symbol_letters,
)
from pt_eval.policy import DEFAULT_POLICY, Policy

NUMERIC_DIGITS = 60  # working precision of the numeric comparison
RELATIVE_TOLERANCE = sympy.Float("1e-30", NUMERIC_DIGITS)
PROBE_POINTS = 3  # points that must agree (and none disagree) for two expressions to match
PROBE_ZERO = sympy.Float("1e-40", NUMERIC_DIGITS)  # below this a probed value is zero (noise)
# probe values: zero, negatives and positives on both sides of 1, made irrational so that
# no accidental cancellation happens at a round number
_PROBES = tuple(
    sympy.Rational(v, 1000) + sympy.sqrt(2) / 97 * (1 if v else 0)
    for v in (0, -1370, 613, 2430, -2900, 1790)
)
_DECIMAL_COMMA = re.compile(r"\s*-?\d+,\d+\s*")
_THOUSANDS_ONLY = re.compile(r"\s*-?[1-9]\d{0,2}(?:,\d{3})+\s*")


class _Context:
    def __init__(self, policy: Policy):
        self.policy = policy
        self.tolerance = policy.tolerance


def answers_match(gold: str, pred: str, policy: Policy | None = None) -> bool:
    """True when ``pred`` is the same answer as ``gold`` (both already extracted).

    Raises :class:`pt_eval.parse.TooLarge` when either side asks for too much work.
    """
    ctx = _Context(policy or DEFAULT_POLICY)
    if squash(gold) == squash(pred):
        return True
    yes_no = normalize_text(gold), normalize_text(pred)
    if yes_no[0] in ("yes", "no") or yes_no[1] in ("yes", "no"):
        return yes_no[0] == yes_no[1]  # "No" answers the gold "no"
    return any(_match_one(g, p, ctx) for g in _readings(gold) for p in _readings(pred))


def _readings(text: str) -> list[str]:
    """The ways an answer may be read: ``1,22`` is 1.22 with a decimal comma, or 1 and 22."""
    if _DECIMAL_COMMA.fullmatch(text) and not _THOUSANDS_ONLY.fullmatch(text):
        return [text, text.replace(",", ".")]
    return [text]


def _match_one(gold: str, pred: str, ctx: _Context) -> bool:
    g = _try_parse(gold)
    # a capital the gold uses as a symbol is one in the prediction too: cB(2+i) is c*B*(2+i)
    p = _try_parse(pred, symbol_letters(g) if g is not None else frozenset())
    if g is None or p is None:
        if g is None and p is None:
            return normalize_text(gold) == normalize_text(pred)
        return False
    return values_equal(g, p, ctx)


def answer_key(pred: str) -> str:
    """A canonical form of an answer, for majority voting: equal keys mean equal answers."""
    value = _try_parse(pred)
    if value is None:
        return "text:" + normalize_text(pred)
    return "value:" + _key(value)


def _key(value) -> str:
    if isinstance(value, Scalar):
        expr = value.expr
        shown = (
            rational_key(Fraction(int(expr.p), int(expr.q)))
            if isinstance(expr, sympy.Rational)
            else (sympy.srepr(expr))
        )
        return f"{shown}|{value.unit}|{value.base}|{value.digits if value.base else ''}"
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
    if isinstance(value, SetOp):
        return "setop(" + ",".join(_key(v) for v in value.parts) + "|" + ",".join(value.ops) + ")"
    if isinstance(value, SetBuilder):
        return f"builder({value.var}|{_key(value.condition)})"
    if isinstance(value, NumberSet):
        return "numberset:" + value.name
    if isinstance(value, Ratio):
        return "ratio(" + ":".join(_key(v) for v in value.parts) + ")"
    if isinstance(value, Choice):
        return "choice:" + value.letter
    if isinstance(value, Text):
        return "text:" + value.text
    raise AssertionError(f"unknown value {value!r}")


def _try_parse(text: str, plain_letters: frozenset = frozenset()):
    try:
        return parse_answer(text, plain_letters)
    except ParseError:
        return None


# --------------------------------------------------------------------------- values


class _Solved:
    """A set that a relation or set-builder describes (only inside comparisons)."""

    def __init__(self, value: sympy.Set):
        self.value = value


def values_equal(g, p, ctx: _Context | None = None) -> bool:
    """Structural comparison of two parsed answers."""
    ctx = ctx or _Context(DEFAULT_POLICY)
    if isinstance(g, Relation) and isinstance(p, Relation):
        return _relations_equal(g, p, ctx)
    if isinstance(g, Relation):
        return any(values_equal(form, p, ctx) for form in _gold_forms(g))
    if isinstance(p, Relation):
        return any(values_equal(g, form, ctx) for form in _pred_forms(p, ctx))

    if isinstance(g, Choice) or isinstance(p, Choice):
        return _choice_equal(g, p, ctx)
    if isinstance(g, Text) or isinstance(p, Text):
        return _text_equal(g, p)
    if isinstance(g, Ratio) or isinstance(p, Ratio):
        return _ratio_equal(g, p, ctx)
    if isinstance(g, Scalar) and isinstance(p, Scalar):
        return scalars_equal(g, p, ctx)
    if any(isinstance(v, SetOp | SetBuilder | NumberSet | _Solved) for v in (g, p)):
        return _sets_equal(g, p)
    if isinstance(g, Matrix) or isinstance(p, Matrix):
        return _matrix_equal(g, p, ctx)
    if isinstance(g, SetOf) or isinstance(p, SetOf):
        g_items, p_items = _set_items(g), _set_items(p)
        if g_items is None or p_items is None:
            return False
        return _unordered_equal(_dedupe(g_items, ctx), _dedupe(p_items, ctx), ctx)
    if isinstance(g, Seq) and isinstance(p, Seq):
        return _seqs_equal(g, p, ctx)
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


def _choice_equal(g, p, ctx) -> bool:
    """``\\textbf{(B)}\\ 27`` is choice B and the value 27: either one may be the gold."""
    if isinstance(g, Choice) and isinstance(p, Choice):
        return g.letter == p.letter
    choice, other = (g, p) if isinstance(g, Choice) else (p, g)
    if isinstance(other, Text):
        return other.text == choice.letter
    if isinstance(other, Scalar) and isinstance(other.expr, sympy.Symbol):
        return other.expr.name.upper() == choice.letter
    return (
        values_equal(choice.value, other, ctx)
        if choice is p
        else values_equal(other, choice.value, ctx)
    )


def _ratio_equal(g, p, ctx) -> bool:
    """3:4 matches 6:8 and 3/4; a ratio with a zero part (12:00) only matches itself."""
    if isinstance(g, Ratio) and isinstance(p, Ratio):
        if len(g.parts) != len(p.parts):
            return False
        ge, pe = [x.expr for x in g.parts], [x.expr for x in p.parts]
        if any(x == 0 for x in ge + pe):
            return all(a == b for a, b in zip(ge, pe, strict=True))
        return all(sympy.simplify(ge[0] * pe[k] - pe[0] * ge[k]) == 0 for k in range(1, len(ge)))
    ratio, other = (g, p) if isinstance(g, Ratio) else (p, g)
    if not isinstance(other, Scalar) or len(ratio.parts) != 2 or ratio.parts[1].expr == 0:
        return False
    quotient = Scalar(ratio.parts[0].expr / ratio.parts[1].expr)
    return (
        scalars_equal(quotient, other, ctx) if ratio is g else scalars_equal(other, quotient, ctx)
    )


def _set_items(value):
    if isinstance(value, SetOf):
        return value.items
    if isinstance(value, Seq) and not value.open:
        return value.items
    if isinstance(value, Scalar):
        return (value,)
    return None


def _dedupe(items, ctx) -> list:
    unique: list = []
    for item in items:
        if not any(values_equal(item, u, ctx) for u in unique):
            unique.append(item)
    return unique


def _unordered_equal(g_items, p_items, ctx) -> bool:
    if len(g_items) != len(p_items):
        return False
    unused = list(range(len(p_items)))
    for g in g_items:
        for k in unused:
            if values_equal(g, p_items[k], ctx):
                unused.remove(k)
                break
        else:
            return False
    return True


def _named_values(seq: Seq) -> dict | None:
    """``a = 1, b = 2``: a bare list of values named by distinct names, as {name: value}."""
    if seq.open or not seq.items:
        return None
    named = {}
    for item in seq.items:
        if not (isinstance(item, Relation) and item.ops == ("=",) and is_name(item.parts[0])):
            return None
        name = _key(item.parts[0])
        if name in named:
            return None
        named[name] = item.parts[1]
    return named


def _seqs_equal(g: Seq, p: Seq, ctx) -> bool:
    g_named, p_named = _named_values(g), _named_values(p)
    if g_named is not None and p_named is not None:  # a_3 = 2, a_37 = 19 in any order
        return g_named.keys() == p_named.keys() and all(
            values_equal(g_named[k], p_named[k], ctx) for k in g_named
        )
    if (g_named is None) != (p_named is None) and (g.open or p.open):
        # x = 1, y = 2 against (1, 2): coordinates named in order
        named, other = (g, p) if g_named is not None else (p, g)
        values = _coordinates(named)
        if (other.open, other.close) == ("(", ")") and len(values) == len(other.items):
            pairs = (
                zip(values, other.items, strict=True)
                if named is g
                else zip(other.items, values, strict=True)
            )
            return all(values_equal(a, b, ctx) for a, b in pairs)
    if not g.open and not p.open:  # "1, 2" against "2, 1": several answers, any order
        if _all_inequalities(g) or _all_inequalities(p):
            return _sets_equal(g, p) or _unordered_equal(g.items, p.items, ctx)
        if _all_tuples(g) and _all_tuples(p):
            # solutions of a system: a tuple listed twice is still one solution
            return _unordered_equal(_dedupe(g.items, ctx), _dedupe(p.items, ctx), ctx)
        return _unordered_equal(g.items, p.items, ctx)
    if not g.open or not p.open:  # "3, \pi/2" against "(3, \pi/2)": a point written bare
        bracketed = g if g.open else p
        if (bracketed.open, bracketed.close) != ("(", ")"):
            return False
    elif (g.open, g.close) != (p.open, p.close):  # [0, 1) is not (0, 1)
        return False
    return len(g.items) == len(p.items) and all(
        values_equal(a, b, ctx) for a, b in zip(g.items, p.items, strict=True)
    )


# names of coordinates in their order: y = 8, x = 5 is the point (5, 8)
_COORDINATE_ORDERS = (
    ("x", "y", "z", "w"), ("a", "b", "c", "d"), ("m", "n"), ("p", "q"), ("h", "k"), ("u", "v"),
    ("r", "theta"), ("rho", "theta", "phi"), ("r", "theta", "z"),
)  # fmt: skip


def _coordinates(named: Seq) -> tuple:
    """The values of ``x = 5, y = 8`` in coordinate order (the written order when the names
    are not the coordinates of one system)."""
    names = [
        item.parts[0].expr.name if isinstance(item.parts[0].expr, sympy.Symbol) else None
        for item in named.items
    ]
    values = tuple(item.parts[1] for item in named.items)
    if None in names:
        return values
    for order in _COORDINATE_ORDERS:
        if set(names) == set(order[: len(names)]):
            return tuple(v for _, v in sorted(zip(names, values, strict=True),
                                              key=lambda nv: order.index(nv[0])))  # fmt: skip
    return values


def _all_tuples(seq: Seq) -> bool:
    return bool(seq.items) and all(
        isinstance(i, Seq) and (i.open, i.close) == ("(", ")") for i in seq.items
    )


def _matrix_equal(g, p, ctx) -> bool:
    def rows_of(value):
        if isinstance(value, Matrix):
            return value.rows
        if isinstance(value, Scalar):
            other = p if value is g else g
            if isinstance(other, Matrix) and len(other.rows[0]) == 1:
                return _unit_vector_column(value, len(other.rows))
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
        values_equal(a, b, ctx)
        for g_row, p_row in zip(g_rows, p_rows, strict=True)
        for a, b in zip(g_row, p_row, strict=True)
    )


_UNIT_VECTOR_NAMES = {
    axis: {axis, f"hat({axis})", f"vec({axis})", f"widehat({axis})", f"overrightarrow({axis})"}
    for axis in "ijk"
}  # fmt: skip


def _unit_vector_column(value: Scalar, size: int):
    """``a i + b j + c k`` (``\\mathbf{i}``, ``\\hat{i}``) as the column (a, b, c), when the
    gold is a column of 2 or 3 entries; None when the value is not written that way."""
    if size not in (2, 3) or value.unit or value.unit_word or value.base:
        return None
    expr = sympy.expand(value.expr)
    symbols = {s.name: s for s in expr.free_symbols}
    axes = {}
    rest = expr
    for axis in "ijk"[:size]:
        names = _UNIT_VECTOR_NAMES[axis] & set(symbols)
        if len(names) > 1:
            return None
        if names:
            symbol = symbols[names.pop()]
            axes[axis] = rest.coeff(symbol)
            rest = sympy.expand(rest - axes[axis] * symbol)
    if "i" not in axes and rest.has(sympy.I):  # i read as the imaginary unit
        axes["i"] = rest.coeff(sympy.I)
        rest = sympy.expand(rest - axes["i"] * sympy.I)
    axes = [axes.get(axis, sympy.Integer(0)) for axis in "ijk"[:size]]
    if rest != 0 or any(a.free_symbols for a in axes) or not any(a != 0 for a in axes):
        return None
    allowed = set().union(*_UNIT_VECTOR_NAMES.values())
    if any(name not in allowed for name in symbols) or not (
        {"j", "k"} & set(symbols) or any(n in symbols for n in _UNIT_VECTOR_NAMES["i"])
    ):
        return None  # 3 + 2i against a vector is a complex number, not a vector
    return tuple((Scalar(a),) for a in axes)


# --------------------------------------------------------------------------- relations


def _chain_ends(rel: Relation) -> Relation:
    """``x = 5 + 5 + 1 = 11``: a chain of equalities states its first and last members."""
    if len(rel.ops) > 1 and all(op == "=" for op in rel.ops):
        return Relation((rel.parts[0], rel.parts[-1]), ("=",))
    return rel


def _gold_forms(rel: Relation) -> list:
    """What a relation may be compared with when the other side is a plain value."""
    forms = []
    if len(rel.ops) > 1 and all(op == "=" for op in rel.ops):
        forms.append(rel.parts[-1])
    elif len(rel.ops) == 1 and rel.ops[0] in ("=", "in") and is_name(rel.parts[0]):
        forms.append(rel.parts[1])
    interval = _inequality_interval(rel)
    if interval is not None:
        forms.append(interval)
    elif any(op in ("<", "<=", ">", ">=", "!=") for op in rel.ops):
        solved = _relation_set(rel)
        if solved is not None:
            forms.append(_Solved(solved))
    return forms


def _pred_forms(rel: Relation, ctx: _Context) -> list:
    """A predicted relation against a gold value: also ``5 \\times 6 \\times 4 = 120``
    (a computation ending in its result), ``2 \\text{ h} = 120`` (a quantity converted) and
    ``m + n = 25`` (the asked sum, stated). A computation without a unit must be right to
    state a result: ``5 = 4`` is false, and says nothing about 4."""
    forms = _gold_forms(rel)
    if rel.ops == ("=",) and all(isinstance(x, Scalar) for x in rel.parts):
        left, right = rel.parts[0].expr, rel.parts[1].expr
        if right.free_symbols:
            return forms
        if not left.free_symbols:
            converted = rel.parts[0].unit is not None or rel.parts[0].unit_word is not None
            # the result judged as a gold would judge it: 10/3 = 3.33 at the precision written
            if converted or values_equal(rel.parts[1], rel.parts[0], ctx):
                forms.append(rel.parts[1])
        elif isinstance(left, sympy.Add) and all(isinstance(a, sympy.Symbol) for a in left.args):
            forms.append(rel.parts[1])
    return forms


_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "!=": "!="}


def _ascending(rel: Relation) -> Relation:
    """Write a chain with < and <= only (x > 3 becomes 3 < x)."""
    if all(op in (">", ">=") for op in rel.ops):
        return Relation(tuple(reversed(rel.parts)), tuple(_FLIP[op] for op in reversed(rel.ops)))
    return rel


def _is_variable(expr) -> bool:
    return isinstance(expr, sympy.Symbol | sympy.core.function.AppliedUndef)


def _inequality_interval(rel: Relation) -> Seq | None:
    rel = _ascending(rel)
    if any(op not in ("<", "<=") for op in rel.ops) or not all(
        isinstance(p, Scalar) for p in rel.parts
    ):
        return None
    exprs = [p.expr for p in rel.parts]
    if len(exprs) == 2:
        if _is_variable(exprs[0]) and not exprs[1].free_symbols:
            lo, hi, lo_open, hi_open = -sympy.oo, exprs[1], True, rel.ops[0] == "<"
        elif _is_variable(exprs[1]) and not exprs[0].free_symbols:
            lo, hi, lo_open, hi_open = exprs[0], sympy.oo, rel.ops[0] == "<", True
        else:
            return None
    elif len(exprs) == 3 and _is_variable(exprs[1]):
        if exprs[0].free_symbols or exprs[2].free_symbols:
            return None
        lo, hi = exprs[0], exprs[2]
        lo_open, hi_open = rel.ops[0] == "<", rel.ops[1] == "<"
    else:
        return None
    return Seq((Scalar(lo), Scalar(hi)), "(" if lo_open else "[", ")" if hi_open else "]")


def _variable(value):
    """The one variable an inequality, a membership or a list of them is about."""
    if isinstance(value, Seq) and not value.open:
        found = {_variable(item) for item in value.items}
        return found.pop() if len(found) == 1 else None
    if not isinstance(value, Relation):
        return None
    if value.ops == ("in",) and isinstance(value.parts[0], Scalar):
        expr = value.parts[0].expr
        return expr if _is_variable(expr) else None
    if all(isinstance(p, Scalar) for p in value.parts):
        symbols = set().union(*(p.expr.free_symbols for p in value.parts))
        return symbols.pop() if len(symbols) == 1 else None
    return None


_SYMPY_RELATIONS = {
    "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge, "=": sympy.Eq, "!=": sympy.Ne,
}  # fmt: skip


def _relation_set(rel: Relation, var=None) -> sympy.Set | None:
    """The real numbers a one-variable relation holds for: 1 \\le |z| \\le 3/2 is
    [-3/2, -1] \\cup [1, 3/2]."""
    var = var if var is not None else _variable(rel)
    if var is None:
        return None
    if rel.ops == ("in",):
        inner = _as_sympy_set(rel.parts[1])
        return inner.intersect(sympy.S.Reals) if inner is not None else None
    if not all(isinstance(p, Scalar) for p in rel.parts):
        return None
    result = sympy.S.Reals
    symbol = var if isinstance(var, sympy.Symbol) else sympy.Dummy("v")
    for left, op, right in zip(rel.parts, rel.ops, rel.parts[1:], strict=False):
        a, b = left.expr, right.expr
        if not isinstance(var, sympy.Symbol):
            a, b = a.subs(var, symbol), b.subs(var, symbol)
        try:
            solved = sympy.solveset(_SYMPY_RELATIONS[op](a, b), symbol, sympy.S.Reals)
        except (NotImplementedError, ValueError, TypeError):
            return None
        if isinstance(solved, sympy.ConditionSet):
            return None
        result = result.intersect(solved)
    return result


def _all_inequalities(seq: Seq) -> bool:
    return bool(seq.items) and all(
        isinstance(i, Relation) and any(op in ("<", "<=", ">", ">=") for op in i.ops)
        for i in seq.items
    )


def _relations_equal(g: Relation, p: Relation, ctx) -> bool:
    g, p = _ascending(_chain_ends(g)), _ascending(_chain_ends(p))
    if g.ops != p.ops:
        # x \in (3, \infty) against x > 3: the same set of one variable, written two ways
        if _variable(g) is None or _variable(g) != _variable(p):
            return False
        return _sets_equal(g, p)
    op = g.ops[0]
    if len(g.ops) > 1:
        if all(values_equal(a, b, ctx) for a, b in zip(g.parts, p.parts, strict=True)):
            return True
        return _variable(g) is not None and _variable(g) == _variable(p) and _sets_equal(g, p)
    (gl, gr), (pl, pr) = g.parts, p.parts
    gl, pl, pr = _rename_function_argument(gl, pl, pr)
    if values_equal(gl, pl, ctx) and values_equal(gr, pr, ctx):
        return True
    if op in ("=", "!=") and values_equal(gl, pr, ctx) and values_equal(gr, pl, ctx):
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
        if op in ("<", "<=") and _variable(g) is not None and _variable(g) == _variable(p):
            return _sets_equal(g, p)
        return False
    if op in ("=", "!="):
        return True
    return bool(ratio.is_positive)


def _rename_function_argument(gl, pl, pr):
    """f(x) = x and f(n) = n define one function: the prediction's variable is renamed."""
    if not (isinstance(gl, Scalar) and isinstance(pl, Scalar) and isinstance(pr, Scalar)):
        return gl, pl, pr
    ge, pe = gl.expr, pl.expr
    if not (
        isinstance(ge, sympy.core.function.AppliedUndef)
        and isinstance(pe, sympy.core.function.AppliedUndef)
        and ge.func == pe.func
        and len(ge.args) == len(pe.args)
        and all(isinstance(a, sympy.Symbol) for a in ge.args + pe.args)
        and ge.args != pe.args
        # f(m) = n^2 is not f(n) = n^2: renaming must not capture a name already used
        and not (pr.expr.free_symbols - set(pe.args)) & set(ge.args)
    ):
        return gl, pl, pr
    mapping = dict(zip(pe.args, ge.args, strict=True))
    renamed = cast(sympy.Expr, pr.expr.xreplace(mapping))  # symbols for symbols: an Expr still
    return gl, Scalar(ge), Scalar(renamed, pr.decimal_places, pr.significant_digits)


# --------------------------------------------------------------------------- sets

_NUMBER_SETS = {
    "R": sympy.S.Reals, "Z": sympy.S.Integers, "N": sympy.S.Naturals,
    "Q": sympy.S.Rationals, "C": sympy.S.Complexes,
}  # fmt: skip


def _as_sympy_set(value):
    if isinstance(value, _Solved):
        return value.value
    if isinstance(value, NumberSet):
        return _NUMBER_SETS[value.name]
    if isinstance(value, SetOp):
        parts = [_as_sympy_set(p) for p in value.parts]
        if any(p is None for p in parts):
            return None
        result = parts[0]
        for op, part in zip(value.ops, parts[1:], strict=True):
            if op == "cup":
                result = sympy.Union(result, part)
            elif op == "cap":
                result = sympy.Intersection(result, part)
            else:
                result = sympy.Complement(result, part)
        return result
    if isinstance(value, SetBuilder):
        condition = value.condition
        if isinstance(condition, Relation):
            return _relation_set(condition, value.var)
        if isinstance(condition, Seq):
            return _joined_relations_set(condition, value.var)
        return None
    if isinstance(value, Relation):
        return _relation_set(value)
    if isinstance(value, Seq) and not value.open:
        return _joined_relations_set(value, None)
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


def _joined_relations_set(seq: Seq, var):
    """x < -1 or x > 2 is a union; -1 < x and x < 2 an intersection."""
    if not seq.items or not all(isinstance(i, Relation) for i in seq.items):
        return None
    sets = [_relation_set(i, var) for i in seq.items]
    if any(s is None for s in sets):
        return None
    if seq.seps and all(s == "and" for s in seq.seps) and _all_inequalities(seq):
        return sympy.Intersection(*sets)
    return sympy.Union(*sets)


def _sets_equal(g, p) -> bool:
    gs, ps = _as_sympy_set(g), _as_sympy_set(p)
    if gs is None or ps is None:
        if isinstance(g, SetOp) and isinstance(p, SetOp) and g.ops == p.ops:
            return _unordered_equal(g.parts, p.parts, _Context(DEFAULT_POLICY))
        return False
    if gs == ps:
        return True
    try:
        return bool(
            sympy.Complement(gs, ps) is sympy.S.EmptySet
            and sympy.Complement(ps, gs) is sympy.S.EmptySet
        )
    except (TypeError, ValueError, NotImplementedError):
        return False


# --------------------------------------------------------------------------- scalars


def scalars_equal(g: Scalar, p: Scalar, ctx: _Context | None = None) -> bool:
    ctx = ctx or _Context(DEFAULT_POLICY)
    if g.base is not None or p.base is not None:
        # 52_8: the same digits, with or without the base written
        if g.base is not None and p.base is not None:
            return g.base == p.base and g.expr == p.expr
        return g.expr == p.expr and (g.base or p.base) is not None
    if units_differ(g.unit_word, p.unit_word):
        return False  # 5 cm is not 5 m
    if g.unit != p.unit and (g.unit or p.unit):
        marked, other = (g, p) if g.unit else (p, g)
        if other.unit is not None:
            return False
        factor = sympy.Rational(1, 100) if marked.unit == "percent" else sympy.pi / 180
        # "20%" may be answered "20" or "0.2"; "30^\circ" as "30" or "\pi/6"
        if marked is g:
            return _exprs_equal(g.expr, p.expr, g, p, ctx) or _exprs_equal(
                g.expr * factor, p.expr, None, None, ctx
            )
        return _exprs_equal(g.expr, p.expr, g, p, ctx) or _exprs_equal(
            g.expr, p.expr * factor, None, None, ctx
        )
    return _exprs_equal(g.expr, p.expr, g, p, ctx)


def _number(value: Scalar | None, expr) -> Number | None:
    if value is None:
        return None
    return Number(Fraction(int(expr.p), int(expr.q)), value.decimal_places)


def _exprs_equal(a, b, g: Scalar | None, p: Scalar | None, ctx: _Context) -> bool:
    if a == b:
        return True
    if isinstance(a, sympy.MatrixBase) or isinstance(b, sympy.MatrixBase):
        return False
    if a.free_symbols != b.free_symbols:
        return False
    if a.is_Rational and b.is_Rational:
        return rationals_equal(
            Fraction(int(a.p), int(a.q)), Fraction(int(b.p), int(b.q)),
            _number(g, a), _number(p, b), ctx.tolerance,
        )  # fmt: skip
    if a.has(sympy.Sum, sympy.Product) or b.has(sympy.Sum, sympy.Product):
        return bool(sympy.simplify(a - b) == 0)
    diff = a - b
    if diff.is_Number:
        # the difference cancelled to a constant: x vs x + 1 differ however large x is
        return bool(diff == 0) or _approximately(a, b, g, p, ctx)
    if a.free_symbols:
        return _symbolic_equal(a, b)
    if a.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan) or b.has(
        sympy.oo, -sympy.oo, sympy.zoo, sympy.nan
    ):
        return False
    va, vb = _evaluate(a), _evaluate(b)
    if va is None or vb is None:
        return bool(sympy.simplify(a - b) == 0)
    if _close(va, vb, RELATIVE_TOLERANCE):
        return True
    return _approximately(a, b, g, p, ctx, va, vb)


def _approximately(a, b, g, p, ctx, va=None, vb=None) -> bool:
    """A decimal gold that is the rounding of the exact prediction, or (with a tolerance)
    two numbers within it."""
    if (
        g is not None
        and p is not None
        and g.decimal_places is not None
        and (p.decimal_places is None and not (b.is_Rational and _terminates(b)))
    ):
        value = vb if vb is not None else _evaluate(b)
        if value is not None and value[1].is_zero:
            half_ulp = sympy.Rational(1, 2) * sympy.Rational(10) ** (-g.decimal_places)
            if abs(value[0] - sympy.Float(a, NUMERIC_DIGITS)) <= half_ulp * (
                1 + sympy.Rational(1, 10**9)
            ):
                return True
    if ctx.tolerance is None:
        return False
    va = va if va is not None else _evaluate(a)
    vb = vb if vb is not None else _evaluate(b)
    if va is None or vb is None:
        return False
    return _close(va, vb, sympy.Rational(ctx.tolerance.numerator, ctx.tolerance.denominator))


def _evaluate(expr, subs=None):
    try:
        value = expr.evalf(NUMERIC_DIGITS, subs=subs)
    except (ValueError, TypeError, ZeroDivisionError, ArithmeticError):
        return None  # floor(log 0) and the like: no value at this point
    if not value.is_number or value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
        return None
    re_part, im_part = value.as_real_imag()
    if not (re_part.is_Number and im_part.is_Number):
        return None
    return sympy.Float(re_part, NUMERIC_DIGITS), sympy.Float(im_part, NUMERIC_DIGITS)


def _close(va, vb, tolerance) -> bool:
    (ar, ai), (br, bi) = va, vb
    diff = abs(ar - br) + abs(ai - bi)
    scale = max(abs(ar) + abs(ai), abs(br) + abs(bi))
    if scale.is_zero:
        return bool(diff.is_zero)
    return bool(diff <= scale * tolerance)


def _terminates(value) -> bool:
    q = int(value.q)
    for prime in (2, 5):
        while q % prime == 0:
            q //= prime
    return q == 1


def _symbolic_equal(a, b) -> bool:
    """Equal by algebra (the difference expands to zero), else at several points that
    include zero and negatives (|x| is not x), else by ``simplify``."""
    diff = a - b
    if not _has_big_power(diff) and sympy.expand(diff) == 0:
        return True
    symbols = sorted(diff.free_symbols, key=lambda s: s.name)
    agreed = 0
    for k in range(len(_PROBES)):
        point = {s: _PROBES[(k + 2 * j) % len(_PROBES)] for j, s in enumerate(symbols)}
        va, vb = _evaluate(a, point), _evaluate(b, point)
        if va is None or vb is None:
            continue  # a pole or an undefined value here
        if _negligible(va) and _negligible(vb):
            agreed += 1  # both zero here, up to the rounding of the working precision
            continue
        if not _close(va, vb, RELATIVE_TOLERANCE):
            return False
        agreed += 1
    if agreed >= PROBE_POINTS:
        return True
    return bool(sympy.simplify(diff) == 0)


def _negligible(value) -> bool:
    return abs(value[0]) + abs(value[1]) < PROBE_ZERO


def _has_big_power(expr) -> bool:
    return any(
        isinstance(node, sympy.Pow) and node.exp.is_Integer and abs(node.exp) > 64
        for node in sympy.preorder_traversal(expr)
    )
