"""Grade one (prediction, gold) pair: extract, compare, and say how it went.

This is what a worker process runs for each item; :mod:`pt_eval.worker` puts a
hard time limit around it.
"""

from __future__ import annotations

from collections import OrderedDict

from pt_eval.equivalence import answer_key, answers_match
from pt_eval.extract import extract_answer
from pt_eval.parse import TooLarge

MAX_PREDICTION_CHARS = 2_000_000  # about 500k tokens; a longer response is degenerate
MAX_EXTRACTED_SHOWN = 1_000  # the grades file keeps this much of a very long extracted answer

_cache: OrderedDict[tuple, tuple] = OrderedDict()
_CACHE_SIZE = 20_000


def grade_item(prediction, gold: str | None, *, last_number: bool = True) -> dict:
    """``{"extracted", "correct", "status", "key", "message"}`` for one response.

    status is ``ok`` (graded), ``no_answer`` (nothing to extract) or ``error``
    (the answer asks for more work than allowed, e.g. a 10^7-digit number); the
    pool adds ``timeout``.
    """
    if prediction is not None and not isinstance(prediction, str):
        prediction = str(prediction)
    if prediction is not None and len(prediction) > MAX_PREDICTION_CHARS:
        return _result(
            None,
            False,
            "error",
            message=f"prediction longer than {MAX_PREDICTION_CHARS} characters",
        )
    extracted = extract_answer(prediction, last_number=last_number) if prediction else None
    if extracted is None:
        return _result(None, False, "no_answer")
    if gold is None:
        return _result(extracted, False, "error", message="no gold answer")
    cache_key = (gold, extracted)
    hit = _cache.get(cache_key)
    if hit is None:
        try:
            hit = (answers_match(gold, extracted), answer_key(extracted))
        except (TooLarge, RecursionError, OverflowError, MemoryError) as exc:
            return _result(extracted, False, "error", message=f"{type(exc).__name__}: {exc}")
        _cache[cache_key] = hit
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    correct, key = hit
    return _result(extracted, correct, "ok", key=key)


def _result(extracted, correct, status, *, key=None, message=None) -> dict:
    if extracted is not None and len(extracted) > MAX_EXTRACTED_SHOWN:
        extracted = extracted[:MAX_EXTRACTED_SHOWN] + "..."
    return {
        "extracted": extracted,
        "correct": correct,
        "status": status,
        "key": key,
        "message": message,
    }


def warm_up() -> None:
    """Exercise the parser and comparisons once, so lazy imports inside sympy happen now."""
    for prediction, gold in (
        ("\\boxed{\\frac{x+1}{2}}", "\\frac{1+x}{2}"),
        ("\\boxed{2\\sqrt{3}+\\pi}", "\\pi+\\sqrt{12}"),
        ("\\boxed{(1, 2]}", "(1,2]"),
        ("\\boxed{\\sin^2 x}", "1-\\cos^2 x"),
    ):
        grade_item(prediction, gold)
    _cache.clear()
