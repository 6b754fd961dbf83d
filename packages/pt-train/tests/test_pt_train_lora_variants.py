"""LoRA variants through peft, as keys of ``model.lora``: DoRA (``use_dora``), rsLoRA
(``use_rslora``) and QLoRA (``load_in_4bit``, a 4-bit NF4 base through bitsandbytes) train,
resume exactly from adapter-only checkpoints (QLoRA: not yet bit-exact) and merge into a
plain full-precision checkpoint as LoRA does; QLoRA where it cannot work (no bitsandbytes, ZeRO stage > 0) is
refused with the config, with the reason and the fix."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pt_core.contracts import REQUEUE_EXIT_CODE

STEPS = 6
VARIANTS = {"dora": {"use_dora": True}, "rslora": {"use_rslora": True}}
ALL_CONFIGS = {**VARIANTS, "qlora": {"load_in_4bit": True}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_run_config, tiny_model_dir):
    root = tmp_path_factory.mktemp("lora-variants")
    with open(root / "rows.jsonl", "w") as fh:
        for i in range(24):
            ids = [5 + (i * 11 + j) % 250 for j in range(12 + i % 7)]
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * 3 + ids[3:]}) + "\n")
    for name, keys in ALL_CONFIGS.items():
        config = tiny_run_config(
            root / "runs", root / "rows.jsonl", {"name": "sft"},
            learning_rate=1e-2, global_batch_size=4, micro_batch_size=2, max_steps=STEPS,
            save_steps=2,
        )  # fmt: skip
        targets = ["q_proj", "v_proj", "gate_proj"]
        config["model"]["lora"] = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": targets}
        config["model"]["lora"].update(keys)
        if name == "qlora":  # a 4-bit base is quantized from pretrained weights (the same
            # as model.init's seed 0)
            config["model"] = {"name_or_path": str(tiny_model_dir), "lora": config["model"]["lora"]}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(config))
    return root


def losses(run_dir) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
@pytest.mark.parametrize("variant", list(ALL_CONFIGS))
def test_a_variant_trains_resumes_exactly_and_merges_into_a_plain_checkpoint(
    workdir, pt_train_run, tiny_tokenizer, variant
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from pt_train.model import build_llama

    config = workdir / f"{variant}.yaml"
    code, _, err = pt_train_run(config, f"{variant}-whole").finish()
    assert code == 0, err
    if variant == "qlora":
        assert "QLoRA: the base is loaded as 4-bit NF4 (bitsandbytes)" in err
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

    # The merged checkpoint is the adapted model: its logits are those of the full-precision
    # base with the saved adapter through peft, to float rounding (fp32 merged weights
    # against the same sums taken apart: ~1e-6 here), and far from the base's own. For QLoRA
    # too: the adapters merge into the base loaded again in full precision, never into its
    # 4-bit layers (which would round the merged weights to 4 bits: ~1e-1 apart here).
    inference = whole / f"inference/step-{STEPS}"
    assert "quantization_config" not in json.loads((inference / "config.json").read_text())
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


def test_qlora_without_bitsandbytes_is_refused_with_the_fix(
    tmp_path, tiny_run_config, tiny_model_dir, pt_train_in_process, monkeypatch
):
    """A 4-bit base needs bitsandbytes (here made unimportable): `pt-train check` refuses,
    naming the extra to install, before any work."""
    config = tiny_run_config(tmp_path / "runs", tmp_path, {"name": "sft"})
    config["model"] = {"name_or_path": str(tiny_model_dir), "lora": {"load_in_4bit": True}}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    code, _, err = pt_train_in_process("check", tmp_path / "train.yaml")
    err = " ".join(err.split())
    assert code == 2 and "Traceback" not in err
    assert err.count("error:") == 1 and "needs the bitsandbytes package" in err
    assert "fix: pip install 'pt-train[qlora]'" in err


@pytest.mark.parametrize(
    ("source", "deepspeed", "says"),
    [
        ("name_or_path", {"zero_stage": 2}, "deepspeed.zero_stage=2"),
        ("init", {}, "nothing to quantize"),
    ],
    ids=["zero2", "init"],
)
def test_qlora_where_it_cannot_work_is_refused_with_the_config(
    tmp_path, tiny_run_config, tiny_model_dir, pt_train_in_process, source, deepspeed, says
):
    """ZeRO partitions the weights, which a 4-bit base's packed ones cannot be; a random
    model.init has no pretrained weights to quantize. Both refused by `pt-train check`,
    one line with the fix."""
    config = tiny_run_config(tmp_path / "runs", tmp_path, {"name": "sft"})
    if source == "name_or_path":
        config["model"] = {"name_or_path": str(tiny_model_dir)}
    config["model"]["lora"] = {"load_in_4bit": True}
    config["deepspeed"] = deepspeed
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    code, _, err = pt_train_in_process("check", tmp_path / "train.yaml")
    err = " ".join(err.split())
    assert code == 2 and "Traceback" not in err
    assert err.count("error:") == 1 and "load_in_4bit (QLoRA)" in err and says in err
    assert "fix:" in err


def test_qlora_counts_the_models_parameters_not_their_packed_4bit_storage(
    tiny_model_dir, tiny_tokenizer, capsys
):
    """bitsandbytes stores a 4-bit weight packed, two values a byte (its tensor has half the
    weight's elements): the log's parameter total is the model's, the same as for LoRA on
    the full-precision base, and the adapters' count is the same too."""
    import re

    from pt_core.log import setup_logging
    from pt_train.config import ModelConfig
    from pt_train.model import load_model

    pytest.importorskip("bitsandbytes")
    setup_logging()
    counts = {}
    for four_bit in (False, True):
        lora = {
            "r": 4,
            "target_modules": ["q_proj", "v_proj", "gate_proj"],
            "load_in_4bit": four_bit,
        }
        cfg = ModelConfig.model_validate({"name_or_path": str(tiny_model_dir), "lora": lora})
        capsys.readouterr()
        load_model(cfg, tiny_tokenizer, dtype=torch.float32, seed=0, lora=cfg.lora)
        said = " ".join(capsys.readouterr().err.split())
        trained, total = re.search(r"(\d+) of (\d+) parameters train", said).groups()
        counts[four_bit] = (int(trained), int(total))
    assert counts[True] == counts[False]
