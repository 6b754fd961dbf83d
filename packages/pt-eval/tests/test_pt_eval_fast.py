"""The sympy-free path for plain numbers must decide exactly as the full parser does: every
pair of these spellings is compared both ways, under the default policy and with a
tolerance, and each number's majority key is the one the full parser gives it."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from pt_eval.equivalence import answer_key, answers_match
from pt_eval.numbers import number_key, numbers_equal, parse_number
from pt_eval.policy import Policy

SPELLINGS = [
    "5", "-5", "+5", "5.", "5.0", "05", "0.5", ".5", "1/2", "\\frac12", "\\frac{1}{2}",
    "\\dfrac{1}{2}", "\\tfrac 1 2", "2\\frac12", "-2\\frac12", "2 1/2", "-2 1/2", "2.5",
    "-2.5", "50\\%", "50%", "50 \\%", "0.50", "1,000", "1{,}000", "1\\,000", "1 000", "1000",
    "1e3", "1.5e3", "1500", "30^\\circ", "30^{\\circ}", "30", "\\$5", "5 \\text{ dollars}",
    "5 \\text{ cents}", "5 \\text{ cm}", "5 \\text{ m}", "5 cm", "0.333", "\\frac13", "0.33",
    "0.3333", "3.14", "3.1416", "\\frac{22}{7}", "0", "-0", "0.0", "\\frac{-1}{2}", "-0.5",
    "12\\frac{3}{5}", "12.6", "1.26e1", "100.005", "100", "33.3\\%", "1/3", "20 \\text{ percent}",
    "7 \\text{ apples}", "5 \\text{ min}", "5 \\text{ minutes}", "1,234.5", "1234.5", "0.1", "0.10000000000000001",
]  # fmt: skip
PLAIN = [s for s in SPELLINGS if parse_number(s) is not None]


def test_nearly_all_spellings_take_the_fast_path():
    assert len(PLAIN) >= len(SPELLINGS) - 2, set(SPELLINGS) - set(PLAIN)


@pytest.mark.parametrize("tolerance", [None, 1e-4], ids=["exact", "tolerance"])
def test_fast_and_full_paths_agree_on_every_pair(tolerance):
    policy = Policy(numeric_tolerance=tolerance)
    disagreements = []
    for gold, pred in itertools.product(PLAIN, repeat=2):
        fast = numbers_equal(parse_number(gold), parse_number(pred), policy.tolerance)
        full = answers_match(gold, pred, policy)
        if fast != full:
            disagreements.append((gold, pred, fast, full))
    assert disagreements == []


def test_majority_keys_are_the_full_parsers():
    assert [number_key(parse_number(s)) for s in PLAIN] == [answer_key(s) for s in PLAIN]


def test_plain_numbers_are_graded_without_importing_sympy():
    code = (
        "import sys\n"
        "from pt_eval.worker import GradingPool\n"
        "with GradingPool(workers=1) as pool:\n"
        "    results = pool.grade([('so \\\\boxed{\\\\frac12}', '0.5'), ('The answer is 3.', '4'),\n"
        "                          ('\\\\boxed{B}', '\\\\text{(B)}'), ('no idea', '1')])\n"
        "assert [r['correct'] for r in results] == [True, False, True, False], results\n"
        "assert 'sympy' not in sys.modules and pool._server is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
