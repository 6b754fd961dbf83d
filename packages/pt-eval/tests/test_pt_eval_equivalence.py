"""The equivalence rules, as labelled (gold, prediction, expected) cases.

The cases live in grading_cases.py, each with the reason its label is right; here they
are checked one by one, and the table itself is checked for coverage: at least 300
cases, at least as many traps (expected False) as matches.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pt_eval.equivalence import answer_key, answers_match
from pt_eval.parse import ParseError, Relation, Scalar, Seq, SetOf, Text, TooLarge, parse_answer


def _load_cases() -> list[tuple]:
    spec = importlib.util.spec_from_file_location(
        "pt_eval_grading_cases", Path(__file__).with_name("grading_cases.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CASES


CASES = _load_cases()


@pytest.mark.parametrize(
    ("gold", "pred", "expected", "why"),
    CASES,
    ids=[f"{i}:{c[3][:40]}" for i, c in enumerate(CASES)],
)
def test_case(gold, pred, expected, why):
    assert answers_match(gold, pred) is expected, why


def test_the_table_is_large_and_has_as_many_traps_as_matches():
    matches = sum(1 for c in CASES if c[2])
    traps = sum(1 for c in CASES if not c[2])
    assert len(CASES) >= 300
    assert traps >= matches
    assert len({(c[0], c[1]) for c in CASES}) == len(CASES), "a (gold, prediction) pair is repeated"


def test_the_issue_traps_are_in_the_table():
    pairs = {(c[0], c[1]): c[2] for c in CASES}
    assert pairs[("a+b", "c+b")] is False
    assert pairs[("0.5", "50")] is False
    assert pairs[("\\frac{1}{2004!}", "\\frac{1}{2006!}")] is False


def test_equivalence_is_symmetric_on_the_plain_cases():
    # gold and prediction roles only differ for relations, marks like % (the gold may omit
    # them) and decimals (a decimal gold is judged at its precision, an exact one is not);
    # for two other plain numbers or expressions the answer must not depend on order
    checked = 0
    for gold, pred, expected, why in CASES:
        try:
            g, p = parse_answer(gold), parse_answer(pred)
        except ParseError:
            continue
        if all(
            isinstance(v, Scalar) and v.unit is None and v.base is None
            and v.decimal_places is None
            for v in (g, p)
        ):  # fmt: skip
            assert answers_match(pred, gold) is expected, why
            checked += 1
    assert checked > 150


def test_values_have_the_expected_shapes():
    assert isinstance(parse_answer("(1, 2]"), Seq)
    assert parse_answer("(1, 2]").open == "(" and parse_answer("(1, 2]").close == "]"
    assert isinstance(parse_answer("\\{1, 2\\}"), SetOf)
    assert isinstance(parse_answer("y = 2x + 1"), Relation)
    assert parse_answer("\\text{(C)}") == Text("C")
    assert parse_answer("0.333").decimal_places == 3


def test_huge_powers_are_refused_not_computed():
    # 9^(9^(9^9)) has about 3.7e8 digits in its exponent: the parser says so instead of trying
    with pytest.raises(TooLarge):
        parse_answer("9^{9^{9^{9}}}")
    with pytest.raises(TooLarge):
        parse_answer("(" * 100 + "1" + ")" * 100)


def test_majority_keys_group_equal_answers():
    assert answer_key("0.5") == answer_key("\\frac{1}{2}") == answer_key("\\dfrac12")
    assert answer_key("0.5") != answer_key("0.25")
    assert answer_key("1, 2") == answer_key("2, 1")  # bare lists are unordered
    assert answer_key("(1, 2)") != answer_key("(2, 1)")


def test_nothing_in_the_parser_evaluates_text(tmp_path):
    marker = tmp_path / "executed"
    for text in (
        f"__import__('os').system('touch {marker}')",
        f"__import__('pathlib').Path('{marker}').touch()",
        f"exec(\"open('{marker}', 'w')\")",
    ):
        assert answers_match("1", text) is False
    assert not marker.exists()


@pytest.mark.parametrize(
    "broken",
    ["2_6%", "\\frac2.1", "{{", "\\frac{", "(1,2", "\\sqrt", "^", "x^", ",", "\\left(", ")(",
     "\\begin{pmatrix} 1 & 2 \\\\ 3 \\end{pmatrix}", "1 2", "\\foo{1}", "\\emptyset + 1"],
)  # fmt: skip
def test_malformed_answers_are_wrong_not_crashes(broken):
    # found by fuzzing benchmark golds: every one must come back False, not raise
    assert answers_match("1", broken) is False
    assert answers_match(broken, "1") is False
