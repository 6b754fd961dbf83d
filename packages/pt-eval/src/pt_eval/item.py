"""Grade one (prediction, gold) pair: extract, compare, and say how it went.

:func:`prepare` runs in the main process without sympy: it extracts the answer and
grades plain numbers on the spot. Everything else is compared by :func:`grade_extracted`
in a worker process, which :mod:`pt_eval.worker` runs under a hard time limit.
:func:`grade_item` does both in the calling process (no time limit).
"""

from __future__ import annotations

import re
from collections import OrderedDict

from pt_eval.extract import extract_with_source, final_text, prose_words
from pt_eval.normalize import (
    MAX_ANSWER_CHARS,
    choice_letter,
    clean,
    squash,
    strip_text_wrappers,
)
from pt_eval.numbers import number_key, numbers_equal, parse_number
from pt_eval.policy import DEFAULT_POLICY, Policy

MAX_PREDICTION_CHARS = 2_000_000  # about 500k tokens; a longer response is degenerate
MAX_EXTRACTED_SHOWN = 1_000  # the grades file keeps this much of a very long extracted answer
# every answer equal to the gold is one answer for majority voting (they equal each other)
CORRECT_KEY = "correct"

_cache: OrderedDict[tuple, tuple] = OrderedDict()
_CACHE_SIZE = 20_000


def prepare(
    prediction, gold: str | None, policy: Policy = DEFAULT_POLICY, *, truncated: bool | None = None
) -> tuple[dict | None, str | None]:
    """``(result, extracted)``: the result when no worker is needed (no answer, plain
    numbers, a refused size), else None and the extracted answer for the worker."""
    if prediction is not None and not isinstance(prediction, str):
        raise TypeError(f"a prediction must be a string, got {type(prediction).__name__}")
    if prediction is not None and len(prediction) > MAX_PREDICTION_CHARS:
        message = f"prediction longer than {MAX_PREDICTION_CHARS} characters"
        return result(None, False, "error", message=message), None
    extracted, source = (
        extract_with_source(prediction, last_number=policy.last_number, truncated=truncated)
        if prediction
        else (None, None)
    )
    if gold is not None and prediction and source != "short":
        named = _named_in_prose(prediction, extracted, source, gold, truncated)
        if named is not None:
            return result(named, True, "ok", key=CORRECT_KEY), named
    if extracted is None:
        return result(None, False, "no_answer"), None
    if gold is None:
        return result(extracted, False, "error", message="no gold answer"), None
    if len(extracted) > MAX_ANSWER_CHARS:
        message = f"TooLarge: answer longer than {MAX_ANSWER_CHARS} characters"
        return result(extracted, False, "error", message=message), None
    pred_number = parse_number(extracted)
    if pred_number is not None:
        gold_number = parse_number(gold)
        if gold_number is not None:
            correct = numbers_equal(gold_number, pred_number, policy.tolerance)
            return result(extracted, correct, "ok", key=number_key(pred_number)), extracted
    if squash(extracted) == squash(gold):  # the gold itself, spaced or wrapped otherwise
        return result(extracted, True, "ok", key=CORRECT_KEY), extracted
    pred_letter = choice_letter(extracted)
    if pred_letter is not None:
        gold_letter = choice_letter(gold)
        if gold_letter is not None:
            key = "value:text:" + pred_letter
            return result(extracted, pred_letter == gold_letter, "ok", key=key), extracted
    return None, extracted


_GOLD_NAME = re.compile(r"[A-Za-z]{3,}")
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")
_DENIAL = re.compile(
    r"\b(?:not|no|never|neither|nor|than|but|rather|instead|except|unless)\b|n't\b",
    re.IGNORECASE,
)
_NAME_WORDS = re.compile(r"[^\W\d_]+")
NAME_SENTENCE_WORDS = 30  # a longer closing sentence is not read for a name


def _named_in_prose(prediction: str, extracted, source, gold: str, truncated) -> str | None:
    """A gold that is one word (``\\text{Evelyn}``, ``\\text{east}``) answered only in
    prose: the response's closing sentence (or a boxed sentence) names it and denies
    nothing. Returns the name as written, or None."""
    if len(gold) > 60 or ("\\" in gold and "\\text" not in gold):
        return None
    name = strip_text_wrappers(clean(gold)).strip()
    if _GOLD_NAME.fullmatch(name) is None or name.lower() in ("yes", "no"):
        return None
    if source == "stated":
        sentence = strip_text_wrappers(extracted or "")
        if len(prose_words(sentence)) < 2:
            return None  # a stated word or formula is compared as it is
    else:
        if truncated:
            return None
        text = final_text(prediction) or ""
        sentences = [t for t in _SENTENCES.split(text.strip()) if t.strip()]
        if not sentences:
            return None
        sentence = sentences[-1]
    words = _NAME_WORDS.findall(sentence)
    if len(words) > NAME_SENTENCE_WORDS or _DENIAL.search(sentence):
        return None
    for word in words:
        if word.lower() == name.lower():
            return word
    return None


def grade_extracted(extracted: str, gold: str, policy: Policy = DEFAULT_POLICY) -> dict:
    """Compare an extracted answer with the gold (sympy; run it under a time limit)."""
    from pt_eval.equivalence import answer_key, answers_match
    from pt_eval.parse import TooLarge

    cache_key = (gold, extracted, policy)
    hit = _cache.get(cache_key)
    if hit is None:
        try:
            hit = (answers_match(gold, extracted, policy), answer_key(extracted))
        except (TooLarge, RecursionError, OverflowError, MemoryError) as exc:
            return result(extracted, False, "error", message=f"{type(exc).__name__}: {exc}")
        _cache[cache_key] = hit
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    correct, key = hit
    return result(extracted, correct, "ok", key=key)


def grade_item(
    prediction, gold: str | None, policy: Policy = DEFAULT_POLICY, *, truncated: bool | None = None
) -> dict:
    """``{"extracted", "correct", "status", "key", "message"}`` for one response.

    status is ``ok`` (graded), ``no_answer`` (nothing to extract) or ``error`` (the answer
    asks for more work than allowed, e.g. a 10^7-digit number); the pool adds ``timeout``.
    """
    done, extracted = prepare(prediction, gold, policy, truncated=truncated)
    if done is not None:
        return done
    # prepare grades a missing answer or gold itself
    assert extracted is not None and gold is not None
    return grade_extracted(extracted, gold, policy)


def result(extracted, correct, status, *, key=None, message=None) -> dict:
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
        ("\\boxed{x > 2}", "(2, \\infty)"),
    ):
        grade_item(prediction, gold)
    _cache.clear()
