"""pt-data as a user runs it: synth -> build -> inspect / stats, and the error paths."""

from __future__ import annotations

import json

import pytest

from pt_core.files import read_rows, split_path


def manifest_of(proc) -> dict:
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout  # stdout carries exactly the one manifest line
    return json.loads(lines[0])


@pytest.mark.slow
def test_quickstart_synth_build_inspect_stats(tmp_path, cli, tiny_tokenizer_dir):
    proc = cli("pt-data", "synth", "arithmetic", "--n", "300", "--out", tmp_path / "arith")
    assert manifest_of(proc)["splits"] == {"train": 300, "test": 50}
    train = read_rows(tmp_path / "arith" / "train.jsonl")
    test = read_rows(tmp_path / "arith" / "test.jsonl")
    assert not {r["problem"] for r in train} & {r["problem"] for r in test}
    assert all(r["solution"].endswith(f"\\boxed{{{r['answer']}}}.") for r in train)

    cfg = tmp_path / "data.yaml"
    cfg.write_text(
        "data:\n"
        "  datasets:\n"
        f"    - source: {tmp_path / 'arith' / 'train.jsonl'}\n"
        "      transform: math\n"
        f"  output_dir: {tmp_path / 'sft'}\n"
        "  tokenizer:\n"
        f"    name_or_path: {tiny_tokenizer_dir}\n"
        "    max_seq_length: 256\n"
    )
    m = manifest_of(cli("pt-data", "build", cfg, "data.seed=1", "data.validation_split=0.1"))
    assert m["kind"] == "dataset" and m["format"] == "tokenized"
    assert set(m["splits"]) == {"train", "validation"} and m["tokens"] > 0
    assert 0.9 < m["packing_efficiency"] <= 1.0
    info = json.loads((tmp_path / "sft" / "dataset.json").read_text())
    assert info["config_hash"] == m["config_hash"] and info["config"]["seed"] == 1

    # inspect reads the manifest from a pipe, like the next stage would
    proc = cli("pt-data", "inspect", "-", "-n", "1", input=json.dumps(m) + "\n")
    assert "trained (highlighted)" in proc.stderr and "BOS x" in proc.stderr

    png = tmp_path / "lengths.png"
    stats = json.loads(cli("pt-data", "stats", tmp_path / "sft", "--plot", png).stdout)
    assert stats["overall"]["tokens"] == info["counts"]["train"]["tokens"]
    assert stats["overall"]["sequences"] == info["counts"]["train"]["sequences"]
    assert png.read_bytes()[:4] == b"\x89PNG"

    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(
        "data:\n  datasets:\n"
        f"    - source: {tmp_path / 'arith' / 'test.jsonl'}\n      transform: math_prompts\n"
        f"  output_dir: {tmp_path / 'prompts'}\n  shuffle: false\n"
    )
    m = manifest_of(cli("pt-data", "build", prompts))
    rows = read_rows(split_path(m["path"], "train"))
    assert m["format"] == "prompts" and [r["answer"] for r in rows] == [r["answer"] for r in test]


def _config(tmp_path, source, transform="alpaca"):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"data:\n  datasets:\n    - source: {source}\n      transform: {transform}\n"
        f"  output_dir: {tmp_path / 'out'}\n"
    )
    return cfg


@pytest.mark.parametrize(
    ("content", "transform", "message"),
    [
        ('{"instruction": "a", "output": "b"}\n{oops\n', "alpaca", "bad.jsonl:2: malformed JSON"),
        ('{"question": "a", "reply": "b"}\n', "alpaca", "the rows have: 'question', 'reply'"),
        ('{"instruction": "a", "output": "b"}\n', "alpacca", "known transforms: alpaca,"),
    ],
)
def test_bad_input_is_one_clear_error_with_exit_2_and_no_output(
    tmp_path, cli, content, transform, message
):
    src = tmp_path / "bad.jsonl"
    src.write_text(content)
    proc = cli("pt-data", "build", _config(tmp_path, src, transform), check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "c.yaml"]


def test_skip_bad_counts_the_skipped_lines_in_the_manifest(tmp_path, cli):
    src = tmp_path / "bad.jsonl"
    src.write_text(
        '{"instruction": "a", "output": "b"}\n{oops\n{"instruction": "c", "output": "d"}\n'
    )
    m = manifest_of(cli("pt-data", "build", _config(tmp_path, src), "--skip-bad"))
    assert m["rows"] == 2 and m["bad_lines"] == 1


# Every verb, given what users get wrong: exit code 2, the message that names the problem,
# no traceback, nothing on stdout.
BAD_LINE = '{"instruction": "a", "output": "b"}\n{oops\n'


def _error_cases(tmp_path):
    (tmp_path / "bad.jsonl").write_text(BAD_LINE)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "broken.yaml").write_text("data: [\n")
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "a_file").write_text("")
    cfg = _config(tmp_path, tmp_path / "bad.jsonl")
    ok_cfg = tmp_path / "ok.yaml"
    ok_cfg.write_text(
        f"data:\n  datasets:\n    - source: {tmp_path / 'rows.jsonl'}\n      transform: prompts\n"
        "      columns: {a: prompt}\n"
    )
    dataset = json.dumps({"kind": "dataset", "path": str(tmp_path / "rows.jsonl")})
    return [
        (["build", "missing.yaml"], None, "missing.yaml: config file not found"),
        (["build", tmp_path], None, "is a directory; expected a YAML file"),
        (["build", cfg, "--bogus"], None, "No such option: --bogus"),
        (["build", cfg, "--skip-bad", "true"], None, "'true' is not an override"),
        (["build", tmp_path / "empty.yaml"], None, "no 'data:' section"),
        (["build", tmp_path / "broken.yaml"], None, "broken.yaml:2: invalid YAML"),
        (["build", cfg, "data.seed=abc"], None, "expected int"),
        (["build", ok_cfg, "-o", tmp_path / "a_file" / "out"], None, "a_file"),
        (["inspect", "missing"], None, "missing: no such file or directory"),
        (["inspect", tmp_path / "empty.jsonl"], None, "no rows to show"),
        (["inspect", cfg, "--stage", "raw"], None, "pass --skip-bad"),
        (["inspect", cfg, "-n", "0"], None, "Invalid value for '-n'"),
        (["inspect", tmp_path / "rows.jsonl", "seed=1"], None, "apply to a config"),
        (["inspect", "-"], "", "no manifest on stdin"),
        (["stats", tmp_path / "empty.jsonl"], None, "no rows"),
        (["stats", tmp_path / "rows.jsonl"], None, "not a tokenized dataset"),
        (["stats", cfg, "--limit", "0"], None, "Invalid value for '--limit'"),
        (["stats", cfg, "--plot"], None, "requires an argument"),
        (["synth", "arithmetic", "--n", "abc", "--out", tmp_path / "s"], None, "'--n'"),
        (["synth", "algebra", "--n", "5", "--out", tmp_path / "s"], None, "unknown generator"),
        (
            ["synth", "arithmetic", "--n", "5", "--digits", "7", "--out", tmp_path / "s"],
            None,
            "--digits 7: arithmetic works columns 1 to 6",
        ),
        (
            ["synth", "multiplication", "--n", "5", "--ops", "+", "--out", tmp_path / "s"],
            None,
            "--ops is read by arithmetic",
        ),
        (
            ["synth", "calculator", "--n", "5", "--digits", "0", "--out", tmp_path / "s"],
            None,
            "--digits 0: a factor has at least one digit",
        ),
        (
            ["synth", "multiplication", "--n", "50", "--digits", "1", "--out", tmp_path / "s"],
            None,
            "there are 45 distinct 1-digit multiplication problems",
        ),
        (["tokenizer", "-t", tmp_path / "empty.jsonl", "-o", tmp_path / "t"], None, "no text"),
        (["tokenizer", "-t", "missing.jsonl", "-o", tmp_path / "t"], None, "no such file"),
        (["pairs", "missing.jsonl"], None, "missing.jsonl: no such file or directory"),
        (["pairs", tmp_path / "empty.jsonl"], None, "empty.jsonl: no rows"),
        (["pairs", tmp_path / "rows.jsonl"], None, "missing column(s) 'id', 'sample'"),
        (["pairs", tmp_path / "bad.jsonl"], None, "pass --skip-bad"),
        (["pairs", "-"], "", "no manifest on stdin"),
        (["pairs", "-"], dataset, "upstream manifest is of kind 'dataset'"),
        (["pairs", tmp_path / "rows.jsonl", "--strategy", "all", "--k", "0"], None, "--k 0"),
        (["pairs", tmp_path / "rows.jsonl", "--strategy", "best"], None, "strategies are"),
        (["templates", "extra"], None, "unexpected extra argument"),
    ]


@pytest.mark.slow
def test_every_verb_reports_bad_input_in_one_message_with_exit_2(tmp_path, cli):
    for args, stdin, message in _error_cases(tmp_path):
        proc = cli("pt-data", *args, input=stdin, check=False)
        where = f"pt-data {' '.join(map(str, args))}:\n{proc.stderr}"
        assert proc.returncode == 2, where
        assert message in proc.stderr, where
        assert "Traceback" not in proc.stderr and proc.stdout == "", where
    assert not (tmp_path / "out").exists() and not (tmp_path / "t").exists()


@pytest.mark.slow
def test_every_verb_whose_hint_names_skip_bad_has_it(tmp_path, cli, tiny_tokenizer_dir):
    # A malformed jsonl line's hint says "pass --skip-bad"; each verb that reads row files
    # takes the flag, and with it skips the line and goes on.
    src = tmp_path / "bad.jsonl"
    src.write_text(BAD_LINE)
    cfg = _config(tmp_path, src)
    tokenized = tmp_path / "tokenized.jsonl"
    tokenized.write_text('{"input_ids": [1, 2], "labels": [-100, 2]}\n{oops\n')
    graded = tmp_path / "graded.jsonl"
    rows = [
        {"id": "a", "sample": s, "prompt": "q", "completion": c, "prompt_token_ids": [1],
         "completion_token_ids": [s + 5], "correct": s == 0, "grade_status": "ok"}
        for s, c in ((0, "right"), (1, "wrong"))
    ]  # fmt: skip
    graded.write_text("".join(json.dumps(r) + "\n" for r in rows) + "{oops\n")
    tok = f"data.tokenizer.name_or_path={tiny_tokenizer_dir}"
    commands = [
        ["build", cfg, "--out", tmp_path / "built"],
        ["inspect", cfg, "--stage", "raw"],
        ["inspect", graded],
        ["stats", cfg, tok],
        ["stats", tokenized],
        ["pairs", graded, "--out", tmp_path / "pairs"],
        ["tokenizer", "--texts", src, "--out", tmp_path / "tok"],
    ]
    for args in commands:
        failed = cli("pt-data", *args, check=False)
        assert failed.returncode == 2 and "pass --skip-bad" in failed.stderr, args
        cli("pt-data", *args, "--skip-bad")  # exits 0
    stats = json.loads(cli("pt-data", "stats", tokenized, "--skip-bad").stdout)
    assert stats["overall"]["sequences"] == 1  # the good line; the bad one skipped


def test_help_shows_flags_without_a_value_type_and_every_verb_has_a_docs_section(cli):
    from pathlib import Path

    from pt_data.cli import app

    verbs = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"build", "inspect", "stats", "pairs", "synth", "tokenizer", "templates"} <= set(verbs)
    docs = (Path(__file__).resolve().parents[3] / "docs" / "pt-data.md").read_text()
    for verb in verbs:
        assert f"## `pt-data {verb}`" in docs, verb
        text = cli("pt-data", verb, "--help", env={"COLUMNS": "200"}).stdout
        # a flag takes no value
        assert "<bool>" not in text
