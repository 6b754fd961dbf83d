"""Answer classes met on unseen benchmarks, case by case (the cases are in class_cases.py,
each with the reason its label is right), and the table checked for balance: every class
has matches and traps."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from pt_eval.equivalence import answers_match
from pt_eval.item import grade_item
from pt_eval.policy import Policy


def _load():
    spec = importlib.util.spec_from_file_location(
        "pt_eval_class_cases", Path(__file__).with_name("class_cases.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CASES = _load()


def _ids(cases):
    return [f"{c[0]}:{c[4][:40]}" for c in cases]


@pytest.mark.parametrize(("cls", "gold", "pred", "expected", "why"), CASES.ANSWERS,
                         ids=_ids(CASES.ANSWERS))  # fmt: skip
def test_answer(cls, gold, pred, expected, why):
    assert answers_match(gold, pred) is expected, why


@pytest.mark.parametrize(("cls", "gold", "response", "expected", "why"), CASES.RESPONSES,
                         ids=_ids(CASES.RESPONSES))  # fmt: skip
def test_response(cls, gold, response, expected, why):
    result = grade_item(response, gold)
    assert result["correct"] is expected, f"{why}: extracted {result['extracted']!r}"


@pytest.mark.parametrize(("cls", "gold", "pred", "expected", "why"), CASES.TOLERANT,
                         ids=_ids(CASES.TOLERANT))  # fmt: skip
def test_with_a_numeric_tolerance(cls, gold, pred, expected, why):
    assert answers_match(gold, pred, Policy(numeric_tolerance=1e-4)) is expected, why


def test_the_tolerance_is_off_by_default():
    # the same pairs without a tolerance: only exact values (or a decimal gold's rounding)
    assert answers_match("\\frac{1}{3}", "0.3333") is False
    assert answers_match("\\pi", "3.1416") is False
    assert answers_match("100", "100.005") is False


def test_every_class_has_matches_and_traps():
    table = CASES.ANSWERS + CASES.RESPONSES + CASES.TOLERANT
    matches = Counter(c[0] for c in table if c[3])
    traps = Counter(c[0] for c in table if not c[3])
    for cls in set(matches) | set(traps):
        assert matches[cls] >= 1 and traps[cls] >= 1, cls
    assert len({(c[1], c[2]) for c in CASES.ANSWERS}) == len(CASES.ANSWERS)


def test_a_cut_off_response_is_credited_only_when_asked():
    response = "We compute 3 + 4 = 7 and then multiply by"
    assert grade_item(response, "7")["status"] == "no_answer"
    asked = grade_item(response, "7", Policy(last_number=True))
    assert asked["correct"] is True and asked["extracted"] == "7"
    # finish_reason "length" marks a response cut off even when its text looks finished
    finished_looking = "The sum is 7."
    assert grade_item(finished_looking, "7")["correct"] is True
    assert grade_item(finished_looking, "7", truncated=True)["status"] == "no_answer"
