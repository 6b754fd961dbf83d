"""Prediction files from elsewhere, read by flags alone, and inputs that must fail cleanly:
each bad input exits 2 with one line naming the file, row and problem, never a traceback."""

from __future__ import annotations

import csv
import json

import pytest

from pt_core.files import read_rows, write_rows


def _manifest(proc) -> dict:
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def _fails_cleanly(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout == "", "no manifest after a failure"
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


# --------------------------------------------------------------------------- foreign files


def _lm_eval_row(doc_id: int, answer: str, responses: list[str]) -> dict:
    """One line of an lm-evaluation-harness samples file (gsm8k-style task)."""
    return {
        "doc_id": doc_id,
        "doc": {"question": f"question {doc_id}", "answer": f"Work.\n#### {answer}"},
        "target": f"Work.\n#### {answer}",
        "arguments": [["question", {"until": ["Question:"]}]],
        "resps": [responses],
        "filtered_resps": [responses[0]],
        "doc_hash": "x",
    }


def test_lm_evaluation_harness_samples_with_repeats(cli, tmp_path):
    # resps holds one list of n responses per request: four samples of each problem
    rows = [
        _lm_eval_row(0, "18", ["so 18.\n#### 18", "The answer is 18.", "\\boxed{17}", "18 eggs."]),
        _lm_eval_row(1, "3", ["The answer is 3.", "\\boxed{3}", "#### 4", "It is 2."]),
    ]
    src = write_rows(tmp_path / "samples_gsm8k.jsonl", rows)
    m = _manifest(cli("pt-eval", "grade", src, "--pred-key", "resps", "--gold-key", "doc.answer",
                      "--workers", "1"))  # fmt: skip
    assert (m["problems"], m["samples"], m["n"]) == (2, 8, 4)
    # problem 0: 18, 18, 17, 18 -> 3 right; problem 1: 3, 3, 4, 2 -> 2 right
    assert m["correct"] == 5 and m["id_key"] == "doc_id"
    graded = read_rows(tmp_path / "samples_gsm8k.grades.jsonl")
    assert graded[0]["correct"] == [True, True, False, True]
    assert graded[0]["doc"]["answer"].endswith("#### 18")  # nested input kept as it was


def test_lm_evaluation_harness_defaults_take_filtered_resps_and_target(cli, tmp_path):
    rows = [_lm_eval_row(0, "18", ["#### 18"]), _lm_eval_row(1, "3", ["#### 5"])]
    src = write_rows(tmp_path / "samples.jsonl", rows)
    m = _manifest(cli("pt-eval", "grade", src, "--workers", "1"))
    # filtered_resps (a list of one) and target ("... #### 18") are the defaults
    assert (m["pred_key"], m["gold_key"]) == ("filtered_resps", "target")
    assert m["correct"] == 1 and m["samples"] == 2


def _harness_row(doc_id: int, answer: str, response: str, filter_name: str, filtered: str):
    """One line of an lm-evaluation-harness 0.4 samples file: one (document, filter) pair,
    as gsm8k writes it with its strict-match and flexible-extract filters."""
    prompt = f"Question: question {doc_id}\nAnswer:"
    return {
        "doc_id": doc_id,
        "doc": {"question": f"question {doc_id}", "answer": f"Work.\n#### {answer}"},
        "target": f"Work.\n#### {answer}",
        "arguments": {
            "gen_args_0": {
                "arg_0": prompt,
                "arg_1": {"until": ["Question:", "</s>", "<|im_end|>"], "do_sample": False},
            }
        },
        "resps": [[response]],
        "filtered_resps": [filtered],
        "filter": filter_name,
        "metrics": ["exact_match"],
        "doc_hash": f"d{doc_id}",
        "prompt_hash": f"p{doc_id}",
        "target_hash": f"t{doc_id}",
        "exact_match": float(filtered == answer),
    }


# (doc_id, gold, response, strict-match's answer, flexible-extract's answer): strict-match
# takes the number after "####" and writes [invalid] when there is none; flexible-extract
# takes the last number
HARNESS_DOCS = [
    (0, "18", "She sells 9 eggs for $2 each, so 18 dollars.", "[invalid]", "18"),
    (1, "3", "2 + 1 = 3 bolts.\n#### 3", "3", "3"),
    (2, "5", "I think it is 4.\n#### 4", "4", "4"),
    (3, "12", "12 cups, or 13 with the spare.", "[invalid]", "13"),
]


def _harness_file(tmp_path):
    rows = []
    for doc_id, gold, response, strict, flexible in HARNESS_DOCS:
        rows.append(_harness_row(doc_id, gold, response, "strict-match", strict))
        rows.append(_harness_row(doc_id, gold, response, "flexible-extract", flexible))
    return write_rows(tmp_path / "samples_gsm8k_2025-01-01T00-00-00.jsonl", rows)


def test_lm_evaluation_harness_filters_are_reported_apart(cli, tmp_path):
    src = _harness_file(tmp_path)
    m = _manifest(cli("pt-eval", "grade", src, "--workers", "1"))
    strict, flexible = m["filters"]["strict-match"], m["filters"]["flexible-extract"]
    # strict-match: doc 1 right, doc 2 wrong (4), docs 0 and 3 have no answer ([invalid])
    assert (strict["problems"], strict["samples"], strict["correct"]) == (4, 4, 1)
    assert strict["no_answer"] == 2 and strict["accuracy"] == 0.25
    # flexible-extract: 18 and 3 right, 4 and 13 wrong
    assert (flexible["problems"], flexible["samples"], flexible["correct"]) == (4, 4, 2)
    assert flexible["no_answer"] == 0 and flexible["accuracy"] == 0.5
    # a document's two filter rows are two problems, never two samples of one
    assert (m["problems"], m["samples"], m["n"]) == (8, 8, 1)
    graded = read_rows(tmp_path / "samples_gsm8k_2025-01-01T00-00-00.grades.jsonl")
    assert (graded[0]["extracted"], graded[0]["grade_status"]) == ([None], ["no_answer"])


def test_lm_evaluation_harness_filter_flag_grades_one_filter(cli, tmp_path):
    src = _harness_file(tmp_path)
    out = tmp_path / "strict.jsonl"
    m = _manifest(cli("pt-eval", "grade", src, "--filter", "strict-match", "-o", out))
    assert (m["filter"], m["problems"], m["samples"], m["correct"]) == ("strict-match", 4, 4, 1)
    assert list(m["filters"]) == ["strict-match"]
    assert {row["filter"] for row in read_rows(out)} == {"strict-match"}


def test_lm_evaluation_harness_raw_responses_of_one_filter(cli, tmp_path):
    # resps holds the model's text, the same in both filter rows: grading it once per
    # document needs --filter; 18 (its last number), 3 right; 4 wrong; doc 3 ends with a
    # sentence stating no answer, so its last number, 13, is taken and is wrong
    src = _harness_file(tmp_path)
    m = _manifest(cli("pt-eval", "grade", src, "--pred-key", "resps", "--gold-key",
                      "doc.answer", "--filter", "flexible-extract", "--workers", "1"))  # fmt: skip
    assert (m["problems"], m["samples"], m["correct"], m["no_answer"]) == (4, 4, 2, 0)


def test_lm_evaluation_harness_unknown_filter_names_the_ones_present(cli, tmp_path):
    src = _harness_file(tmp_path)
    proc = cli("pt-eval", "grade", src, "--filter", "strict", check=False)
    _fails_cleanly(proc, "no rows with filter 'strict'", "'strict-match', 'flexible-extract'")


def test_filter_flag_on_a_file_without_filters_is_refused(cli, tmp_path):
    src = write_rows(tmp_path / "preds.jsonl", [{"id": 1, "response": "5", "answer": "5"}])
    proc = cli("pt-eval", "grade", src, "--filter", "strict-match", check=False)
    _fails_cleanly(proc, "no 'filter' column")


def test_csv_in_and_out(cli, tmp_path):
    src = tmp_path / "preds.csv"
    with open(src, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "response", "answer"])
        writer.writerow(["a", "so $\\boxed{\\frac{1}{2}}$, done", "0.5"])
        writer.writerow(["b", "The answer is 1,234.", "1234"])
        writer.writerow(["c", "no idea", "7"])
    out = tmp_path / "grades.csv"
    m = _manifest(cli("pt-eval", "grade", src, "--out", out, "--workers", "1"))
    assert m["correct"] == 2 and m["no_answer"] == 1
    with open(out, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["correct"] for r in rows] == ["true", "true", "false"]
    assert rows[0]["extracted"] == "\\frac{1}{2}" and rows[2]["grade_status"] == "no_answer"
    assert rows[1]["response"] == "The answer is 1,234."  # the input row carried through


def test_a_list_of_predictions_per_row_is_n_samples(cli, tmp_path):
    rows = [{"id": 1, "prediction": ["\\boxed{2}", "\\boxed{3}", "\\boxed{2}"], "gold": "2"}]
    m = _manifest(cli("pt-eval", "grade", write_rows(tmp_path / "p.jsonl", rows), "--workers", "1"))
    assert (m["samples"], m["n"], m["correct"]) == (3, 3, 2)
    assert m["maj@n"] == 1.0  # 2 is given twice


def test_a_row_with_no_samples_keeps_pass_at_k(cli, tmp_path):
    rows = [
        {"id": 1, "completion": [], "answer": "1"},
        {"id": 2, "completion": ["\\boxed{2}", "\\boxed{5}"], "answer": "2"},
    ]
    m = _manifest(cli("pt-eval", "grade", write_rows(tmp_path / "p.jsonl", rows), "--workers", "1"))
    # the empty problem counts as failed; n comes from the problems that have samples
    assert m["n"] == 2 and m["no_samples"] == 1
    assert m["pass@k"] == pytest.approx({"1": (0 + 0.5) / 2, "2": (0 + 1.0) / 2})
    assert m["maj@n"] == 0.5  # problem 2's tie goes to the answer given first, 2, which is right
    graded = read_rows(tmp_path / "p.grades.jsonl")
    assert graded[0]["correct"] == [] and graded[1]["correct"] == [True, False]


@pytest.mark.parametrize(
    ("cell", "what"),
    [(42, "int"), ({"text": "x"}, "dict"), ([["a", 3]], "int"), (3.5, "float")],
)
def test_a_prediction_that_is_not_text_is_an_input_error(cli, tmp_path, cell, what):
    rows = [{"id": 1, "completion": "\\boxed{1}", "answer": "1"},
            {"id": 2, "completion": cell, "answer": "1"}]  # fmt: skip
    proc = cli("pt-eval", "grade", write_rows(tmp_path / "p.jsonl", rows), check=False)
    # never str(value) graded as text: the row and the type are named
    _fails_cleanly(proc, "row 2", what)


def test_a_gold_that_is_an_object_is_an_input_error(cli, tmp_path):
    rows = [{"id": 1, "completion": "\\boxed{1}", "answer": {"value": 1}}]
    proc = cli("pt-eval", "grade", write_rows(tmp_path / "p.jsonl", rows), check=False)
    _fails_cleanly(proc, "row 1", "gold answer is a dict", "--gold-key")


# --------------------------------------------------------------------------- bad bytes


def test_bytes_that_are_not_utf8_name_the_line(cli, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_bytes(
        b'{"completion": "\\\\boxed{1}", "answer": "1"}\n'
        b'{"completion": "caf\xe9 \\\\boxed{2}", "answer": "2"}\n'
    )
    proc = cli("pt-eval", "grade", src, check=False)
    _fails_cleanly(proc, "p.jsonl:2", "0xe9", "UTF-8")


def test_a_lone_surrogate_names_the_line(cli, tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_text(
        '{"completion": "\\\\boxed{1}", "answer": "1"}\n'
        '{"completion": "\\ud83d\\ude00 fine", "answer": "2"}\n'  # a valid pair: an emoji
        '{"completion": "bad \\ud800 here", "answer": "3"}\n',
        encoding="utf-8",
    )
    proc = cli("pt-eval", "grade", src, check=False)
    _fails_cleanly(proc, "p.jsonl:3", "surrogate")


def test_bad_bytes_in_a_json_array_and_a_csv(cli, tmp_path):
    array = tmp_path / "p.json"
    array.write_bytes(
        b'[\n{"completion": "1", "answer": "1"},\n{"completion": "\xff", "answer": "1"}\n]'
    )
    _fails_cleanly(cli("pt-eval", "grade", array, check=False), "p.json:3", "UTF-8")
    table = tmp_path / "p.csv"
    table.write_bytes(b"completion,answer\n1,1\n\xfe,2\n")
    _fails_cleanly(cli("pt-eval", "grade", table, check=False), "p.csv:3", "UTF-8")


# --------------------------------------------------------------------------- manifests and outputs


@pytest.mark.parametrize("path", [5, None, ["a.jsonl"], ""])
def test_a_manifest_whose_path_is_not_a_string(cli, path):
    upstream = json.dumps({"kind": "rollouts", "path": path}) + "\n"
    proc = cli("pt-eval", "grade", "-", input=upstream, check=False)
    _fails_cleanly(proc, "manifest", "'path'")


def test_an_unwritable_out_is_refused_before_reading_or_grading(cli, tmp_path):
    # the input is broken at line 2: the error that comes back is about --out, so --out was
    # checked first
    src = tmp_path / "p.jsonl"
    src.write_text('{"completion": "\\\\boxed{1}", "answer": "1"}\n{not json\n')
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = cli("pt-eval", "grade", src, "--out", blocker / "grades.jsonl", check=False)
    _fails_cleanly(proc, "cannot write the grades file", "--out")
    proc = cli("pt-eval", "grade", src, "--out", tmp_path / "grades.txt", check=False)
    _fails_cleanly(proc, "grades.txt", ".jsonl, .parquet or .csv")
    proc = cli("pt-eval", "grade", src, "--out", tmp_path, check=False)
    _fails_cleanly(proc, "is a directory")
    assert not (tmp_path / "p.grades.jsonl").exists()
    # and with a good --out the broken line is what fails
    proc = cli("pt-eval", "grade", src, "--out", tmp_path / "g.jsonl", check=False)
    _fails_cleanly(proc, "p.jsonl:2", "malformed JSON")


@pytest.mark.parametrize(
    ("content", "needle"),
    [("", "no rows"), ("[]", "no rows"), ('{"a": 1}\n', "no prediction column"),
     ("[1, 2]", "element 0")],
)  # fmt: skip
def test_empty_and_malformed_files(cli, tmp_path, content, needle):
    src = tmp_path / ("p.json" if content.startswith("[") else "p.jsonl")
    src.write_text(content)
    _fails_cleanly(cli("pt-eval", "grade", src, check=False), needle)


def test_usage_errors_are_one_line(cli, tmp_path):
    proc = cli("pt-eval", "grade", tmp_path / "missing.jsonl", check=False)
    _fails_cleanly(proc, "no such file")
    proc = cli("pt-eval", "grade", "x.jsonl", "--workrs", "2", check=False)
    _fails_cleanly(proc, "No such option: --workrs", "pt-eval grade --help")
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = cli("pt-eval", "grade", "x.jsonl", "--timeout", "soon", check=False)
    _fails_cleanly(proc, "Invalid value for '--timeout'")
    proc = cli("pt-eval", "grade", "x.jsonl", "--numeric-tolerance", "2", check=False)
    _fails_cleanly(proc, "--numeric-tolerance")


def test_grade_rows_draws_its_bar_unless_told_not_to(monkeypatch):
    """A caller that grades a small batch at every step of its own (GRPO's rewards) turns
    the per-call bar off; a plain call keeps it."""
    import io

    from rich.console import Console

    from pt_core import log
    from pt_eval.grade import GradeOptions, grade_rows

    rows = [{"id": 0, "completion": "\\boxed{4}", "answer": "4"}]
    options = GradeOptions(pred_key="completion", gold_key="answer", id_key="id", workers=1)
    for show, drawn in ((True, True), (False, False)):
        out = io.StringIO()
        monkeypatch.setattr(log, "console", Console(file=out, force_terminal=True, width=80))
        graded, _ = grade_rows(rows, options, show_progress=show)
        assert graded[0]["correct"] is True
        assert ("grading" in out.getvalue()) is drawn
