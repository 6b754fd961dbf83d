"""pass@k with the unbiased estimator, and majority voting."""

from __future__ import annotations

from math import comb

import pytest

from pt_eval.metrics import Problem, ks_for, majority_correct, pass_at_k, summarize


def test_pass_at_k_is_the_unbiased_estimator():
    # n = 8 samples, c = 2 correct: P(no correct in k draws) = C(6, k) / C(8, k)
    assert pass_at_k(8, 2, 1) == pytest.approx(2 / 8)
    assert pass_at_k(8, 2, 2) == pytest.approx(1 - comb(6, 2) / comb(8, 2))  # 1 - 15/28
    assert pass_at_k(8, 2, 4) == pytest.approx(1 - 15 / 70)
    assert pass_at_k(8, 2, 8) == 1.0
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0


def test_pass_at_k_needs_enough_samples():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 4)


def test_ks_are_powers_of_two_up_to_n_and_n_itself():
    assert ks_for(8) == [1, 2, 4, 8]
    assert ks_for(5) == [1, 2, 4, 5]
    assert ks_for(1) == [1]


def test_majority_vote_groups_equal_answers_and_breaks_ties_by_first_seen():
    # 1/2 twice (as two spellings, one key) beats 3 once
    p = Problem("a", correct=[True, False, True], keys=["half", "three", "half"])
    assert majority_correct(p)
    tie = Problem("b", correct=[False, True], keys=["wrong", "right"])
    assert not majority_correct(tie)  # a tie goes to the answer given first
    nothing = Problem("c", correct=[False, False], keys=[None, None])
    assert not majority_correct(nothing)  # no graded answer, no vote


def test_summary_counts():
    problems = [
        Problem(1, correct=[True, True], keys=["x", "x"], statuses=["ok", "ok"]),
        Problem(2, correct=[False, False], keys=[None, None], statuses=["timeout", "no_answer"]),
    ]
    s = summarize(problems)
    assert s["accuracy"] == 0.5 and s["pass@k"] == {"1": 0.5, "2": 0.5}
    assert s["maj@n"] == 0.5 and s["n"] == 2
    assert (s["timeouts"], s["no_answer"], s["errors"]) == (1, 1, 0)


def test_prediction_cells():
    from pt_eval.grade import prediction_samples

    assert prediction_samples("\\boxed{1}") == (["\\boxed{1}"], False)
    assert prediction_samples(["a", "b"]) == (["a", "b"], True)  # k samples of one problem
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "\\boxed{2}"}]
    assert prediction_samples(chat) == (["\\boxed{2}"], False)  # a conversation: its last turn
    assert prediction_samples({"role": "assistant", "content": "x"}) == (["x"], False)
