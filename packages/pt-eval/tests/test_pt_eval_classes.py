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


# --------------------------------------------------------------------------- cut-off rule


def test_a_bare_number_at_the_end_is_finished_unless_the_file_says_otherwise():
    response = "We add the two cases.\nSo the total number of ways is 6 + 8 = 14"
    assert grade_item(response, "14")["correct"] is True  # no finish_reason: finished
    assert grade_item(response, "14", truncated=False)["correct"] is True
    # finish_reason "length": the last number of a cut-off response is not its answer
    assert grade_item(response, "14", truncated=True)["status"] == "no_answer"
    # finish_reason "stop" overrides the text: a response ending mid-sentence did finish
    unfinished = "We compute 3 + 4 = 7 and then multiply by"
    assert grade_item(unfinished, "7")["status"] == "no_answer"
    assert grade_item(unfinished, "7", truncated=False)["correct"] is True


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"finish_reason": "length"}, [True]),
        ({"finish_reason": "stop"}, [False]),
        ({"stop_reason": "max_tokens"}, [True]),  # Anthropic's spelling
        ({"stop_reason": "end_turn"}, [False]),
        ({"stop_reason": "</answer>"}, [False]),  # vLLM: the stop string that matched
        ({"stop_reason": 151645}, [False]),  # vLLM: the stop token id
        ({"stop_reason": None}, [None]),  # vLLM: EOS or length, it does not say which
        ({}, [None]),
    ],
)
def test_finish_reason_and_stop_reason(row, expected):
    from pt_eval.grade import _truncation

    assert _truncation(row, 1, "") == expected


def test_stop_reason_in_a_file(tmp_path):
    import json

    from pt_eval.grade import GradeOptions, grade_file

    rows = [
        {"id": 1, "answer": "14", "response": "So the total is 6 + 8 = 14", "stop_reason": "length"},
        {"id": 2, "answer": "14", "response": "So the total is 6 + 8 = 14", "stop_reason": "end_turn"},
        {"id": 3, "answer": "14", "response": "So the total is 6 + 8 = 14"},
    ]  # fmt: skip
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, summary = grade_file(src, tmp_path / "out.jsonl", GradeOptions(workers=1))
    graded = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [g["grade_status"] for g in graded] == ["no_answer", "ok", "ok"]
    assert [g["correct"] for g in graded] == [False, True, True]


# --------------------------------------------------------------------------- parsing edge cases


def test_unicode_digits_never_raise_inside_answers_match():
    # a x10 power in Unicode superscripts used to raise AssertionError in the tokenizer
    assert answers_match("4.5e33", "4.5×10³³") is True
    assert answers_match("7e37", "7×10³⁷") is True
    for odd in ("①", "4.5×10¹³", "x⁽²⁾", "10\u00b9\u2070\u2070"):
        assert answers_match("12", odd) is False  # no exception of any kind


def test_nul_characters_in_a_response_and_an_answer():
    result = grade_item("The answer is $\\boxed{7}$\x00\x00", "7")
    assert result["correct"] is True and "\x00" not in result["extracted"]
    assert grade_item("\x00", "7")["status"] == "no_answer"
    assert answers_match("\\frac{1}{2}", "\x00\\frac{1}{2}") is True
