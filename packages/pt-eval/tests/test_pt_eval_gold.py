"""Gold against itself: every benchmark's gold answer, given as a boxed prediction, is
graded correct. The few golds that are not math the parser reads (economics acronyms,
a sentence) are listed with the reason; they still match themselves as text."""

from __future__ import annotations

import re

import pytest

from pt_eval.benchmarks import BENCHMARKS, load_benchmark, shared_dir
from pt_eval.item import grade_item
from pt_eval.parse import ParseError, parse_answer

# Golds graded as text because they are not formulas (they still match themselves).
UNPARSED_GOLDS = {
    "MR=SRMC": "economics acronyms (marginal revenue, short-run marginal cost), not products",
    "SRAC=LRAC": "economics acronyms",
    "SRMC=LRMC": "economics acronyms",
    "\\angle B E A_{1}=90$,$\\angle A E B_{1}=90": "named angles are geometry, not values",
    "f(x)=a x+b$, where $b$ is an arbitrary integer, and $a$ is an arbitrary positive "
    "integer with $\\mho(a)=0": "a sentence with conditions",
    "t(0,4]": "a parameter times an interval",
    "np.arcsin(10/13)": "numpy code in the gold",
}
EXPECTED_ROWS = {"math500": 500, "minerva_math": 272, "olympiadbench": 675, "aime24": 30,
                 "amc23": 40, "gsm8k": 1319}  # fmt: skip


def _shared_or_skip():
    try:
        return shared_dir()
    except Exception as exc:  # the shared data is not part of the package
        pytest.skip(f"no shared benchmark data: {exc}")


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_gold_against_itself_is_always_correct(name):
    _shared_or_skip()
    rows = load_benchmark(name)
    assert len(rows) == EXPECTED_ROWS[name]
    wrong = []
    for row in rows:
        gold = row["answer"]
        # the gold as written, without its spaces, and with \dfrac: the same answer each time
        for written in (gold, re.sub(r"(?<!\\) ", "", gold), gold.replace("\\frac", "\\dfrac")):
            result = grade_item(f"Putting it together, the answer is $\\boxed{{{written}}}$.", gold)
            if not (result["correct"] and result["status"] == "ok"):
                wrong.append((row["id"], gold, written, result))
    assert wrong == []


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_gold_answers_parse_as_math(name):
    _shared_or_skip()
    unparsed = []
    for row in load_benchmark(name):
        try:
            parse_answer(row["answer"])
        except ParseError:
            unparsed.append(row["answer"])
    assert set(unparsed) <= set(UNPARSED_GOLDS), set(unparsed) - set(UNPARSED_GOLDS)


def test_benchmark_rows_have_id_problem_and_string_answer():
    _shared_or_skip()
    gsm = load_benchmark("gsm8k")[0]
    assert gsm["answer"] == "18" and "####" in gsm["solution"]
    minerva = load_benchmark("minerva_math")[0]
    assert minerva["answer"] == "1.6"  # the last \boxed{} of its solution
    amc = load_benchmark("amc23")[0]
    assert amc["answer"] == "27"  # stored as the float 27.0
    olympiad = load_benchmark("olympiadbench")[0]
    assert olympiad["answer"] == "2" and olympiad["final_answer"] == ["2"]
    for name in BENCHMARKS:
        row = load_benchmark(name)[0]
        assert {"id", "problem", "answer"} <= set(row) and isinstance(row["answer"], str)
