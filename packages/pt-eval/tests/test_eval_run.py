"""`pt-eval run` (generate on a benchmark, then grade) and the pipe it stands for:
`pt-rollout generate ... | pt-eval grade -`. Both run the tiny model on a few GSM8K rows."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pt_core.files import read_rows, write_rows

THREADS = {"OMP_NUM_THREADS": "2"}


@pytest.fixture
def gsm8k_rows():
    from pt_core.errors import InputError
    from pt_eval.benchmarks import benchmark_path

    try:
        path = benchmark_path("gsm8k")
    except InputError as exc:
        pytest.skip(f"no shared benchmarks: {exc}")
    with open(path) as fh:
        return [json.loads(next(fh)) for _ in range(3)]


def test_pt_rollout_generate_pipes_into_pt_eval_grade(tmp_path, tiny_model_dir, gsm8k_rows):
    # The raw GSM8K rows: `question` is found as the prompt, `answer` ("... #### 18") is the
    # gold that pt-eval grade reads from the rollouts, which carry it through.
    prompts = write_rows(tmp_path / "gsm8k.jsonl", gsm8k_rows)
    bindir = Path(sys.executable).parent
    generate = [
        bindir / "pt-rollout", "generate", "--model", tiny_model_dir, "--prompts", prompts,
        "--out", tmp_path / "rollouts.jsonl", "--n", "2", "--max-tokens", "8", "--engine", "hf",
    ]  # fmt: skip
    grade = [bindir / "pt-eval", "grade", "-", "--out", tmp_path / "grades.jsonl"]
    pipeline = " | ".join(" ".join(shlex.quote(str(a)) for a in cmd) for cmd in (generate, grade))
    proc = subprocess.run(
        ["bash", "-o", "pipefail", "-c", pipeline],
        capture_output=True,
        text=True,
        env={**os.environ, **THREADS},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads(proc.stdout.strip().splitlines()[-1])
    assert manifest["kind"] == "grades"
    assert manifest["problems"] == 3 and manifest["samples"] == 6
    grades = read_rows(tmp_path / "grades.jsonl")
    assert sorted((g["id"], g["sample"]) for g in grades) == [
        (i, s) for i in range(3) for s in (0, 1)
    ]
    assert all(g["grade_status"] in ("ok", "no_answer") for g in grades)


def test_pt_eval_run_generates_with_the_math_prompt_and_grades(
    tmp_path, tiny_model_dir, tiny_tokenizer, gsm8k_rows, cli
):
    out = tmp_path / "eval"
    proc = cli("pt-eval", "run", "--model", tiny_model_dir, "--benchmark", "gsm8k",
               "--limit", "3", "--n", "2", "--max-tokens", "8", "--engine", "hf",
               "--out", out, env=THREADS)  # fmt: skip
    manifest = json.loads(proc.stdout.strip().splitlines()[-1])
    assert manifest["kind"] == "grades" and manifest["benchmark"] == "gsm8k"
    assert manifest["problems"] == 3 and manifest["samples"] == 6
    assert "pass@2" in proc.stderr and "accuracy" in proc.stderr  # the grade summary table
    grades = read_rows(out / "grades.jsonl")
    # The gold is GSM8K's number after "####", and accuracy is the mean over all samples.
    assert grades[0]["answer"] == "18"
    assert manifest["accuracy"] == pytest.approx(sum(g["correct"] for g in grades) / 6)
    # Every problem went through the chat template with the standard math system prompt.
    from pt_eval.run import MATH_PROMPT

    rollout = read_rows(out / "rollouts.jsonl")[0]
    text = tiny_tokenizer.decode(rollout["prompt_token_ids"])
    assert f"<|im_start|>system\n{MATH_PROMPT}<|im_end|>" in text
    assert gsm8k_rows[0]["question"] in text


def test_pt_eval_run_takes_the_checkpoint_manifest_and_a_benchmark_directory(
    tmp_path, tiny_model_dir, cli
):
    # what `pt-train run ... | pt-eval run --model -` hands over: the checkpoint manifest;
    # the benchmark is found by name in --benchmarks-dir, its problem in the column named
    benchmarks = tmp_path / "benchmarks"
    write_rows(benchmarks / "gsm8k" / "test.jsonl",
               [{"id": i, "text": f"What is {i} + 1?", "answer": f"#### {i + 1}"}
                for i in range(2)])  # fmt: skip
    upstream = json.dumps({"kind": "checkpoint", "path": str(tiny_model_dir), "step": 5}) + "\n"
    out = tmp_path / "eval"
    proc = cli("pt-eval", "run", "--model", "-", "--benchmark", "gsm8k",
               "--benchmarks-dir", benchmarks, "--prompt-key", "text", "--n", "1",
               "--max-tokens", "4", "--engine", "hf", "--out", out, input=upstream,
               env=THREADS)  # fmt: skip
    manifest = json.loads(proc.stdout.strip().splitlines()[-1])
    assert manifest["model"] == str(tiny_model_dir) and manifest["samples"] == 2
    prompts = read_rows(out / "prompts.jsonl")
    assert [p["prompt"] for p in prompts] == ["What is 0 + 1?", "What is 1 + 1?"]
    assert [g["answer"] for g in read_rows(out / "grades.jsonl")] == ["1", "2"]
