"""`pt-eval run` before it generates anything: where the model and the benchmark come from,
and every wrong input refused with exit 2 and one line (no traceback, no model loaded)."""

from __future__ import annotations

import json

import pytest

from pt_core.files import write_rows
from pt_eval.benchmarks import load_benchmark

GSM8K_ROW = {"question": "Janet has 3 apples and buys 2. How many?", "answer": "3 + 2 = 5\n#### 5"}


def _fails_cleanly(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)


@pytest.fixture
def model_dir(tmp_path):
    """A directory that looks like an inference checkpoint (nothing loads it here)."""
    path = tmp_path / "run" / "inference" / "step-10"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (tmp_path / "run" / "inference" / "step-2").mkdir()
    (tmp_path / "run" / "checkpoints" / "step-10").mkdir(parents=True)
    return path


@pytest.fixture
def bench_dir(tmp_path):
    directory = tmp_path / "benchmarks"
    write_rows(directory / "gsm8k" / "test.jsonl", [GSM8K_ROW])
    return directory


# --------------------------------------------------------------------------- benchmarks


def test_benchmark_names_are_found_through_a_setting(bench_dir, tmp_path, monkeypatch):
    rows = load_benchmark("gsm8k", benchmarks_dir=bench_dir)
    assert rows[0]["answer"] == "5" and rows[0]["problem"] == GSM8K_ROW["question"]
    monkeypatch.setenv("PT_BENCHMARKS", str(bench_dir))
    assert load_benchmark("gsm8k")[0]["answer"] == "5"
    # the flag comes before the environment variable
    other = tmp_path / "other"
    write_rows(other / "gsm8k" / "test.jsonl", [{**GSM8K_ROW, "answer": "#### 6"}])
    assert load_benchmark("gsm8k", benchmarks_dir=other)[0]["answer"] == "6"


def test_the_prompt_column_is_found_or_named(tmp_path):
    path = write_rows(tmp_path / "b.jsonl", [{"prompt": "What is 2+2?", "answer": "4"}])
    assert load_benchmark(path)[0]["problem"] == "What is 2+2?"
    path = write_rows(tmp_path / "c.jsonl", [{"text": "What is 2+2?", "answer": "4"}])
    assert load_benchmark(path, prompt_key="text")[0]["problem"] == "What is 2+2?"


def test_a_benchmark_directory_that_does_not_exist(cli, model_dir, tmp_path):
    proc = cli("pt-eval", "run", "--model", model_dir, "--benchmark", "gsm8k",
               "--benchmarks-dir", tmp_path / "nowhere", check=False)  # fmt: skip
    _fails_cleanly(proc, "--benchmarks-dir", "not a directory")
    proc = cli("pt-eval", "run", "--model", model_dir, "--benchmark", "gsm8k", check=False,
               env={"PT_BENCHMARKS": str(tmp_path / "nowhere")})  # fmt: skip
    _fails_cleanly(proc, "PT_BENCHMARKS", "not a directory")


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("", ("no rows",)),
        ('{"question": "q", "answer": "1"}\n{oops\n', ("b.jsonl:2", "malformed JSON")),
        ('{"body": "q", "answer": "1"}\n', ("no prompt column", "--prompt-key")),
        ('{"question": "q"}\n', ("no gold answer",)),
        ('{"question": 5, "answer": "1"}\n', ("'question' is a int",)),
    ],
    ids=["empty", "malformed", "no-prompt", "no-answer", "prompt-not-text"],
)
def test_empty_and_malformed_benchmark_files(cli, model_dir, tmp_path, content, needles):
    bench = tmp_path / "b.jsonl"
    bench.write_text(content)
    proc = cli("pt-eval", "run", "--model", model_dir, "--benchmark", bench, check=False)
    _fails_cleanly(proc, *needles)


def test_a_missing_prompt_key(cli, model_dir, bench_dir):
    proc = cli("pt-eval", "run", "--model", model_dir, "--benchmark", "gsm8k",
               "--benchmarks-dir", bench_dir, "--prompt-key", "body", check=False)  # fmt: skip
    _fails_cleanly(proc, "no column 'body'", "--prompt-key")


def test_an_unknown_benchmark(cli, model_dir, bench_dir):
    proc = cli("pt-eval", "run", "--model", model_dir, "--benchmark", "gsm9k",
               "--benchmarks-dir", bench_dir, check=False)  # fmt: skip
    _fails_cleanly(proc, "unknown benchmark 'gsm9k'", "gsm8k")


# --------------------------------------------------------------------------- models


def test_a_run_directory_names_the_inference_checkpoint_to_use(cli, model_dir, bench_dir):
    run_dir = model_dir.parent.parent
    for given in (run_dir, run_dir / "checkpoints" / "step-10"):
        proc = cli("pt-eval", "run", "--model", given, "--benchmark", "gsm8k",
                   "--benchmarks-dir", bench_dir, check=False)  # fmt: skip
        # the latest step by number, not by name (step-10 after step-2)
        _fails_cleanly(proc, "not an inference checkpoint", str(run_dir / "inference" / "step-10"))


def test_the_checkpoint_manifest_on_stdin(cli, model_dir, bench_dir):
    # pt-train's manifest names the run directory here: the same clear error as a path
    upstream = json.dumps({"kind": "checkpoint", "path": str(model_dir.parent.parent)}) + "\n"
    proc = cli("pt-eval", "run", "--model", "-", "--benchmark", "gsm8k",
               "--benchmarks-dir", bench_dir, input=upstream, check=False)  # fmt: skip
    _fails_cleanly(proc, "inference/step-10")
    for manifest, needle in (
        ({"kind": "dataset", "path": str(model_dir)}, "of kind 'dataset'"),
        ({"kind": "checkpoint", "path": 7}, "'path'"),
        ({"kind": "checkpoint", "path": "/no/such/model"}, "does not exist"),
    ):
        proc = cli("pt-eval", "run", "--model", "-", "--benchmark", "gsm8k",
                   input=json.dumps(manifest) + "\n", check=False)  # fmt: skip
        _fails_cleanly(proc, needle)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--benchmark", "gsm8k"], ("Missing option '--model'",)),
        (["--model", "/no/such/dir/model", "--benchmark", "gsm8k"], ("no such model directory",)),
        (["--modle", "x", "--benchmark", "gsm8k"], ("No such option: --modle",)),
        (["--model", "m", "--benchmark", "gsm8k", "--n", "zero"], ("Invalid value for '--n'",)),
        (["--model", "m", "--benchmark", "gsm8k", "--n", "0"], ("Invalid value for '--n'",)),
        (["--model", "m", "--benchmark", "gsm8k", "--engine", "tpu"], ("--engine 'tpu'",)),
    ],
    ids=["no-model", "missing-dir", "mistyped-flag", "n-not-a-number", "n-zero", "engine"],
)
def test_usage_errors(cli, args, needles):
    proc = cli("pt-eval", "run", *args, check=False)
    _fails_cleanly(proc, *needles)
    assert len(proc.stderr.strip().splitlines()) <= 2  # the error, and maybe its fix
