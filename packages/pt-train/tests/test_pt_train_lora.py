"""LoRA (``model.lora``): only the adapters train, checkpoints hold the adapters (full) or
the merged weights (inference), the frozen reference is the policy with its adapters off,
a resumed run ends bit for bit where an uninterrupted one does, under the plain engine,
ZeRO-2 and ZeRO-3, and a generator process pushed the merged weights generates what the
adapted model does."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_core.errors import ConfigError
from pt_train.config import TrainConfig, load_train_config
from pt_train.metrics import read_metrics
from pt_train.trainer import train

REPO = Path(__file__).resolve().parents[3]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

TARGETS = ["q_proj", "v_proj", "gate_proj"]  # attention and a fused-MLP projection
ADAPTED = ("self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj")


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """Token rows, preference pairs and prompts for a tiny Llama built from ``model.init``."""
    root = tmp_path_factory.mktemp("lora")
    g = torch.Generator().manual_seed(0)
    with open(root / "rows.jsonl", "w") as fh:
        for i in range(24):
            ids = torch.randint(
                5, 300, (int(torch.randint(12, 40, (1,), generator=g)),), generator=g
            )
            ids = ids.tolist()
            fh.write(
                json.dumps({"input_ids": ids, "labels": [-100] * (2 + i % 3) + ids[2 + i % 3 :]})
                + "\n"
            )
    with open(root / "pairs.jsonl", "w") as fh:
        for i in range(16):
            fh.write(
                json.dumps({
                    "prompt": f"What is {i} + {i + 2}?",
                    "chosen": f"{i} + {i + 2} = {2 * i + 2}.",
                    "rejected": f"It is {3 * i + 1}, I think.",
                })
                + "\n"
            )  # fmt: skip
    with open(root / "prompts.jsonl", "w") as fh:
        for i in range(12):
            fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {2 * i}?"}) + "\n")
    return root


def config(world: Path, name: str, tokenizer_dir, *, lora: dict | None = None, **sections) -> dict:
    training = {
        "seed": 0,
        "learning_rate": 1e-2,
        "lr_schedule": "constant",
        "global_batch_size": 4,
        "micro_batch_size": 2,
        "max_steps": 3,
        **sections.pop("training", {}),
    }
    model = {
        "init": {
            "tokenizer": str(tokenizer_dir),
            "hidden_size": 128,
            "num_layers": 2,
            "num_heads": 2,
        }
    }
    if lora is not None:
        model["lora"] = {"r": 4, "alpha": 8, "target_modules": TARGETS, **lora}
    return {
        "run_name": name,
        "output_dir": str(world / "runs"),
        "model": model,
        "data": {"path": str(world / "rows.jsonl")},
        "training": training,
        **sections,
    }


def run(world, name, tokenizer_dir, **kwargs) -> Path:
    train(TrainConfig.model_validate(config(world, name, tokenizer_dir, **kwargs)))
    return world / "runs" / name


def base_model(tokenizer):
    """The weights ``model.init`` starts every run of this module from (seed 0)."""
    from pt_train.model import build_llama

    return build_llama(tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0).eval()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.lora.r=0", "model.lora.r"),
        ("model.lora.r=-4", "model.lora.r"),
        ("model.lora.alpha=0", "model.lora.alpha"),
        ("model.lora.dropout=1.0", "model.lora.dropout"),
        ("model.lora.reference=frozen", "model.lora.reference"),
        ("model.lora.target_modules=[]", "model.lora.target_modules"),
    ],
)
def test_a_bad_lora_value_is_a_config_error_naming_its_key(
    tmp_path, tiny_tokenizer_dir, override, key
):
    path = tmp_path / "train.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config(tmp_path, "bad", tiny_tokenizer_dir, lora={})))
    assert load_train_config(path).model.lora.r == 4
    with pytest.raises(ConfigError) as err:
        load_train_config(path, [override])
    assert key in str(err.value)


def test_lora_is_off_unless_configured(tmp_path, tiny_tokenizer_dir):
    cfg = TrainConfig.model_validate(config(tmp_path, "full", tiny_tokenizer_dir))
    assert cfg.model.lora is None
    # the defaults: the attention projections, reference = the policy with adapters off
    cfg = TrainConfig.model_validate(config(tmp_path, "l", tiny_tokenizer_dir, lora={}))
    defaults = type(cfg.model.lora)()
    assert defaults.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (defaults.r, defaults.alpha, defaults.reference) == (16, 32.0, "adapters_off")
    assert type(defaults)(target_modules="all-linear").target_modules == ["all-linear"]


@pytest.mark.parametrize(
    ("targets", "tied", "message"),
    [
        (["embed_tokens"], False, "matches model.embed_tokens, of type Embedding"),
        (["lm_head"], True, "matches lm_head, whose weight is tied to the input embeddings"),
        (["qkv_proj"], False, "matches no layer of LlamaForCausalLM"),
    ],
)
def test_adapters_go_on_untied_linear_layers_only(tiny_tokenizer, targets, tied, message):
    """An adapter on an embedding is not merged by pt-train, and a merged LM head tied to
    the embeddings would change them too: both are refused, as are names matching
    nothing; the hint lists the model's linear layers."""
    from pt_train.config import LoraSection
    from pt_train.lora import apply_lora
    from pt_train.model import build_llama

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=1, tie_word_embeddings=tied)
    with pytest.raises(ConfigError) as err:
        apply_lora(model, LoraSection(target_modules=targets), seed=0)
    assert message in str(err.value)
    if not tied:
        assert "q_proj" in err.value.hint and "default" not in err.value.hint
    untied = build_llama(tiny_tokenizer, hidden_size=128, num_layers=1)
    assert apply_lora(untied, LoraSection(target_modules=["lm_head"]), seed=0) is not None


# --------------------------------------------------------------------------- training


def test_only_the_adapters_train_and_the_inference_checkpoint_is_the_merged_model(
    world, tiny_tokenizer, tiny_tokenizer_dir
):
    """3 SFT steps at lr 1e-2 with adapters on q, v and the (fused) gate projection.

    - The full checkpoint holds the adapters and their AdamW state only: 2 layers x 3
      projections x (A, B) = 12 tensors, no base weight.
    - The inference checkpoint is a plain Llama checkpoint (the base model's names, shapes
      and config; what vLLM loads) whose untargeted tensors are the base's, bit for bit (the
      base is frozen), and whose targeted ones moved (the adapters trained, the MLP's too:
      fused ops leave an adapted MLP its own forward).
    - Its logits are the adapted model's (the base + the saved adapter, through peft) to
      1e-5, while they differ from the base's by far more: the merge W + (alpha/r) B A is
      the model that was trained.
    """
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir = run(world, "merged", tiny_tokenizer_dir, lora={})
    state = torch.load(run_dir / "checkpoints/step-3/plain/state.pt", weights_only=False)
    assert len(state["module"]) == 12
    assert all(".lora_A." in k or ".lora_B." in k for k in state["module"])
    assert len(state["optimizer"]["state"]) == 12

    inference = run_dir / "inference/step-3"
    merged = load_file(inference / "model.safetensors")
    base = base_model(tiny_tokenizer)
    base_state = base.state_dict()
    assert merged.keys() == base_state.keys()
    assert not (inference / "adapter_config.json").exists()  # HF would load it as an adapter
    assert json.loads((inference / "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"
    ]
    for key, value in merged.items():
        assert value.shape == base_state[key].shape, key
        if any(f"{name}.weight" in key for name in ADAPTED):
            assert not torch.equal(value, base_state[key]), f"{key} did not train"
        else:
            assert torch.equal(value, base_state[key]), f"{key} changed"

    ids = torch.tensor([list(range(5, 45))])
    merged_model = AutoModelForCausalLM.from_pretrained(inference).eval()
    adapted = PeftModel.from_pretrained(base_model(tiny_tokenizer), inference / "adapter").eval()
    # the saved adapter is the trained one
    saved = load_file(inference / "adapter/adapter_model.safetensors")
    trained = {k.replace(".default", ""): v for k, v in state["module"].items()}
    assert saved.keys() == trained.keys()
    assert all(torch.equal(saved[k], trained[k]) for k in saved)
    diff = (logits(merged_model, ids) - logits(adapted, ids)).abs().max().item()
    moved = (logits(merged_model, ids) - logits(base, ids)).abs().max().item()
    assert diff <= 1e-5
    assert moved > 1e-2


def reference_sections(world: Path, objective: str) -> dict:
    if objective == "dpo":
        return {
            "objective": {"name": "dpo", "beta": 0.5},
            "data": {"path": str(world / "pairs.jsonl")},
        }
    if objective in ("kto", "orpo"):
        return {
            "objective": {"name": objective, "beta": 0.5},
            "data": {"path": str(world / "pairs.jsonl")},
        }
    if objective == "asft":
        return {"objective": {"name": "asft", "kl_coef": 1.0}}
    # GRPO on the online loop, generating in-process with the adapted policy; a reward the
    # untrained model earns for some samples of a group and not others: the share of even
    # token ids in the completion
    (world / "lora_reward.py").write_text(
        "def reward(rows):\n"
        "    ids = [r['completion_token_ids'] for r in rows]\n"
        "    return [sum(t % 2 == 0 for t in c) / max(len(c), 1) for c in ids]\n"
    )
    return {
        "objective": {"name": "grpo", "beta": 0.5},
        "reward": {"function": "lora_reward:reward"},
        "rollout": {"prompts": str(world / "prompts.jsonl"), "samples_per_prompt": 4,
                    "max_tokens": 8},
    }  # fmt: skip


@pytest.mark.parametrize(
    "objective", ["dpo", "kto", "asft", pytest.param("grpo", marks=pytest.mark.slow)]
)
def test_the_adapters_off_reference_gives_the_losses_of_a_frozen_copy(
    world, tiny_tokenizer_dir, objective, monkeypatch
):
    """DPO's and KTO's reference, ASFT's anchor and GRPO's KL reference are the policy's
    starting weights. With LoRA those are the base model, i.e. the policy with its adapters
    disabled: 3 steps with that reference and 3 with a second, frozen copy of the model give
    the same losses (1e-6). The adapters move after step 1, so from step 2 on the policy is
    not its reference: a reference that were the adapted policy would give DPO's log 2,
    KTO's 0.5 (every log-ratio 0, each completion's value s(0) = 1/2 of its weight 1) and a
    zero KL (ASFT, GRPO)."""
    sections = reference_sections(world, objective)
    monkeypatch.syspath_prepend(str(world))  # GRPO's reward module
    losses, records = {}, {}
    for reference in ("adapters_off", "copy"):
        name = f"{objective}-{reference}"
        run(world, name, tiny_tokenizer_dir, lora={"reference": reference}, **sections)
        records[reference] = read_metrics(world / "runs" / name)
        losses[reference] = [r["loss"] for r in records[reference]]
    assert losses["adapters_off"] == pytest.approx(losses["copy"], abs=1e-6)
    if objective in ("dpo", "kto"):
        at_reference = math.log(2) if objective == "dpo" else 0.5
        assert losses["copy"][0] == pytest.approx(at_reference, abs=1e-6)  # policy = reference
        assert abs(losses["copy"][-1] - at_reference) > 1e-3
    else:
        kl = {reference: [r["kl"] for r in records[reference]] for reference in records}
        assert kl["copy"][0] == pytest.approx(0.0, abs=1e-6)
        assert kl["copy"][-1] > 1e-5
        assert kl["adapters_off"] == pytest.approx(kl["copy"], abs=1e-6)


def test_orpo_trains_the_adapters(world, tiny_tokenizer_dir):
    """ORPO (no reference model) under LoRA: the full checkpoint holds the 12 adapter
    tensors only, and every B, zero at the start, has moved: ORPO's loss trained them."""
    run_dir = run(
        world, "orpo-lora", tiny_tokenizer_dir, lora={}, **reference_sections(world, "orpo")
    )
    state = torch.load(run_dir / "checkpoints/step-3/plain/state.pt", weights_only=False)
    assert len(state["module"]) == 12
    assert all(".lora_A." in k or ".lora_B." in k for k in state["module"])
    b = [v for k, v in state["module"].items() if ".lora_B." in k]
    assert len(b) == 6 and all(v.abs().max() > 0 for v in b)


def test_adapters_off_loads_no_second_model(world, tiny_tokenizer_dir, monkeypatch):
    """The trainer's reference under LoRA is the policy itself (no parameters of its own);
    ``reference: copy`` loads a second model."""
    from pt_train.lora import AdaptersOff
    from pt_train.trainer import RANK_VARIABLES, Trainer

    for key in RANK_VARIABLES:  # a Trainer joins a one-rank job: undo it afterwards
        monkeypatch.setenv(key, "0")
        monkeypatch.delenv(key)
    sections = {"objective": {"name": "dpo"}, "data": {"path": str(world / "pairs.jsonl")}}

    def trainer(name, reference):
        lora = {"reference": reference}
        return Trainer(TrainConfig.model_validate(
            config(world, name, tiny_tokenizer_dir, lora=lora, **sections)
        ))  # fmt: skip

    shared = trainer("shared", "adapters_off")
    assert isinstance(shared.reference, AdaptersOff)
    assert shared.reference.model is shared.engine.module
    copy = trainer("copied", "copy")
    assert isinstance(copy.reference, torch.nn.Module)
    assert copy.reference is not copy.engine.module


# --------------------------------------------------------------------------- the CLI


def pt_train(*args, **kwargs):
    bindir = os.path.dirname(sys.executable)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [os.path.join(bindir, "pt-train"), *map(str, args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "model.lora.target_modules=[qkv_proj]",
            "model.lora.target_modules=['qkv_proj'] matches no layer of LlamaForCausalLM",
        ),
        ("model.lora.r=0", "model.lora.r"),
        ("model.lora.target_modules=[]", "model.lora.target_modules"),
    ],
)
def test_bad_lora_config_exits_2_with_one_error_line(
    world, tiny_tokenizer_dir, tmp_path, override, message
):
    import yaml

    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config(world, "bad", tiny_tokenizer_dir, lora={})))
    proc = pt_train("run", path, override, f"output_dir={tmp_path}")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err and out == ""


STEPS = 8
LAYOUTS = {
    "plain": [],
    "zero2": ["deepspeed.zero_stage=2"],
    "zero3": ["deepspeed.zero_stage=3", "launcher.nproc=2", "training.micro_batch_size=1"],
}


@pytest.fixture(scope="module")
def cli_config(world, tiny_tokenizer_dir):
    import yaml

    cfg = config(world, "unset", tiny_tokenizer_dir, lora={"dropout": 0.1}, training={
        "max_steps": STEPS, "save_steps": 2, "lr_schedule": "cosine", "weight_decay": 0.01,
    })  # fmt: skip
    path = world / "lora.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run_dir)]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_sigterm_then_resume_from_adapter_only_checkpoints_is_bit_exact(world, cli_config, layout):
    """An uninterrupted LoRA run (adapter dropout on, so the RNG matters) and one stopped by
    SIGTERM and rerun: the same losses and the same merged weights, bit for bit, the base
    having been built again from ``model.init`` at the restart, since the full checkpoints
    hold only the adapters' weights and optimizer state. Every layout trains the same
    model: its losses are the plain engine's to float rounding."""
    args = LAYOUTS[layout]
    uninterrupted, resumed = (
        world / "runs" / f"{layout}-whole",
        world / "runs" / f"{layout}-resumed",
    )
    proc = pt_train("run", cli_config, f"run_name={uninterrupted.name}", *args)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err

    proc = pt_train("run", cli_config, f"run_name={resumed.name}", *args)
    metrics = resumed / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    _, err = proc.communicate(timeout=900)
    assert proc.returncode == REQUEUE_EXIT_CODE, err
    stopped = (resumed / "checkpoints/latest").read_text().strip()
    assert int(stopped.split("-")[1]) < STEPS
    saved = sum(
        f.stat().st_size for f in (resumed / "checkpoints" / stopped).rglob("*") if f.is_file()
    )
    model_bytes = (uninterrupted / f"inference/step-{STEPS}/model.safetensors").stat().st_size
    assert saved < model_bytes / 4  # adapters (12 x 4 x 128..512 floats) and AdamW state only

    proc = pt_train("run", cli_config, f"run_name={resumed.name}", *args)
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    assert _losses(resumed) == _losses(uninterrupted)
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a = load_file(uninterrupted / f"inference/step-{STEPS}" / name)
        b = load_file(resumed / f"inference/step-{STEPS}" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    plain = world / "runs" / "plain-whole"
    if layout != "plain" and plain.exists():
        # One rank draws the plain engine's dropout masks; two ranks draw others, which
        # matter from step 2 on (at step 1, B = 0 and the adapters add nothing).
        compared = STEPS if layout == "zero2" else 1
        assert _losses(uninterrupted)[:compared] == pytest.approx(
            _losses(plain)[:compared], abs=1e-5
        )


@pytest.mark.slow
def test_zero3_on_two_ranks_with_the_adapters_off_reference_gives_one_ranks_losses(
    world, tiny_tokenizer_dir, tmp_path
):
    """DPO with LoRA under ZeRO-3 on two CPU ranks, the reference being the partitioned
    policy with its adapters off: the losses of one plain rank with a frozen copy (the same
    pairs per step, split over the ranks), to float rounding."""
    import yaml

    sections = {
        "objective": {"name": "dpo", "beta": 0.5},
        "data": {"path": str(world / "pairs.jsonl")},
    }
    one = run(world, "dpo-one-rank", tiny_tokenizer_dir, lora={"reference": "copy"}, **sections)
    path = tmp_path / "zero3.yaml"
    path.write_text(
        yaml.safe_dump(config(world, "dpo-zero3", tiny_tokenizer_dir, lora={}, **sections))
    )
    proc = pt_train(
        "run", path, "deepspeed.zero_stage=3", "launcher.nproc=2", "training.micro_batch_size=1"
    )
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, err
    zero3 = _losses(world / "runs" / "dpo-zero3")
    assert zero3 == pytest.approx(_losses(one), abs=1e-5)
    assert abs(zero3[-1] - math.log(2)) > 1e-3  # the policy has left its reference


# --------------------------------------------------------------------------- online


@pytest.mark.slow
def test_a_generator_process_pushed_the_merged_weights_generates_what_the_adapted_model_does(
    world, tiny_tokenizer, tiny_tokenizer_dir
):
    """OPD on the online loop, greedy, 3 rounds of one update each: generated in-process by
    the adapted policy, or by an HF generator process that is pushed the merged weights
    before every round. Every round's completions are the same token for token, and so are
    the losses; by the last round the adapters have changed what the model generates (the
    base model's greedy completions of its prompts differ), so the pushes carried them."""
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.hf import HFEngine

    teacher = world / "teacher"
    if not teacher.exists():
        from pt_train.model import build_llama

        build_llama(
            tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=1
        ).save_pretrained(teacher)
        tiny_tokenizer.save_pretrained(teacher)
    rollout = {"prompts": str(world / "prompts.jsonl"), "samples_per_prompt": 1, "max_tokens": 8,
               "temperature": 0.0}  # fmt: skip
    objective = {"name": "opd", "loss": "forward_kl", "teacher": {"path": str(teacher), "top_k": 4}}
    made = {}
    for generator in ("local", "server"):
        name = f"online-{generator}"
        run(world, name, tiny_tokenizer_dir, lora={}, objective=objective,
            rollout={**rollout, "generator": generator}, training={"learning_rate": 5e-2})  # fmt: skip
        made[generator] = [
            [json.loads(x) for x in (d / "rollouts.jsonl").read_text().splitlines()]
            for d in sorted((world / "runs" / name / "rounds").iterdir())
        ]
    assert len(made["local"]) == 3
    ids = {g: [[r["completion_token_ids"] for r in rows] for rows in made[g]] for g in made}
    assert ids["server"] == ids["local"]
    local, server = (_losses(world / "runs" / f"online-{g}") for g in ("local", "server"))
    assert server == pytest.approx(local, abs=1e-6)
    last = made["local"][-1]
    base = HFEngine(base_model(tiny_tokenizer), tokenizer=tiny_tokenizer, device="cpu")
    from_base = base.generate(
        [Request(r["prompt_token_ids"], 0) for r in last],
        SamplingParams(
            temperature=0.0, max_tokens=8, stop_token_ids=(tiny_tokenizer.eos_token_id,)
        ),
    )
    assert [c.token_ids for c in from_base] != ids["local"][-1]


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_loads_the_merged_checkpoint_and_generates_what_the_adapted_model_does(
    world, tiny_tokenizer, tiny_tokenizer_dir
):
    """The merged inference checkpoint of a LoRA run in vLLM: its greedy completions are the
    HF engine's on the adapted model (the base + the adapter, through peft)."""
    if not VLLM_PYTHON.exists():
        if os.environ.get("PT_REQUIRE_VLLM"):
            pytest.fail(f"{VLLM_PYTHON} missing; run .ci/setup-vllm.sh")
        pytest.skip(f"{VLLM_PYTHON} missing; run .ci/setup-vllm.sh")
    from peft import PeftModel

    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.hf import HFEngine
    from pt_rollout.serve import GeneratorSpec, RemoteGenerator

    inference = run(world, "for-vllm", tiny_tokenizer_dir, lora={}) / "inference/step-3"
    requests = [Request(tiny_tokenizer(f"What is {i} + {i}?")["input_ids"], 0) for i in range(4)]
    params = {"temperature": 0.0, "max_tokens": 12}
    spec = GeneratorSpec(model=str(inference), engine="vllm")
    with RemoteGenerator.start(spec, python=str(VLLM_PYTHON)) as gen:
        result = gen.wait(gen.submit_generate(requests, params))
    adapted = PeftModel.from_pretrained(base_model(tiny_tokenizer), inference / "adapter")
    hf = HFEngine(adapted.get_base_model(), tokenizer=tiny_tokenizer, device="cpu")
    expected = hf.generate(requests, SamplingParams(**params))
    assert [c["token_ids"] for c in result["completions"]] == [c.token_ids for c in expected]
