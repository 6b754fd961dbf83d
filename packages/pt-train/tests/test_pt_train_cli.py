"""`pt-train run` as a user runs it: resume after SIGTERM and kill -9, several ranks,
ZeRO stages, the inference checkpoint, and the errors a user can cause."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pt_core.contracts import REQUEUE_EXIT_CODE

pytestmark = pytest.mark.slow

STEPS = 24


def _rows(n=40, seed=0, vocab=300):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        length = int(torch.randint(10, 48, (1,), generator=g))
        ids = torch.randint(5, vocab, (length,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": [-100] * (2 + i % 4) + ids[2 + i % 4 :]})
    return out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_tokenizer_dir):
    """A config and a small tokenized dataset shared by the tests of this module."""
    root = tmp_path_factory.mktemp("pt-train-cli")
    with open(root / "rows.jsonl", "w") as fh:
        for r in _rows():
            fh.write(json.dumps(r) + "\n")
    config = {
        "run_name": "reference",
        "output_dir": str(root / "runs"),
        "model": {
            "init": {
                "tokenizer": str(tiny_tokenizer_dir),
                "hidden_size": 128,
                "num_layers": 2,
                "num_heads": 2,
            }
        },
        "data": {"path": str(root / "rows.jsonl")},
        "objective": {"name": "sft"},
        "training": {
            "learning_rate": 2e-3,
            "lr_schedule": "cosine",
            "warmup_steps": 3,
            "min_lr_ratio": 0.1,
            "weight_decay": 0.01,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": STEPS,
            "save_steps": 6,
        },
    }
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


def pt_train(*args, **kwargs):
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kwargs.pop("env", {})}
    return subprocess.Popen(
        [os.path.join(bindir, "pt-train"), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kwargs,
    )


def finish(proc, timeout=600):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def weights(run_dir: Path, step: int = STEPS) -> dict:
    return load_file(run_dir / "inference" / f"step-{step}" / "model.safetensors")


def losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["loss"] for x in lines]


@pytest.fixture(scope="module")
def reference(workdir):
    """An uninterrupted run; the others must end with exactly its weights."""
    code, out, err = finish(pt_train("run", workdir / "train.yaml"))
    assert code == 0, err
    assert len(out.splitlines()) == 1  # stdout carries the manifest and nothing else
    manifest = json.loads(out)
    run_dir = workdir / "runs" / "reference"
    assert manifest["kind"] == "checkpoint" and manifest["step"] == STEPS
    assert Path(manifest["path"]) == (run_dir / "inference" / f"step-{STEPS}").resolve()
    return run_dir


def test_manifest_is_the_only_stdout_line_and_the_run_dir_is_complete(reference):
    assert (reference / "config.yaml").exists()
    assert (reference / "checkpoints" / "latest").read_text().strip() == f"step-{STEPS}"
    # save_total_limit=2 keeps the last two full checkpoints
    assert sorted(p.name for p in (reference / "checkpoints").glob("step-*")) == [
        "step-18",
        "step-24",
    ]
    records = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "trained_tokens", "peak_memory_gb"):
        assert all(r[key] is not None for r in records), key
    assert records[-1]["loss"] < records[0]["loss"]


def _stop_after(proc, metrics: Path, steps: int) -> str:
    """SIGTERM ``proc`` once ``metrics`` has ``steps`` lines; check that it exits with the
    requeue code and return its stdout."""
    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    code, out, err = finish(proc)
    assert code == REQUEUE_EXIT_CODE, err
    return out


def test_sigterm_then_rerun_ends_with_the_weights_of_an_uninterrupted_run(workdir, reference):
    stop_after = random.randint(2, STEPS // 2)
    run_dir = workdir / "runs" / "sigterm"
    out = _stop_after(
        pt_train("run", workdir / "train.yaml", "run_name=sigterm"),
        run_dir / "metrics.jsonl",
        stop_after,
    )
    assert out == ""  # no manifest: the run is not finished
    stopped_at = int((run_dir / "checkpoints" / "latest").read_text().strip().split("-")[1])
    assert stop_after <= stopped_at < STEPS, "the signal should land mid-run"

    code, out, err = finish(pt_train("run", workdir / "train.yaml", "run_name=sigterm"))
    assert code == 0, err
    assert f"resuming {run_dir}" in " ".join(err.split()) or "resuming" in err
    assert json.loads(out)["step"] == STEPS
    assert losses(run_dir) == losses(reference)  # the same curve, bit for bit
    ref = weights(reference)
    got = weights(run_dir)
    assert ref.keys() == got.keys()
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_plain_and_deepspeed_engines_resume_each_other_bit_for_bit(workdir, reference):
    """One process at ZeRO stage 0 trains without DeepSpeed (pt_train.engine); the same
    run under DeepSpeed's engine does the same arithmetic, and either resumes the
    other's checkpoints: plain, then DeepSpeed, then plain again ends where the
    reference (plain throughout) ends."""
    run_dir = workdir / "runs" / "engines"
    args = ("run", workdir / "train.yaml", "run_name=engines")
    latest = run_dir / "checkpoints" / "latest"
    _stop_after(pt_train(*args), run_dir / "metrics.jsonl", 4)
    first = latest.read_text().strip()
    assert (run_dir / "checkpoints" / first / "plain" / "state.pt").exists()
    _stop_after(pt_train(*args, "deepspeed.engine=deepspeed"), run_dir / "metrics.jsonl", 10)
    second = latest.read_text().strip()
    assert second != first and (run_dir / "checkpoints" / second / "ds").is_dir()
    code, out, err = finish(pt_train(*args))
    assert code == 0, err
    assert losses(run_dir) == losses(reference)
    ref, got = weights(reference), weights(run_dir)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_kill_9_during_a_save_resumes_from_the_previous_complete_checkpoint(workdir, reference):
    """A save writes under checkpoints/.tmp-step-N and moves `latest` last: killed
    in between, the run restarts from the checkpoint `latest` still names."""
    run_dir = workdir / "runs" / "kill9"
    ckpts = run_dir / "checkpoints"
    killed_mid_save = False
    for _attempt in range(5):
        proc = pt_train("run", workdir / "train.yaml", "run_name=kill9", "training.save_steps=1")
        tmp = None
        while proc.poll() is None:
            if (ckpts / "latest").exists():
                tmp = next(iter(ckpts.glob(".tmp-step-*")), None)
                if tmp is not None:
                    proc.send_signal(signal.SIGKILL)
                    break
        finish(proc)
        if tmp is not None and tmp.exists():
            killed_mid_save = True
            break
    assert killed_mid_save, "never caught a save in progress"
    latest = (ckpts / "latest").read_text().strip()
    assert int(latest.split("-")[1]) < int(tmp.name.split("-")[-1])
    assert (ckpts / latest / "trainer_state.json").exists()

    code, out, err = finish(pt_train("run", workdir / "train.yaml", "run_name=kill9"))
    assert code == 0, err
    assert not list(ckpts.glob(".tmp-*"))  # the torn save was cleaned up
    ref = weights(reference)
    got = weights(run_dir)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_resuming_with_a_changed_learning_rate_is_refused(workdir, reference, cli):
    proc = cli(
        "pt-train", "run", workdir / "train.yaml", "training.learning_rate=1e-2", check=False
    )
    assert proc.returncode == 2
    assert "training.learning_rate" in proc.stderr and "--force-resume" in proc.stderr


def test_batch_that_the_ranks_do_not_divide_is_a_config_error(workdir, cli):
    proc = cli("pt-train", "check", workdir / "train.yaml", "launcher.nproc=3", check=False)
    assert proc.returncode == 2
    assert "global_batch_size=4" in proc.stderr and "micro_batch_size" in proc.stderr
    ok = cli("pt-train", "check", workdir / "train.yaml", "deepspeed.zero_stage=3")
    assert json.loads(ok.stdout)["deepspeed"]["zero_optimization"]["stage"] == 3


def test_two_ranks_zero3_match_one_rank_and_write_a_loadable_checkpoint(workdir, reference):
    """Data parallelism splits each global batch over the ranks; with the loss normalised
    by the global trained-token count the losses match the single-rank run."""
    code, out, err = finish(
        pt_train(
            "run",
            workdir / "train.yaml",
            "run_name=zero3",
            "launcher.nproc=2",
            "deepspeed.zero_stage=3",
            "training.micro_batch_size=1",
            "training.max_steps=6",
            "training.lr_schedule=constant",
        )  # fmt: skip
    )
    assert code == 0, err
    manifest = json.loads(out)
    assert manifest["step"] == 6
    zero3 = losses(workdir / "runs" / "zero3")
    assert len(zero3) == 6
    assert zero3[0] == pytest.approx(losses(reference)[0], abs=1e-5)  # same rows, same init

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(manifest["path"])
    w = weights(workdir / "runs" / "zero3", 6)
    assert all(torch.isfinite(v).all() for v in w.values())
    assert model.config.num_hidden_layers == 2


def test_one_rank_zero2_on_piped_conversations_writes_a_checkpoint_that_generates(
    workdir, tiny_tokenizer_dir
):
    conv = workdir / "conversations.jsonl"
    with open(conv, "w") as fh:
        for a in range(24):
            msgs = [
                {"role": "user", "content": f"What is {a} + {a + 3}?"},
                {"role": "assistant", "content": f"{a} + {a + 3} = {2 * a + 3}."},
            ]
            fh.write(json.dumps({"messages": msgs}) + "\n")
    upstream = json.dumps({"kind": "dataset", "path": str(conv), "format": "conversations"})
    proc = pt_train(
        "run", workdir / "train.yaml", "--data", "-", "run_name=zero2",
        "deepspeed.zero_stage=2", "training.max_steps=4", "data.max_seq_length=128",
        stdin=subprocess.PIPE,
    )  # fmt: skip
    out, err = proc.communicate(upstream, timeout=600)
    assert proc.returncode == 0, err
    manifest = json.loads(out)
    frozen = yaml.safe_load((workdir / "runs" / "zero2" / "config.yaml").read_text())
    assert frozen["data"]["path"] == str(conv)  # the piped path is what the run used

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(manifest["path"])
    model = AutoModelForCausalLM.from_pretrained(manifest["path"])
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 5?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out_ids = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert out_ids.shape[1] > prompt["input_ids"].shape[1]
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_a_loss_that_stays_nan_aborts_with_a_clear_message(workdir, tiny_model_dir, tmp_path):
    """A model whose output layer is NaN gives a NaN loss every step: each update is
    skipped, and after max_consecutive_nan steps the run stops with exit code 3 (a run
    failure: the input was valid)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    model.save_pretrained(tmp_path / "nan-model")
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(tmp_path / "nan-model")
    cfg = yaml.safe_load((workdir / "train.yaml").read_text())
    cfg["model"] = {"name_or_path": str(tmp_path / "nan-model")}
    cfg["run_name"] = "nan"
    cfg["training"]["max_consecutive_nan"] = 3
    (tmp_path / "nan.yaml").write_text(yaml.safe_dump(cfg))
    code, out, err = finish(pt_train("run", tmp_path / "nan.yaml"))
    assert code == 3
    assert "NaN/inf for 3 steps in a row" in " ".join(err.split())
    assert err.count("update skipped") == 3


def test_plot_draws_loss_and_lr(reference, cli):
    cli("pt-train", "plot", reference)
    for name in ("loss.png", "lr.png"):
        assert (reference / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resuming_on_changed_data_is_refused_until_forced(workdir, tmp_path):
    """The run stores its data's fingerprint; after a row is added to the data file, a rerun
    stops with exit 2 naming both fingerprints, and --force-resume goes on."""
    import shutil

    data = tmp_path / "rows.jsonl"
    shutil.copy(workdir / "rows.jsonl", data)
    args = ("run", workdir / "train.yaml", "run_name=changed-data", f"data.path={data}")
    _stop_after(pt_train(*args), workdir / "runs" / "changed-data" / "metrics.jsonl", 2)
    with open(data, "a") as fh:
        fh.write(json.dumps(_rows(1, seed=9)[0]) + "\n")
    code, out, err = finish(pt_train(*args))
    assert code == 2 and out == ""
    assert "was started on different data" in " ".join(err.split()), err
    assert "Traceback" not in err
    code, out, err = finish(pt_train(*args, "--force-resume"))
    assert code == 0, err
