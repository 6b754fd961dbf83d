"""LoRA variants through peft, as keys of ``model.lora``: DoRA (``use_dora``) and rsLoRA
(``use_rslora``) train, resume exactly from adapter-only checkpoints and merge into a
plain checkpoint as LoRA does; QLoRA (``load_in_4bit``) is refused with the config, with
the reason and the fix."""

from __future__ import annotations

import json
import signal
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pt_core.contracts import REQUEUE_EXIT_CODE

STEPS = 6
VARIANTS = {"dora": {"use_dora": True}, "rslora": {"use_rslora": True}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_run_config):
    root = tmp_path_factory.mktemp("lora-variants")
    with open(root / "rows.jsonl", "w") as fh:
        for i in range(24):
            ids = [5 + (i * 11 + j) % 250 for j in range(12 + i % 7)]
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * 3 + ids[3:]}) + "\n")
    for name, keys in VARIANTS.items():
        config = tiny_run_config(
            root / "runs", root / "rows.jsonl", {"name": "sft"},
            learning_rate=1e-2, global_batch_size=4, micro_batch_size=2, max_steps=STEPS,
            save_steps=2,
        )  # fmt: skip
        targets = ["q_proj", "v_proj", "gate_proj"]
        config["model"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": targets}
        config["model"]["lora"].update(keys)
        (root / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return root


def losses(run_dir) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_variant_trains_resumes_exactly_and_merges_into_a_plain_checkpoint(
    workdir, pt_train_run, tiny_tokenizer, variant
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from pt_train.model import build_llama

    config = workdir / f"{variant}.yaml"
    code, _, err = pt_train_run(config, f"{variant}-whole").finish()
    assert code == 0, err
    whole = workdir / "runs" / f"{variant}-whole"

    run = pt_train_run(config, f"{variant}-resumed")
    metrics = run.run_dir.parent / f"{variant}-resumed" / "metrics.jsonl"
    while run.proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            run.proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    code, _, err = run.finish()
    assert code == REQUEUE_EXIT_CODE, err
    resumed = metrics.parent
    stopped = (resumed / "checkpoints" / "latest").read_text().strip()
    assert int(stopped.split("-")[1]) < STEPS
    state = torch.load(resumed / "checkpoints" / stopped / "plain" / "state.pt", weights_only=False)
    assert all(".lora_" in k for k in state["module"])  # adapters only, no base weight
    if variant == "dora":  # the trained magnitudes, one per adapted layer
        assert sum(".lora_magnitude_vector." in k for k in state["module"]) == 2 * 3
    code, _, err = pt_train_run(config, f"{variant}-resumed").finish()
    assert code == 0, err

    assert losses(resumed) == losses(whole)
    for name in ("model.safetensors", "adapter/adapter_model.safetensors"):
        a = load_file(whole / f"inference/step-{STEPS}" / name)
        b = load_file(resumed / f"inference/step-{STEPS}" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name

    # The merged checkpoint is the adapted model: its logits are those of the base with the
    # saved adapter through peft, to float rounding, and far from the base's own.
    inference = whole / f"inference/step-{STEPS}"
    adapter_config = json.loads((inference / "adapter/adapter_config.json").read_text())
    assert adapter_config["use_dora"] == (variant == "dora")
    assert adapter_config["use_rslora"] == (variant == "rslora")
    base = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0).eval()
    ids = torch.tensor([list(range(5, 45))])
    base_logits = logits(base, ids)
    adapted = PeftModel.from_pretrained(base, inference / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(inference).eval()
    assert (logits(merged, ids) - logits(adapted, ids)).abs().max().item() <= 1e-5
    assert (logits(merged, ids) - base_logits).abs().max().item() > 1e-2


def test_rslora_scales_the_update_by_alpha_over_the_root_of_r(tiny_tokenizer):
    """Kalajdzievski 2023: alpha / sqrt(r) (8 / 2 = 4 at r 4), where LoRA has alpha / r (2)."""
    from pt_train.config import LoraSection
    from pt_train.lora import apply_lora, lora_layers
    from pt_train.model import build_llama

    def scaling(**keys) -> float:
        model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=1)
        lora = apply_lora(model, LoraSection(r=4, alpha=8, **keys), seed=0)
        return lora_layers(lora)["model.layers.0.self_attn.q_proj"].scaling["default"]

    assert scaling() == 2.0
    assert scaling(use_rslora=True) == 4.0


def test_dora_merge_scales_each_row_to_its_magnitude(tiny_tokenizer):
    """DoRA (Liu et al. 2024): W' = m * (W + s B A) / ||W + s B A|| per output row. With B
    and m set by hand the merged weight is that formula, and the merged layer computes what
    the adapted one does."""
    from pt_train.config import LoraSection
    from pt_train.lora import PEFT_PREFIX, apply_lora, lora_layers, merged_state_dict
    from pt_train.model import build_llama

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=1)
    lora = apply_lora(model, LoraSection(r=4, alpha=8, use_dora=True), seed=0)
    layer = lora_layers(lora)["model.layers.0.self_attn.q_proj"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.lora_B["default"].weight.copy_(torch.randn(128, 4, generator=generator) * 0.1)
        layer.lora_magnitude_vector["default"].weight.mul_(torch.linspace(0.5, 2.0, 128))
    state = {k: v.detach().clone() for k, v in lora.state_dict().items()}
    merged = merged_state_dict(lora, state)["model.layers.0.self_attn.q_proj.weight"]

    w = state[f"{PEFT_PREFIX}model.layers.0.self_attn.q_proj.base_layer.weight"]
    a = layer.lora_A["default"].weight
    b = layer.lora_B["default"].weight
    m = layer.lora_magnitude_vector["default"].weight
    direction = w + 2.0 * b @ a
    expected = m[:, None] * direction / direction.norm(dim=1, keepdim=True)
    assert torch.allclose(merged, expected, atol=1e-6)
    x = torch.randn(3, 128, generator=generator)
    with torch.no_grad():
        assert torch.allclose(x @ merged.T, layer(x), atol=1e-5)


def test_qlora_is_refused_with_the_config_saying_why(tmp_path, tiny_run_config, cli):
    """No bitsandbytes here (or no CUDA device for its 4-bit layers): `pt-train check`
    refuses, with the fix, before any work."""
    config = tiny_run_config(tmp_path / "runs", tmp_path, {"name": "sft"})
    config["model"]["lora"] = {"load_in_4bit": True}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    proc = cli("pt-train", "check", tmp_path / "train.yaml", check=False)
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in err
    assert err.count("error:") == 1 and "load_in_4bit (QLoRA)" in err
    assert "fix:" in err and "model.lora.load_in_4bit=false" in err
