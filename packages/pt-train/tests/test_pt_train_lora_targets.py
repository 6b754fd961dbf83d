"""LoRA target names that match nothing are refused, with the closest layer names, rather
than training adapters on the other names without a word."""

from __future__ import annotations

import json

import pytest
import yaml

from pt_core.errors import ConfigError


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    from pt_train.model import build_llama

    return build_llama(tiny_tokenizer, hidden_size=128, num_layers=1)


@pytest.mark.parametrize(
    ("targets", "unmatched", "closest"),
    [
        # a typo among good names: q_proj alone would have trained
        (["q_proj", "v_prj"], ["v_prj"], "v_prj -> v_proj"),
        (["q_proj", "k_projj", "0_proj"], ["k_projj", "0_proj"], "k_projj -> k_proj"),
        # a dotted suffix is matched against the layers' dotted suffixes
        (["self_attn.q_proj", "mlp.up_prj"], ["mlp.up_prj"], "mlp.up_prj -> mlp.up_proj"),
    ],
)
def test_names_that_match_no_layer_are_refused_with_the_closest_layer_names(
    model, targets, unmatched, closest
):
    from pt_train.config import LoraSection
    from pt_train.lora import apply_lora

    with pytest.raises(ConfigError) as err:
        apply_lora(model, LoraSection(target_modules=targets), seed=0)
    assert err.value.message == (
        f"model.lora.target_modules={unmatched!r} matches no layer of LlamaForCausalLM"
    )
    assert err.value.hint.startswith(f"closest: {closest}")
    assert "(its linear layers: down_proj, gate_proj, k_proj, lm_head," in err.value.hint


def test_names_that_all_match_are_accepted(model):
    """The check is peft's own matching: a layer's last name, or its last dotted parts."""
    from pt_train.lora import check_target_names

    check_target_names(model, ["q_proj", "self_attn.v_proj", "layers.0.mlp.up_proj"])


def test_the_names_are_checked_on_the_skeleton_of_a_saved_model_without_its_weights(
    tiny_model_dir, tiny_tokenizer
):
    """A run checks the names before it loads the model or writes its directory: on the
    model built from its config on the meta device, which names the same layers."""
    from pt_train.config import LoraSection, ModelConfig
    from pt_train.model import check_lora_targets, model_skeleton

    model_cfg = ModelConfig(
        name_or_path=str(tiny_model_dir), lora=LoraSection(target_modules=["q_proj", "v_prj"])
    )
    skeleton = model_skeleton(model_cfg, tiny_tokenizer)
    assert {p.device.type for p in skeleton.parameters()} == {"meta"}
    with pytest.raises(ConfigError) as err:
        check_lora_targets(model_cfg, tiny_tokenizer)
    assert err.value.message == (
        "model.lora.target_modules=['v_prj'] matches no layer of LlamaForCausalLM"
    )
    assert err.value.hint.startswith("closest: v_prj -> v_proj")


@pytest.mark.slow
def test_pt_train_run_exits_2_with_one_error_line_and_the_fix(
    tmp_path, tiny_run_config, pt_train_run
):
    with open(tmp_path / "rows.jsonl", "w") as fh:
        for i in range(8):
            fh.write(
                json.dumps({"input_ids": list(range(5, 20 + i)), "labels": list(range(5, 20 + i))})
            )
            fh.write("\n")
    config = tiny_run_config(tmp_path / "runs", tmp_path / "rows.jsonl", {"name": "sft"})
    config["model"]["lora"] = {"r": 4, "target_modules": ["q_proj", "v_prj"]}
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))

    code, out, err = pt_train_run(tmp_path / "train.yaml", "typo").finish()

    assert code == 2 and out == "" and "Traceback" not in err
    assert "error: model.lora.target_modules=['v_prj'] matches no layer of LlamaForCausalLM" in err
    assert "fix: closest: v_prj -> v_proj" in err
    # refused before the run wrote anything: no run directory, nor the output_dir above it
    assert not (tmp_path / "runs").exists()
