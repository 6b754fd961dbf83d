"""`pt-eval grade` as a user runs it: any row file in, a grades file and one manifest out."""

from __future__ import annotations

import json

import pytest

from pt_core.files import read_rows, write_rows

ROWS = [
    # one problem with three samples in a list: two spellings of 1/2 and a wrong 3
    {"id": "p1", "completion": ["so \\boxed{1/2}", "\\boxed{0.5}", "\\boxed{3}"],
     "answer": "\\frac12", "level": 1},
    # another problem whose two samples are two rows with the same id
    {"id": "p2", "completion": "The answer is 4.", "answer": 4, "level": 2},
    {"id": "p2", "completion": "no idea", "answer": 4, "level": 2},
]  # fmt: skip


def _manifest(proc) -> dict:
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # stdout carries exactly the manifest
    return json.loads(lines[0])


def test_grade_jsonl_with_lists_repeated_ids_and_groups(cli, tmp_path):
    src = write_rows(tmp_path / "preds.jsonl", ROWS)
    out = tmp_path / "grades.jsonl"
    m = _manifest(
        cli("pt-eval", "grade", src, "--out", out, "--group-key", "level", "--workers", "1")
    )
    assert m["kind"] == "grades" and m["path"] == str(out)
    assert (m["problems"], m["samples"], m["n"]) == (2, 5, 2)
    assert m["accuracy"] == pytest.approx(3 / 5)
    # p1: 2 of 3 right, p2: 1 of 2 right -> pass@1 = (2/3 + 1/2) / 2; any 2 draws hit one
    assert m["pass@k"] == pytest.approx({"1": 7 / 12, "2": 1.0})
    assert m["maj@n"] == 1.0  # 1/2 wins p1's vote (two spellings, one answer); 4 wins p2's
    assert m["no_answer"] == 1 and m["timeouts"] == 0
    assert m["groups"]["level"]["1"]["accuracy"] == pytest.approx(2 / 3)
    assert m["groups"]["level"]["2"]["accuracy"] == pytest.approx(1 / 2)
    graded = read_rows(out)
    assert graded[0]["correct"] == [True, True, False]
    assert graded[0]["extracted"] == ["1/2", "0.5", "3"]
    assert graded[0]["grade_status"] == ["ok", "ok", "ok"]
    assert (graded[1]["extracted"], graded[1]["correct"], graded[1]["grade_status"]) == (
        "4",
        True,
        "ok",
    )
    assert graded[2]["grade_status"] == "no_answer"
    assert graded[0]["level"] == 1  # the input row is carried through


def test_group_key_counts_an_id_in_every_group_its_rows_sit_in(cli, tmp_path):
    # the same two problems answered under two prompts: right under A, wrong under B
    rows = [
        {"id": 1, "completion": "The answer is 5.", "answer": "5", "prompt": "A"},
        {"id": 1, "completion": "The answer is 6.", "answer": "5", "prompt": "B"},
        {"id": 2, "completion": "The answer is 7.", "answer": "7", "prompt": "A"},
        {"id": 2, "completion": "The answer is 8.", "answer": "7", "prompt": "B"},
    ]
    src = write_rows(tmp_path / "preds.jsonl", rows)
    m = _manifest(cli("pt-eval", "grade", src, "--group-key", "prompt", "--workers", "1"))
    by_prompt = m["groups"]["prompt"]
    assert (by_prompt["A"]["problems"], by_prompt["A"]["accuracy"]) == (2, 1.0)
    assert (by_prompt["B"]["problems"], by_prompt["B"]["accuracy"]) == (2, 0.0)
    # over all rows an id is still one problem with two samples, one of them right
    assert (m["problems"], m["samples"], m["pass@k"]["1"]) == (2, 4, 0.5)


def test_group_key_pools_samples_per_id_within_each_group():
    from pt_eval.grade import GradeOptions, grade_rows

    rows = [
        {"id": 1, "completion": ["1", "1"], "answer": "1", "g": "A"},  # A: 2 of 2
        {"id": 1, "completion": ["2", "1"], "answer": "1", "g": "B"},  # B: 1 of 2, 2 first
        {"id": 2, "completion": ["3", "5"], "answer": "3", "g": "A"},  # A: 1 of 2, 3 first
        {"id": 2, "completion": ["5", "5"], "answer": "3", "g": "B"},  # B: 0 of 2
        {"id": 3, "completion": ["7", "7"], "answer": "7", "g": "B"},  # B: 2 of 2
    ]
    _, summary = grade_rows(rows, GradeOptions(group_keys=["g"]), show_progress=False)
    a, b = summary["groups"]["g"]["A"], summary["groups"]["g"]["B"]
    assert (a["problems"], a["samples"], a["correct"]) == (2, 4, 3)
    # A: pass@1 = (1 + 1/2) / 2; both problems have a right answer in 2 draws; each vote is
    # won by a right answer (id 2's tie goes to 3, given first)
    assert a["pass@k"] == pytest.approx({"1": 0.75, "2": 1.0}) and a["maj@n"] == 1.0
    assert (b["problems"], b["samples"], b["correct"]) == (3, 6, 3)
    # B: pass@1 = (1/2 + 0 + 1) / 3, pass@2 = (1 + 0 + 1) / 3; only id 3 wins its vote
    # (id 1's tie goes to the wrong 2, given first)
    assert b["pass@k"] == pytest.approx({"1": 0.5, "2": 2 / 3})
    assert b["maj@n"] == pytest.approx(1 / 3)
    # overall an id pools its rows of both groups: 3 of 4, 1 of 4 and 2 of 2 right;
    # pass@2 = (1 + (1 - C(3,2)/C(4,2)) + 1) / 3
    assert (summary["problems"], summary["samples"], summary["correct"]) == (3, 10, 6)
    assert summary["pass@k"] == pytest.approx({"1": 2 / 3, "2": 2.5 / 3})


def test_grade_reads_a_manifest_from_stdin_and_parquet(cli, tmp_path):
    rows = [{"id": i, "prediction": f"\\boxed{{{i}}}", "gold": str(i % 2)} for i in range(4)]
    src = write_rows(tmp_path / "preds.parquet", rows)
    upstream = json.dumps({"kind": "rollouts", "path": str(src)}) + "\n"
    m = _manifest(cli("pt-eval", "grade", "-", "--workers", "1", input=upstream))
    assert m["path"] == str(tmp_path / "preds.grades.jsonl")  # beside the input by default
    assert m["correct"] == 2 and m["pred_key"] == "prediction" and m["gold_key"] == "gold"


def test_grade_json_array_with_custom_keys(cli, tmp_path):
    src = tmp_path / "preds.json"
    src.write_text(json.dumps([{"q": 1, "out": "\\boxed{x+1}", "truth": "1+x"}]))
    out = tmp_path / "g.parquet"
    m = _manifest(cli("pt-eval", "grade", src, "--pred-key", "out", "--gold-key", "truth",
                      "--id-key", "q", "--out", out, "--workers", "1"))  # fmt: skip
    assert m["accuracy"] == 1.0
    assert read_rows(out)[0]["correct"] is True


def test_a_missing_column_is_a_clear_error(cli, tmp_path):
    src = write_rows(tmp_path / "preds.jsonl", [{"text": "\\boxed{1}", "answer": "1"}])
    proc = cli("pt-eval", "grade", src, check=False)
    assert proc.returncode == 2
    assert "no prediction column" in proc.stderr and "--pred-key" in proc.stderr
    proc = cli("pt-eval", "grade", src, "--pred-key", "txt", check=False)
    assert proc.returncode == 2 and "'txt'" in proc.stderr


def test_grade_the_shared_prediction_file(cli, tmp_path):
    from pt_eval.benchmarks import shared_dir

    try:
        src = shared_dir() / "predictions" / "math_cot_100.jsonl"
    except Exception as exc:
        pytest.skip(f"no shared data: {exc}")
    out = tmp_path / "g.jsonl"
    # gt is the gold the file's score was computed against (answer is the unmangled original)
    m = _manifest(
        cli("pt-eval", "grade", src, "--out", out, "--gold-key", "gt", "--group-key", "level")
    )
    graded = read_rows(out)
    assert len(graded) == 100 and all(len(r["correct"]) == 8 for r in graded)
    assert m["samples"] == 800 and m["timeouts"] == 0 and m["errors"] == 0
    correct = [c for r in graded for c in r["correct"]]
    assert m["accuracy"] == pytest.approx(sum(correct) / 800)
    # the file's own grader is not ground truth, but the two must rarely disagree
    scores = [s for r in graded for s in r["score"]]
    assert sum(a != b for a, b in zip(correct, scores, strict=True)) <= 2
