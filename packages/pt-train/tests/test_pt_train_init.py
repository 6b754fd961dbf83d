"""`pt-train init`: the untrained model a run starts from, as a loadable checkpoint."""

from __future__ import annotations

import json

import torch
import yaml
from transformers import AutoModelForCausalLM


def test_init_writes_the_step_0_weights_of_the_run(cli, tmp_path, tiny_tokenizer_dir):
    config = tmp_path / "train.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "run_name": "r",
                "output_dir": str(tmp_path / "runs"),
                "model": {"init": {"tokenizer": str(tiny_tokenizer_dir), "hidden_size": 128}},
                "training": {"max_steps": 1, "seed": 3},
            }
        )
    )
    proc = cli("pt-train", "init", config)
    manifest = json.loads(proc.stdout)
    assert manifest["kind"] == "checkpoint" and manifest["step"] == 0
    assert manifest["path"] == str(tmp_path / "runs" / "r" / "inference" / "step-0")
    loaded = AutoModelForCausalLM.from_pretrained(manifest["path"])

    # The same seed gives the same weights as the model pt-train run starts from.
    from pt_train.config import load_train_config
    from pt_train.model import load_model, load_tokenizer

    cfg = load_train_config(config)
    expected = load_model(
        cfg.model, load_tokenizer(str(tiny_tokenizer_dir)), dtype=torch.float32, seed=3
    )
    for name, tensor in expected.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name
    other = cli("pt-train", "init", config, "training.seed=4", "--out", tmp_path / "seed4")
    reloaded = AutoModelForCausalLM.from_pretrained(json.loads(other.stdout)["path"])
    assert not torch.equal(reloaded.lm_head.weight, loaded.lm_head.weight)
