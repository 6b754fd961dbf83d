"""What --model and --teacher accept: a checkpoint directory, a hub name, or '-' for the
checkpoint manifest piped in (pt-train run | pt-rollout generate --model -); anything
else is one error, exit 2, before an engine starts."""

from __future__ import annotations

import io
import json
import shutil

import pytest

from pt_core.errors import InputError
from pt_core.files import read_rows, write_rows
from pt_rollout.model_path import latest_inference_checkpoint, one_stdin_input, resolve_model

THREADS = {"OMP_NUM_THREADS": "2"}


@pytest.fixture
def run_dir(tmp_path, tiny_model_dir):
    """A pt-train run directory with inference checkpoints at steps 2 and 10."""
    run = tmp_path / "runs" / "sft"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("run_name: sft\n")
    for step in (2, 10):
        shutil.copytree(tiny_model_dir, run / "inference" / f"step-{step}")
    return run


def test_a_checkpoint_directory_is_taken_as_is(tiny_model_dir):
    assert resolve_model(tiny_model_dir) == str(tiny_model_dir)


def test_a_run_directory_is_refused_with_its_latest_checkpoint(run_dir):
    # step-10 is the latest: steps compare as numbers ("step-10" < "step-2" as text).
    assert latest_inference_checkpoint(run_dir) == run_dir / "inference" / "step-10"
    with pytest.raises(InputError) as err:
        resolve_model(run_dir, option="--teacher")
    assert "a pt-train run directory, not a checkpoint" in err.value.message
    assert str(run_dir / "inference" / "step-10") in err.value.message
    assert err.value.hint.startswith(f"pass --teacher {run_dir / 'inference' / 'step-10'}")


def test_a_run_without_an_inference_checkpoint_says_so(tmp_path):
    run = tmp_path / "fresh"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(InputError, match="without an inference checkpoint yet"):
        resolve_model(run)


def test_paths_that_are_not_models(tmp_path, tiny_model_dir):
    with pytest.raises(InputError, match=r"not a model directory \(no config.json\)"):
        resolve_model(tmp_path)
    weights = next(tiny_model_dir.glob("*.safetensors"))
    with pytest.raises(InputError, match="is a file; a model is a directory") as err:
        resolve_model(weights)
    assert err.value.hint == f"pass its directory: --model {tiny_model_dir}"
    with pytest.raises(InputError, match="no such directory"):
        resolve_model(tmp_path / "runs" / "sft" / "inference" / "step-5")


def test_a_hub_name_offline_must_be_in_the_cache(monkeypatch, tmp_path):
    # The tests run with HF_HUB_OFFLINE=1 (root conftest); an empty cache holds nothing.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(InputError, match="not in the Hugging Face cache"):
        resolve_model("Qwen/Qwen2.5-0.5B")


def test_dash_reads_the_checkpoint_manifest_from_stdin(monkeypatch, tiny_model_dir):
    line = json.dumps({"kind": "checkpoint", "path": str(tiny_model_dir), "step": 3})
    monkeypatch.setattr("sys.stdin", io.StringIO("training...\n" + line + "\n"))
    assert resolve_model("-") == str(tiny_model_dir)
    dataset = json.dumps({"kind": "dataset", "path": str(tiny_model_dir)})
    monkeypatch.setattr("sys.stdin", io.StringIO(dataset + "\n"))
    with pytest.raises(InputError, match="upstream manifest is of kind 'dataset'"):
        resolve_model("-")


def test_only_one_input_may_come_from_stdin():
    one_stdin_input(model="-", prompts="p.jsonl")
    with pytest.raises(InputError) as err:
        one_stdin_input(model="-", prompts="-")
    assert err.value.message.startswith("--model and --prompts are both '-'")
    assert err.value.hint.endswith("(e.g. --model - --prompts PATH)")


@pytest.mark.slow
def test_a_checkpoint_manifest_pipes_into_generate_and_score(tmp_path, cli, tiny_tokenizer_dir):
    """pt-train init | pt-rollout generate --model -, then the same checkpoint piped into
    score --teacher -: each reads the model path from the upstream manifest."""
    config = tmp_path / "train.yaml"
    config.write_text(
        f"run_name: tiny\noutput_dir: {tmp_path / 'runs'}\n"
        f"model:\n  init:\n    tokenizer: {tiny_tokenizer_dir}\n"
        "    hidden_size: 64\n    num_layers: 1\n    num_heads: 1\n"
        "training:\n  max_steps: 1\n  global_batch_size: 1\n  micro_batch_size: 1\n"
    )
    init = cli("pt-train", "init", config, env=THREADS)
    checkpoint = json.loads(init.stdout)
    assert checkpoint["kind"] == "checkpoint"
    prompts = write_rows(tmp_path / "p.jsonl", [{"id": 1, "prompt": "1+1="}])
    gen = cli("pt-rollout", "generate", "--model", "-", "--prompts", prompts,
              "--out", tmp_path / "r.jsonl", "--n", "2", "--max-tokens", "3", "--engine", "hf",
              input=init.stdout, env=THREADS)  # fmt: skip
    rollouts = json.loads(gen.stdout)
    assert rollouts["model"] == checkpoint["path"] and rollouts["rows"] == 2
    sc = cli("pt-rollout", "score", "--teacher", "-", "--rollouts", tmp_path / "r.jsonl",
             "--out", tmp_path / "s.jsonl", "--engine", "hf",
             input=init.stdout, env=THREADS)  # fmt: skip
    scores = json.loads(sc.stdout)
    assert scores["teacher"] == checkpoint["path"]
    assert [len(r["teacher_token_logprobs"]) for r in read_rows(tmp_path / "s.jsonl")] == [
        len(r["completion_token_ids"]) for r in read_rows(tmp_path / "r.jsonl")
    ]


@pytest.mark.slow
def test_a_bad_model_stops_before_any_output_is_started(tmp_path, run_dir, cli):
    prompts = write_rows(tmp_path / "p.jsonl", [{"id": 1, "prompt": "1+1="}])
    out = tmp_path / "r.jsonl"
    proc = cli("pt-rollout", "generate", "--model", run_dir, "--prompts", prompts,
               "--out", out, "--engine", "hf", check=False)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: --model {run_dir}: a pt-train run directory")
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not out.with_name("r.jsonl.partial").exists()
