"""bench/gpu_check.sh, the GPU check of pt-train: its parameter count is the models', and
its dry run (the same sequence on this CPU, tiny shapes) runs every check and writes the
figures it prints; a spent budget skips the checks and still writes them."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu_check.sh"


def _load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _load_gpu_check()
SFT_CHECKS = ["sft-0.5b-zero2", "sft-0.5b-zero0", "sft-1.5b-zero2", "sft-1.5b-zero0"]
ORDER = [
    "setup",
    *SFT_CHECKS,
    "dft-0.5b",
    "dpo-0.5b",
    "opd-0.5b",
    "grpo-0.5b",
    "grpo-0.5b-server",
    "rollout-per-sample",
    "rollout-engine",
    "sft-0.5b-plain-fp32",
    "sft-0.5b-flash-attn",
    "vllm-grpo-0.5b-colocate",
    "vllm-grpo-0.5b-server-files",
    "vllm-grpo-0.5b-server-ipc",
    "vllm-grpo-0.5b-server-nccl",
    "vllm-weight-push",
    "vllm-rollout-per-sample",
    "vllm-rollout-engine",
]
VLLM_CHECKS = {name for name in ORDER if name.startswith("vllm-")}


@pytest.mark.parametrize("shape", [gpu_check.QWEN_05B, gpu_check.QWEN_15B, gpu_check.TINY_A])
def test_the_mfu_parameter_count_is_the_models_own(shape):
    """6 x N x tokens/s needs N of the model that trains: build that Llama (tied
    embeddings, Qwen's vocabulary) on the meta device and count its weights; for the 0.5B
    shape that is Qwen2.5-0.5B's 494,032,768 less its q/k/v biases (24 x (896 + 2 x 128))."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=gpu_check.QWEN_VOCAB,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    counted = sum(p.numel() for p in model.parameters())  # a tied weight is listed once
    assert shape.parameters(gpu_check.QWEN_VOCAB) == counted
    if shape is gpu_check.QWEN_05B:
        assert counted == 494_032_768 - 24 * (896 + 2 * 128)


def _run(args: list[str], out: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(out), **env},
        timeout=1700,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_online_runs_figures_are_its_last_rounds_and_each_rounds_generation(tmp_path):
    """summarise() on a hand-written metrics.jsonl of three steps, two rounds (round figures
    on each round's first step): medians after the warm-up step, the last round's push and
    load, and each round's generation time in order."""
    records = [
        {"step": 1, "loss": 0.5, "tokens_per_s": 100.0, "step_time_s": 4.0,
         "peak_memory_gb": 2.0, "generate_s": 9.5, "weight_push_s": 0.0, "weight_load_s": 0.0},
        {"step": 2, "loss": 0.4, "tokens_per_s": 300.0, "step_time_s": 2.0,
         "peak_memory_gb": 2.5},
        {"step": 3, "loss": 0.3, "tokens_per_s": 200.0, "step_time_s": 3.0,
         "peak_memory_gb": 2.25, "generate_s": 3.25, "weight_push_s": 1.5, "weight_load_s": 0.5},
    ]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = gpu_check.summarise(tmp_path, warmup=1)
    assert out["steps"] == 3 and out["tokens_per_s"] == 250.0 and out["step_time_s"] == 2.5
    assert out["peak_memory_gb"] == 2.5
    assert (out["loss_first"], out["loss_last"]) == (0.5, 0.3)
    assert out["generate_s_rounds"] == [9.5, 3.25] and out["generate_s"] == 3.25
    assert (out["weight_push_s"], out["weight_load_s"]) == (1.5, 0.5)
    line = gpu_check.summary_line({"name": "grpo-0.5b-server", "status": "ok", **out})
    assert "generation 3.2 s, push 1.50 s + load 0.50 s" in line


def test_the_dry_run_trains_one_check_and_plans_every_other_one(tmp_path):
    """The dry run trains sft-0.5b-zero2 for real (DeepSpeed ZeRO-2, bf16 on the CPU) and
    plans the rest: each training check's config is written and passes pt-train's config
    loader, each rollout check's command is recorded. (Each method's training is tested in
    pt-train's own tests, each seeding mode in pt-rollout's.)"""
    proc = _run(["bash", str(SCRIPT), "--dry-run"], tmp_path, PYTHON=sys.executable)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {c["name"]: c for c in result["checks"]}
    assert result["mode"] == "dry-run" and [c["name"] for c in result["checks"]] == ORDER
    # one line per check on stdout, in the same order
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ORDER
    status = {name: c["status"] for name, c in checks.items()}
    # this environment has no vllm (it lives in .venv-vllm)
    assert {n for n, s in status.items() if s == "skipped"} == {"sft-0.5b-flash-attn", *VLLM_CHECKS}
    assert {n for n, s in status.items() if s == "ok"} == {"setup", "sft-0.5b-zero2"}, status
    assert {n for n, s in status.items() if s == "planned"} == set(ORDER) - {
        "setup", "sft-0.5b-zero2", "sft-0.5b-flash-attn", *VLLM_CHECKS
    }  # fmt: skip
    for name in VLLM_CHECKS:
        assert "vllm does not import here" in checks[name]["reason"]

    plan = gpu_check.DRY_PLAN
    trained = checks["sft-0.5b-zero2"]
    # what was trained: the plan's shape, its tokens per step, its number of steps
    assert trained["parameters"] == plan.small.parameters(plan.vocab)
    assert trained["tokens_per_step"] == plan.rows * plan.seq
    assert trained["steps"] == plan.steps
    assert trained["tokens_per_s"] > 0 and trained["peak_memory_gb"] > 0
    assert trained["mfu"] == pytest.approx(
        6 * trained["parameters"] * trained["tokens_per_s"] / 790e12
    )
    # random initial weights give near-uniform next-token probabilities: the first loss is
    # close to ln(vocabulary)
    assert trained["loss_first"] == pytest.approx(math.log(plan.vocab), abs=0.25)
    assert trained["engine"] == "DeepSpeed ZeRO-2"
    assert "===== sft-0.5b-zero2" in (tmp_path / "gpu_check.log").read_text()

    for name in [*SFT_CHECKS[1:], "dft-0.5b", "sft-0.5b-plain-fp32"]:
        c, training = checks[name], checks[name]["config"]["training"]
        shape = plan.large if "1.5b" in name else plan.small
        assert c["parameters"] == shape.parameters(plan.vocab)
        assert (
            c["tokens_per_step"] == plan.rows * plan.seq == training["global_batch_size"] * plan.seq
        )
        assert training["max_steps"] == (plan.steps if name in SFT_CHECKS else plan.short_steps)
        # pt-train's loader accepted it: the accumulation steps of one process
        assert c["grad_accum"] == plan.rows // plan.micro[shape.label]
    assert checks["sft-0.5b-plain-fp32"]["engine"] == "plain"
    assert checks["sft-0.5b-plain-fp32"]["config"]["training"]["precision"] == "fp32"
    assert checks["dft-0.5b"]["config"]["objective"] == {"name": "dft"}
    # the checks that start from a 0.5B model start from the one trained
    model = checks["dpo-0.5b"]["start"]
    assert model.endswith("inference/step-3")
    for name, objective in (
        ("dpo-0.5b", "dpo"), ("opd-0.5b", "opd"), ("grpo-0.5b", "grpo"),
        ("grpo-0.5b-server", "grpo"),
    ):  # fmt: skip
        c = checks[name]
        assert c["config"]["model"]["name_or_path"] == model == c["start"]
        assert c["config"]["objective"]["name"] == objective and c["grad_accum"] == 2
    assert checks["opd-0.5b"]["config"]["objective"]["teacher"]["path"] == model
    for name, rounds, generator in (
        ("opd-0.5b", 1, None), ("grpo-0.5b", 2, None), ("grpo-0.5b-server", 2, "server"),
    ):  # fmt: skip
        # one update a round; the generator in the trainer's process unless named
        config = checks[name]["config"]
        assert config["training"]["max_steps"] == rounds
        assert config["rollout"]["max_tokens"] == plan.online_tokens
        assert config["rollout"].get("generator") == generator
    for seeding in ("per-sample", "engine"):
        command = checks[f"rollout-{seeding}"]["command"]
        assert command[1:4] == ["-m", "pt_rollout.cli", "generate"]
        assert command[command.index("--seeding") + 1] == seeding
        assert command[command.index("--model") + 1] == model
        assert command[command.index("--n") + 1] == str(plan.rollout_n)


@pytest.mark.parametrize("gpus", [1, 2])
def test_where_vllm_imports_on_a_gpu_its_paths_are_planned_from_the_small_model(tmp_path, gpus):
    """The vLLM checks' plan on a machine with vllm and ``gpus`` GPUs (nothing runs: the
    plan runs no check): GRPO's two rounds colocated and asleep between them, from a
    process on the same GPU with files and with CUDA IPC, over NCCL to a second GPU where
    there is one; pt-rollout's vLLM engine with each seeding."""
    import dataclasses
    import time

    plan = dataclasses.replace(gpu_check.DRY_PLAN, run_only=())
    runner = gpu_check.Runner(
        plan, dry_run=True, out=tmp_path, work=tmp_path, deadline=time.monotonic() + 3600
    )
    try:
        runner.env_info = {
            "vllm": True, "devices": {"kind": "cuda", "count": gpus}, "deepspeed_import": None,
        }  # fmt: skip
        runner.models = ["/models/sft-0.5b"]
        runner.vllm()
    finally:
        runner.log.close()
    checks = {c["name"]: c for c in runner.results}
    assert list(checks) == sorted(VLLM_CHECKS, key=ORDER.index)
    rollouts = {
        name: checks[name]["config"]["rollout"] for name in checks if "grpo" in name and
        checks[name]["status"] == "planned"
    }  # fmt: skip
    for name, rollout in rollouts.items():
        assert checks[name]["config"]["model"]["name_or_path"] == "/models/sft-0.5b"
        assert checks[name]["config"]["training"]["max_steps"] == 2
        assert rollout["engine"] == "vllm"
    colocate = rollouts["vllm-grpo-0.5b-colocate"]
    assert (colocate["generator"], colocate["sleep_level"]) == ("colocate", 2)
    assert rollouts["vllm-grpo-0.5b-server-files"].get("weight_transfer") is None
    assert rollouts["vllm-grpo-0.5b-server-ipc"]["weight_transfer"] == "ipc"
    if gpus == 1:
        assert checks["vllm-grpo-0.5b-server-nccl"]["reason"] == gpu_check.NCCL_REASON
    else:
        nccl = rollouts["vllm-grpo-0.5b-server-nccl"]
        assert (nccl["weight_transfer"], nccl["server_devices"]) == ("nccl", [1])
    push = checks["vllm-weight-push"]["command"]
    assert push[1].endswith("bench/weight_push.py")
    assert push[push.index("--way") + 1] == "ipc"
    assert push[push.index("--shapes") + 1] == "tiny"  # the dry plan's (a GPU's: 0.5b, 1.5b)
    for seeding in ("per-sample", "engine"):
        command = checks[f"vllm-rollout-{seeding}"]["command"]
        assert command[command.index("--engine") + 1] == "vllm"
        assert command[command.index("--seeding") + 1] == seeding


def test_where_vllm_imports_without_a_gpu_its_checks_are_skipped_for_that(tmp_path):
    import time

    runner = gpu_check.Runner(
        gpu_check.DRY_PLAN, dry_run=True, out=tmp_path, work=tmp_path,
        deadline=time.monotonic() + 3600,
    )  # fmt: skip
    try:
        runner.env_info = {"vllm": True, "devices": {"kind": "cpu", "count": 0}}
        runner.models = ["/models/sft-0.5b"]
        runner.vllm()
    finally:
        runner.log.close()
    assert [c["name"] for c in runner.results] == sorted(VLLM_CHECKS, key=ORDER.index)
    assert {c["status"] for c in runner.results} == {"skipped"}
    assert all(c["reason"].startswith("no GPU: ") for c in runner.results)


@pytest.mark.slow
def test_a_spent_budget_skips_the_checks_and_still_writes_the_figures(tmp_path):
    """With 1 s for everything, the environment and the set-up still run (everything
    depends on them); each training check is skipped for the budget, and the checks that
    start from a trained 0.5B model for the lack of one; the JSON says so."""
    proc = _run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--dry-run", "--budget-s", "1",
         "--out", str(tmp_path)],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [c["name"] for c in result["checks"]] == ORDER
    assert result["checks"][0]["status"] == "ok"
    reasons = {c["name"]: c.get("reason", "") for c in result["checks"]}
    for name in [*SFT_CHECKS, "dft-0.5b", "sft-0.5b-plain-fp32"]:
        assert reasons[name].startswith("the time budget is spent"), name
    for name in gpu_check.FROM_SMALL_MODEL:
        if name in VLLM_CHECKS:  # this environment has no vllm: that comes first
            assert reasons[name] == gpu_check.VLLM_REASON, name
        else:
            assert reasons[name] == "no 0.5B model was trained before it", name
    assert all(c["status"] == "skipped" for c in result["checks"][1:])


@pytest.mark.slow
def test_without_a_gpu_the_gpu_mode_stops_and_says_why(tmp_path):
    proc = _run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out", str(tmp_path)],
                tmp_path)  # fmt: skip
    assert proc.returncode == 1
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["mode"] == "gpu" and result["environment"]["devices"]["kind"] == "cpu"
    assert result["checks"] == [
        {"name": "setup", "status": "failed",
         "reason": "no CUDA device is visible; on a CPU, run it with --dry-run"}
    ]  # fmt: skip
    assert proc.stdout.split() == ["setup", "failed", *result["checks"][0]["reason"].split()]


def test_the_scripts_pass_shellcheck():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).with_name("shellcheck"))
    scripts = [SCRIPT, REPO / "bench" / "gpu_wheels.sh"]
    check = subprocess.run([shellcheck, *map(str, scripts)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


@pytest.mark.parametrize(
    ("only", "runs"),
    [
        ("sft-1.5b-zero0", ("setup", "sft-1.5b-zero0")),
        # these start from the model sft-0.5b-zero2 trains: it runs first
        ("rollout-engine,grpo-0.5b", ("setup", "sft-0.5b-zero2", "grpo-0.5b", "rollout-engine")),
        (" dpo-0.5b , dft-0.5b ", ("setup", "sft-0.5b-zero2", "dft-0.5b", "dpo-0.5b")),
    ],
)
def test_only_runs_the_named_checks_with_what_they_start_from(only, runs):
    assert gpu_check.checks_to_run(only) == runs
    assert list(gpu_check.CHECKS) == ORDER


def test_only_with_an_unknown_check_is_one_error_and_writes_nothing(tmp_path):
    """gpu_check.sh passes --only to gpu_check.py, which refuses a name that is no check
    before it runs anything."""
    proc = _run(["bash", str(SCRIPT), "--dry-run", "--only=grpo-0.5b,grpo-1.5b"], tmp_path,
                PYTHON=sys.executable)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpu_check: --only: no check named 'grpo-1.5b'; the checks are")
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(gpu_check.CheckError, match="names no check"):
        gpu_check.checks_to_run(" , ")


@pytest.mark.parametrize(
    ("argument", "said"),
    [
        ("--budget-s=abc", "argument --budget-s: not a number of seconds: 'abc'"),
        ("--budget-s=0", "argument --budget-s: must be more than 0 seconds, got '0'"),
    ],
)
def test_a_budget_that_is_not_a_positive_number_is_one_error(tmp_path, argument, said):
    """0 would have meant the default budget, a negative one a run that skips everything."""
    proc = _run(["bash", str(SCRIPT), "--dry-run", argument], tmp_path, PYTHON=sys.executable)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [f"gpu_check: {said} (see --help)"]
    assert list(tmp_path.iterdir()) == []
