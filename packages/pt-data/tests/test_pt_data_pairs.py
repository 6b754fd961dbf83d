"""`pt-data pairs`: on-policy preference pairs from graded rollouts, by strategy, seeded."""

from __future__ import annotations

import json
import random

import pytest

from pt_core.errors import InputError
from pt_core.files import read_rows, split_path
from pt_data.pairs import PairOptions, make_pairs, write_pairs


def sample(prompt_id, n, correct, status="ok", reward=0.0, tokens=None):
    """One graded rollout row, as pt-rollout generate | pt-eval grade writes it."""
    return {
        "id": prompt_id,
        "sample": n,
        "prompt": [{"role": "user", "content": f"Question {prompt_id}"}],
        "completion": f"answer {n} to {prompt_id}",
        "prompt_token_ids": [0, 7, len(prompt_id)],
        "completion_token_ids": tokens if tokens is not None else [100 + n, 3],
        "finish_reason": "stop",
        "answer": "1",
        "extracted": "1" if correct else "2",
        "correct": correct,
        "grade_status": status,
        "reward": reward,
    }


# a: samples 0 and 3 correct, 1 and 2 wrong        -> 2 x 2 = 4 combinations
# b: both correct                                   -> no pair (only_correct)
# c: 0 no_answer (wrong), 1 correct, 2 timed out    -> 1 combination; the timeout left out
# d: only an error                                  -> no graded sample (all_excluded)
# e: both wrong                                     -> no pair (only_incorrect)
GRADES = [
    sample("a", 0, True, reward=0.0),
    sample("a", 1, False, reward=1.0),
    sample("a", 2, False, reward=2.0),
    sample("a", 3, True, reward=3.0),
    sample("b", 0, True),
    sample("b", 1, True),
    sample("c", 0, False, "no_answer"),
    sample("c", 1, True),
    sample("c", 2, False, "timeout"),
    sample("d", 0, False, "error"),
    sample("e", 0, False),
    sample("e", 1, False),
]
NO_PAIR = {"all_excluded": 1, "only_correct": 1, "only_incorrect": 1}


def triples(pairs):
    return [(p["id"], p["chosen_sample"], p["rejected_sample"]) for p in pairs]


def test_all_pairs_every_correct_sample_with_every_incorrect_one():
    pairs, counts = make_pairs(GRADES, PairOptions(strategy="all"))
    assert triples(pairs) == [
        ("a", 0, 1),
        ("a", 0, 2),
        ("a", 3, 1),
        ("a", 3, 2),
        ("c", 1, 0),  # a no_answer sample is an incorrect one
    ]
    assert counts == {
        "samples": 12,
        "prompts": 5,
        "pairs": 5,
        "prompts_without_pair": NO_PAIR,
        "excluded": {"error": 1, "timeout": 1},
        "dropped": {},
    }


def test_a_pair_carries_the_rollouts_own_tokens_all_trained_and_its_texts():
    pairs, _ = make_pairs(GRADES, PairOptions(strategy="all"))
    pair = pairs[0]  # a: sample 0 over sample 1
    chosen, rejected = GRADES[0], GRADES[1]
    assert pair["prompt_input_ids"] == chosen["prompt_token_ids"]
    assert pair["chosen_input_ids"] == pair["chosen_labels"] == chosen["completion_token_ids"]
    assert pair["rejected_input_ids"] == pair["rejected_labels"] == rejected["completion_token_ids"]
    assert (pair["prompt"], pair["chosen"], pair["rejected"]) == (
        chosen["prompt"],
        chosen["completion"],
        rejected["completion"],
    )
    assert "margin" not in pair  # no score column named: no margin known


def test_one_pair_per_prompt_seeded_and_independent_of_row_order():
    options = PairOptions(strategy="one", seed=3)
    pairs, counts = make_pairs(GRADES, options)
    assert [p["id"] for p in pairs] == ["a", "c"] and counts["prompts_without_pair"] == NO_PAIR
    correct = {(s["id"], s["sample"]) for s in GRADES if s["correct"]}
    for p in pairs:
        assert (p["id"], p["chosen_sample"]) in correct
        assert (p["id"], p["rejected_sample"]) not in correct
    shuffled = GRADES[:]
    random.Random(0).shuffle(shuffled)
    again, _ = make_pairs(shuffled, options)
    assert sorted(triples(again)) == sorted(triples(pairs))  # same seed, same choice
    # The choice is drawn, not fixed: over seeds, every combination of prompt a turns up.
    seen = {triples(make_pairs(GRADES, PairOptions(seed=s))[0])[0] for s in range(40)}
    assert seen == {("a", 0, 1), ("a", 0, 2), ("a", 3, 1), ("a", 3, 2)}


def test_at_most_k_pairs_per_prompt_a_seeded_subset():
    all_pairs = set(triples(make_pairs(GRADES, PairOptions(strategy="all"))[0]))
    pairs, _ = make_pairs(GRADES, PairOptions(strategy="all", k=2, seed=1))
    by_prompt = [t[0] for t in triples(pairs)]
    assert by_prompt.count("a") == 2 and by_prompt.count("c") == 1
    assert set(triples(pairs)) <= all_pairs
    assert triples(make_pairs(GRADES, PairOptions(strategy="all", k=2, seed=1))[0]) == triples(
        pairs
    )


def test_margin_pairs_by_a_score_column():
    # prompt a's rewards are 0, 1, 2, 3 (samples 0..3); a margin of 2 pairs 2>0, 3>0, 3>1.
    options = PairOptions(strategy="margin", score_key="reward", margin=2)
    pairs, counts = make_pairs(GRADES, options)
    assert triples(pairs) == [("a", 2, 0), ("a", 3, 0), ("a", 3, 1)]
    assert [p["margin"] for p in pairs] == [2.0, 3.0, 2.0]
    # b, c and e have all rewards equal (0): no positive difference
    assert counts["prompts_without_pair"] == {"all_excluded": 1, "no_margin": 3}


def test_identical_and_empty_completions_are_dropped_and_counted():
    rows = [
        sample("x", 0, True, tokens=[5, 3]),
        sample("x", 1, False, tokens=[5, 3]),  # same tokens as the correct one
        sample("x", 2, False, tokens=[]),  # nothing sampled
        sample("x", 3, False, tokens=[6, 3]),
    ]
    pairs, counts = make_pairs(rows, PairOptions(strategy="all"))
    assert triples(pairs) == [("x", 0, 3)]
    assert counts["dropped"] == {"empty_completion": 1, "identical": 1}


@pytest.mark.parametrize(
    ("rows", "options", "message"),
    [
        ([], PairOptions(), "no rows"),
        (
            [{k: v for k, v in sample("a", 0, True).items() if k != "correct"}],
            PairOptions(),
            "missing column\\(s\\) 'correct'",
        ),
        ([{**sample("a", 0, True), "correct": [True, False]}], PairOptions(), "holds a list"),
        (
            [{**sample("a", 0, True), "reward": "high"}],
            PairOptions("margin", score_key="reward"),
            "'reward' is 'high'",
        ),
        (
            [sample("a", 0, True), {**sample("a", 1, False), "prompt_token_ids": [9]}],
            PairOptions(),
            "different prompt_token_ids",
        ),
        (GRADES, PairOptions(strategy="best"), "strategies are one, all, margin"),
    ],
)
def test_bad_input_is_one_error(rows, options, message):
    with pytest.raises(InputError, match=message):
        make_pairs(rows, options, source="grades.jsonl")


def test_write_pairs_makes_a_dataset_directory_and_nothing_on_failure(tmp_path):
    grades = tmp_path / "run.grades.jsonl"
    grades.write_text("".join(json.dumps(r) + "\n" for r in GRADES))
    fields = write_pairs(grades, None, PairOptions(strategy="all"))
    out = tmp_path / "run.grades.pairs"
    assert fields["path"] == str(out) and fields["rows"] == fields["pairs"] == 5
    assert fields["format"] == "preferences" and fields["tokenized"] is True
    info = json.loads((out / "dataset.json").read_text())
    assert info["pairs"] == 5 and info["excluded"] == {"error": 1, "timeout": 1}
    assert info["tokenizer"] is None  # the ids are the rollouts' own
    rows = read_rows(split_path(out, "train"))
    assert triples(rows) == triples(make_pairs(GRADES, PairOptions(strategy="all"))[0])

    only_wrong = tmp_path / "wrong.jsonl"
    only_wrong.write_text(json.dumps(sample("e", 0, False)) + "\n")
    with pytest.raises(InputError, match="no pairs"):
        write_pairs(only_wrong, tmp_path / "none", PairOptions())
    assert not (tmp_path / "none").exists()


@pytest.mark.slow
def test_the_pipe_reads_a_grades_manifest_from_stdin(tmp_path, cli):
    grades = tmp_path / "grades.jsonl"
    grades.write_text("".join(json.dumps(r) + "\n" for r in GRADES))
    upstream = json.dumps({"kind": "grades", "path": str(grades), "accuracy": 0.4})
    proc = cli("pt-data", "pairs", "-", "--strategy", "all", "-o", tmp_path / "p", input=upstream)
    (line,) = proc.stdout.strip().splitlines()  # exactly one manifest line on stdout
    manifest = json.loads(line)
    assert manifest["kind"] == "dataset" and manifest["format"] == "preferences"
    assert manifest["path"] == str(tmp_path / "p") and manifest["rows"] == 5
    assert manifest["excluded"] == {"error": 1, "timeout": 1}
    rows = read_rows(split_path(tmp_path / "p", "train"))
    assert triples(rows)[0] == ("a", 0, 1)
    # and the next stage reads it: inspect shows the pair from its text columns
    shown = cli("pt-data", "inspect", "-", "-n", "1", input=line + "\n")
    assert "answer 0 to a" in shown.stderr and "answer 1 to a" in shown.stderr
    assert "chosen: 2 tokens, 2 trained" in shown.stderr
