"""What :func:`pt_train.checkpoint.gathered_weights` hands out under ZeRO-3 on one rank,
against what the model has without ZeRO: for each model given, the pairs' names and
values, and how much of the model was gathered when each pair was handed out
(test_pt_train_colocate.py runs it in a process of its own, as DeepSpeed joins a process
group).

    python zero3_gathered_weights.py OUT.json MODEL_DIR[:lora|:dora] ...

OUT.json gets, per model: ``names`` (the pairs', in order), ``plain_names`` (the state
dict of the model without ZeRO, merged for LoRA), ``consolidated_names`` (what
``gathered_state_dict`` gives under ZeRO-3), ``max_abs_diff`` (pairs against the plain
state dict), ``gathered`` (the elements of the parameters gathered as each pair was
handed out), ``total`` (the model's elements) and ``largest_block`` (the elements of its
largest decoder layer or embedding).
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main() -> None:
    out, *models = sys.argv[1:]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from pt_train.distributed import init_distributed

    init_distributed("gloo")
    report = {spec: one_model(spec) for spec in models}
    with open(out, "w") as fh:
        json.dump(report, fh)


def one_model(spec: str) -> dict:
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from transformers import AutoModelForCausalLM

    from pt_train.checkpoint import gathered_state_dict, gathered_weights
    from pt_train.config import LoraSection
    from pt_train.lora import apply_lora, merged_state_dict

    path, _, variant = spec.partition(":")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if variant:
        lora = LoraSection(
            r=4, target_modules=["q_proj", "v_proj", "up_proj"], use_dora=variant == "dora"
        )
        model = apply_lora(model, lora, seed=0)
        with torch.no_grad():  # peft starts B at zero: give the merge something to add
            for name, param in model.named_parameters():
                if ".lora_B." in name:
                    param.normal_(std=0.1)
    plain = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if variant:
        plain = merged_state_dict(model, plain)
    blocks: dict[str, int] = {}  # decoder layer "i" or parameter name -> elements
    for name, param in model.named_parameters():
        block = name.split(".layers.")[1].split(".")[0] if ".layers." in name else name
        blocks[block] = blocks.get(block, 0) + param.numel()
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters()),
        config={"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}},
    )
    params = list(engine.module.parameters())
    names, gathered, diff = [], [], 0.0
    for name, tensor in gathered_weights(engine, 3, on_device=True):
        names.append(name)
        gathered.append(
            sum(p.ds_numel for p in params if p.ds_status != ZeroParamStatus.NOT_AVAILABLE)
        )
        diff = max(diff, float((tensor - plain[name]).abs().max()))
    consolidated = gathered_state_dict(engine, 3)
    assert consolidated is not None
    return {
        "names": names,
        "plain_names": list(plain),
        "consolidated_names": list(consolidated),
        "max_abs_diff": diff,
        "gathered": gathered,
        "total": sum(p.ds_numel for p in params),
        "largest_block": max(blocks.values()),
    }


if __name__ == "__main__":
    main()
