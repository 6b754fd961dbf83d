"""`pt-rollout generate` and `score` as a user runs them: rows, resuming, pipes, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pt_core.errors import PtError
from pt_core.files import read_rows, write_rows
from pt_rollout.generate import GenerateOptions, generate
from pt_rollout.score import score

THREADS = {"OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}


def prompt_rows(count: int) -> list[dict]:
    return [
        {"id": f"q{i}", "prompt": f"What is {i} + {2 * i}?", "answer": str(3 * i), "level": i % 3}
        for i in range(count)
    ]


def keys(rows):
    return sorted((r["id"], r["sample"]) for r in rows)


def test_rows_follow_the_rollouts_schema_and_carry_columns(
    tmp_path, tiny_model_dir, tiny_tokenizer
):
    prompts = write_rows(
        tmp_path / "p.jsonl",
        [
            {"id": 1, "prompt": "What is 12 + 34?", "answer": "46", "level": 2},
            {"id": 2, "prompt": [{"role": "user", "content": "Hello!"}], "answer": "x"},
        ],
    )
    out = tmp_path / "r.jsonl"
    manifest = generate(
        tiny_model_dir, prompts, out, n=3, max_tokens=6, engine="hf", logprobs=True,
        system="Be brief.",
    )  # fmt: skip
    rows = read_rows(out)
    assert manifest["rows"] == len(rows) == 6
    assert keys(rows) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    first = rows[0]
    assert first["answer"] == "46" and first["level"] == 2  # carried through for pt-eval
    # The prompt went through the chat template, with the system prompt, as one user turn.
    expected = tiny_tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 12 + 34?"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert first["prompt_token_ids"] == tiny_tokenizer(expected, add_special_tokens=False).input_ids
    for row in rows:
        assert 1 <= len(row["completion_token_ids"]) <= 6
        assert len(row["completion_logprobs"]) == len(row["completion_token_ids"])
        assert row["finish_reason"] in ("stop", "length")
        assert row["completion"] == tiny_tokenizer.decode(
            row["completion_token_ids"], skip_special_tokens=True
        )
    assert manifest["completion_tokens"] == sum(len(r["completion_token_ids"]) for r in rows)


def test_no_template_sends_the_raw_text(tmp_path, tiny_model_dir, tiny_tokenizer):
    prompts = write_rows(tmp_path / "p.jsonl", [{"prompt": "The answer is"}])
    generate(tiny_model_dir, prompts, tmp_path / "r.jsonl", n=1, max_tokens=2, engine="hf",
             template=False)  # fmt: skip
    (row,) = read_rows(tmp_path / "r.jsonl")
    assert row["prompt_token_ids"] == tiny_tokenizer("The answer is").input_ids
    assert row["id"] == 0  # rows without an id are numbered by position


def test_a_dataset_directory_reads_its_test_split(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    write_rows(data / "train" / "part-00000.parquet", [{"id": "train-0", "prompt": "a"}])
    write_rows(data / "test" / "part-00000.parquet", [{"id": "test-0", "prompt": "b"}])
    out = tmp_path / "r.parquet"
    manifest = generate(tiny_model_dir, data, out, n=1, max_tokens=2, engine="hf")
    assert [r["id"] for r in read_rows(out)] == ["test-0"]
    assert manifest["prompts_path"] == str(data / "test")


def test_interrupted_generate_resumes_without_duplicates_or_gaps(tmp_path, tiny_model_dir):
    prompts = write_rows(tmp_path / "p.jsonl", prompt_rows(24))
    out = tmp_path / "r.jsonl"
    partial = Path(str(out) + ".partial")
    bindir = Path(sys.executable).parent
    cmd = [
        str(bindir / "pt-rollout"), "generate", "--model", str(tiny_model_dir),
        "--prompts", str(prompts), "--out", str(out), "--n", "2", "--max-tokens", "16",
        "--engine", "hf", "--batch-size", "4", "--seed", "5",
    ]  # fmt: skip
    env = {**os.environ, **THREADS}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline:
        if partial.exists() and partial.read_text().count("\n") >= 8:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # a crash: no cleanup, no finalising
    proc.wait()
    written = partial.read_text().count("\n")
    assert 8 <= written < 48, "the kill must land halfway through the 48 rows"
    assert not out.exists()

    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    manifest = json.loads(rerun.stdout.strip().splitlines()[-1])
    rows = read_rows(out)
    expected = sorted((f"q{i}", s) for i in range(24) for s in range(2))
    assert keys(rows) == expected  # every (id, sample) once
    assert manifest["resumed"] >= 8 and manifest["generated"] == 48 - manifest["resumed"]
    assert not partial.exists()

    # Each (id, sample) has its own seed, so the resumed output is the uninterrupted one.
    whole = tmp_path / "whole.jsonl"
    generate(tiny_model_dir, prompts, whole, n=2, max_tokens=16, engine="hf", seed=5)
    assert [r["completion_token_ids"] for r in rows] == [
        r["completion_token_ids"] for r in read_rows(whole)
    ]

    # A rerun on a finished output has nothing left to do.
    again = generate(tiny_model_dir, prompts, out, n=2, max_tokens=16, engine="hf", seed=5)
    assert again["generated"] == 0 and again["rows"] == 48


def test_generate_pipes_into_score(tmp_path, tiny_model_dir, cli):
    # pt-rollout generate ... | pt-rollout score --rollouts - : the manifest carries the path.
    prompts = write_rows(tmp_path / "p.jsonl", prompt_rows(3))
    gen = cli("pt-rollout", "generate", "--model", tiny_model_dir, "--prompts", prompts,
              "--out", tmp_path / "r.jsonl", "--n", "2", "--max-tokens", "5", "--engine", "hf",
              env=THREADS)  # fmt: skip
    manifest = json.loads(gen.stdout)
    assert manifest["kind"] == "rollouts" and manifest["rows"] == 6
    sc = cli("pt-rollout", "score", "--teacher", tiny_model_dir, "--rollouts", "-",
             "--out", tmp_path / "s.jsonl", "--top-k", "3", "--engine", "hf",
             input=gen.stdout, env=THREADS)  # fmt: skip
    assert json.loads(sc.stdout)["kind"] == "scores"
    for row in read_rows(tmp_path / "s.jsonl"):
        n = len(row["completion_token_ids"])
        assert len(row["teacher_token_logprobs"]) == n
        assert [len(ids) for ids in row["teacher_topk_ids"]] == [3] * n
        assert row["teacher_model"] == str(Path(tiny_model_dir).resolve())  # who scored it


def test_score_matches_the_generating_models_logprobs(tmp_path, tiny_model_dir):
    # Scoring rollouts with the model that sampled them gives back the sampled tokens'
    # log-probs, and the top-1 log-prob bounds every token's from above.
    prompts = write_rows(tmp_path / "p.jsonl", prompt_rows(4))
    generate(tiny_model_dir, prompts, tmp_path / "r.jsonl", n=2, max_tokens=6, engine="hf",
             logprobs=True)  # fmt: skip
    manifest = score(tiny_model_dir, tmp_path / "r.jsonl", tmp_path / "s.jsonl", top_k=2,
                     engine="hf")  # fmt: skip
    assert manifest["rows"] == 8
    for row in read_rows(tmp_path / "s.jsonl"):
        assert row["teacher_token_logprobs"] == pytest.approx(row["completion_logprobs"], abs=1e-4)
        for lp, top in zip(
            row["teacher_token_logprobs"], row["teacher_topk_logprobs"], strict=True
        ):
            assert top[0] >= top[1] and top[0] >= lp - 1e-6


def test_data_parallel_workers_give_the_single_engine_output(tmp_path, tiny_model_dir):
    # Two engines (processes; GPUs when there are some) on shards of the prompts: the merged
    # rows are those one engine writes, since every (id, sample) has its own seed.
    prompts = write_rows(tmp_path / "p.jsonl", prompt_rows(6))
    one = generate(tiny_model_dir, prompts, tmp_path / "one.jsonl", n=2, max_tokens=6,
                   engine="hf")  # fmt: skip
    two = generate(tiny_model_dir, prompts, tmp_path / "two.jsonl", n=2, max_tokens=6,
                   engine="hf", data_parallel=2)  # fmt: skip
    assert two["rows"] == one["rows"] == 12
    assert read_rows(tmp_path / "two.jsonl") == read_rows(tmp_path / "one.jsonl")
    assert not (tmp_path / ".two.jsonl.dp2").exists()  # shards merged and cleaned up


def test_user_errors_are_reported_with_a_fix(tmp_path, tiny_model_dir, cli):
    dup = write_rows(tmp_path / "dup.jsonl", [{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}])
    proc = cli("pt-rollout", "generate", "--model", tiny_model_dir, "--prompts", dup,
               "--out", tmp_path / "r.jsonl", "--engine", "hf", check=False)  # fmt: skip
    assert proc.returncode == 2
    assert "share the id 1" in proc.stderr and "fix:" in proc.stderr
    ok = write_rows(tmp_path / "ok.jsonl", [{"id": 1, "prompt": "a"}])
    with pytest.raises(PtError, match="needs the vLLM engine"):
        generate(tiny_model_dir, ok, tmp_path / "r.jsonl", engine="hf", tensor_parallel=2)
    long = write_rows(tmp_path / "long.jsonl", [{"id": "big", "prompt": "1 " * 1100}])
    with pytest.raises(PtError, match="prompt 'big' is .* tokens; the model takes 2048"):
        generate(tiny_model_dir, long, tmp_path / "r.jsonl", engine="hf", max_tokens=4)
    with pytest.raises(PtError, match="top_p"):
        GenerateOptions(top_p=0)
