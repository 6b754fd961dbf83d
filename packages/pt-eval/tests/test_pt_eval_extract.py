"""Finding the final answer in a response."""

from __future__ import annotations

import pytest

from pt_eval.extract import extract_answer, gold_answer, last_boxed


@pytest.mark.parametrize(
    ("response", "expected", "why"),
    [
        ("so $x = \\boxed{5}$.", "5", "a plain box"),
        ("\\boxed{1} then \\boxed{2}", "2", "the last box wins"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "nested braces"),
        (
            "\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}",
            "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
            "an environment inside a box",
        ),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}", "escaped braces do not close the box"),
        ("the answer is $\\boxed 5$", "5", "\\boxed without braces"),
        ("\\fbox{7}", "7", "\\fbox"),
        ("\\boxed{3} and later \\boxed{4", "3", "an unfinished box is skipped"),
        (
            "The final answer is $\\frac{1}{3}$. I hope it is correct.",
            "\\frac{1}{3}",
            "Minerva format",
        ),
        ("Therefore, the answer is 42.", "42", "the answer is"),
        ("So the answer is $\\frac{2}{3}$, which is", "\\frac{2}{3}", "the answer is, in dollars"),
        ("Janet sells 9 eggs.\n#### 18", "18", "GSM8K"),
        ("I compared them all. The answer is (C).", "(C)", "a multiple-choice letter"),
        ("Answer: B", "B", "an answer line with a letter"),
        ("<think>maybe \\boxed{1}</think> so \\boxed{2}", "2", "only text after </think> counts"),
        (
            "<think>\\boxed{1}</think> I am not sure.",
            None,
            "a box inside the thinking is not an answer",
        ),
        ("\\frac{1}{2}", "\\frac{1}{2}", "a bare short answer"),
        ("We have 3 apples and then 7 more.", "7", "the last number of a finished response"),
        ("We have 3 apples and then 7 more", None, "a response that stops mid-sentence"),
        ("We get 1,234 in total.", "1234", "the last number keeps its thousands"),
        ("", None, "an empty response"),
        ("No idea.", None, "no number at all"),
    ],
)
def test_extract(response, expected, why):
    assert extract_answer(response) == expected, why


def test_last_number_fallback_can_be_switched_off():
    assert extract_answer("I think it is 7 or so", last_number=False) is None
    assert extract_answer("\\boxed{7}", last_number=False) == "7"


def test_deep_braces_and_long_text_are_linear():
    # 10,000 nested braces and a 5 MB response: found by one scan, no regex backtracking
    deep = "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}"
    assert last_boxed(deep) == "{" * 10_000 + "1" + "}" * 10_000
    long = "word " * 1_000_000 + "\\boxed{9}"
    assert extract_answer(long) == "9"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (27.0, "27"),  # AMC23 stores floats
        (3, "3"),
        ("025", "025"),
        (["$2$", "$3$"], "2, 3"),  # OlympiadBench lists
        ("Janet sells 16 - 3 - 4 = 9 eggs.\n#### 18", "18"),  # GSM8K worked answers
        ("so it is \\boxed{1.6} cm", "1.6"),  # Minerva solutions
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
    ],
)
def test_gold_answer(value, expected):
    assert gold_answer(value) == expected


@pytest.mark.parametrize(
    "text",
    [
        "\n" * 200_000,
        " " * 200_000 + "x",
        "$" * 100_000,
        "\\boxed{" * 50_000,
        "the answer is " * 20_000,
        "#### " * 40_000,
        "\\[\n" * 50_000,
        "1," * 100_000,
    ],
    ids=["newlines", "spaces", "dollars", "open-boxes", "statements", "markers", "displays",
         "commas"],
)  # fmt: skip
def test_extraction_is_linear_on_long_runs(text):
    # Every scan is linear: these take about 10-50 ms here. The bound is loose on purpose
    # (the machine is shared); a quadratic scan of 200k characters takes minutes, not seconds.
    import time

    start = time.perf_counter()
    extract_answer(text, last_number=True)
    assert time.perf_counter() - start < 2.0
