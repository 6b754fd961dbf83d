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
