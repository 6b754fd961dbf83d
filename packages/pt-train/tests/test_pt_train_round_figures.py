"""A round's logged figures against hand counts, on rows of several groups that do not
come in group order: means over completions, `groups_all_equal` over groups (not rows)."""

from __future__ import annotations

import math

import pytest

from pt_train.producers.online import round_figures


def row(group, reward, correct, advantage, equal, length):
    return {
        "group": group,
        "reward": reward,
        "correct": correct,
        "advantage": advantage,
        "group_all_equal": equal,
        "completion_token_ids": list(range(length)),
    }


ROWS = [  # group a: rewards 1, 0, 1; b: 0, 0 (all equal); c: one row (0.8, a format reward)
    row("a", 1.0, True, 0.5, False, 2),
    row("b", 0.0, False, 0.0, True, 1),
    row("c", 0.8, True, 0.0, True, 3),
    row("a", 0.0, False, -1.0, False, 4),
    row("b", 0.0, False, 0.0, True, 1),
    row("a", 1.0, True, 0.5, False, 6),
]


def test_round_figures_match_hand_counts():
    figures = round_figures(ROWS)
    assert figures["completion_length"] == pytest.approx(17 / 6)  # (2+1+3+4+1+6) / 6
    assert figures["reward"] == pytest.approx(2.8 / 6)
    # deviations from 7/15: 8/15 twice, 7/15 three times, 1/3 once -> variance 2/9
    assert figures["reward_std"] == pytest.approx(math.sqrt(2) / 3)
    assert figures["accuracy"] == pytest.approx(3 / 6)  # correct, not reward > 0
    assert figures["advantage"] == pytest.approx(0.0)
    assert figures["advantage_abs"] == pytest.approx(2 / 6)
    # two of the three groups (b, c) are all equal; counted by rows it would be 3/6
    assert figures["groups_all_equal"] == pytest.approx(2 / 3)


def test_rows_without_grades_give_only_what_they_hold():
    rows = [{"completion_token_ids": [1, 2]}, {"completion_token_ids": [3]}]
    assert round_figures(rows) == {"completion_length": 1.5}
