"""Frozen reference losses: each objective's step-1 loss and gradient norm on a fixed model
and a fixed batch, stored here as numbers.

The other tests of an objective compare the trainer with a computation written in the
test; a change that moves both sides the same way (a shared helper, a new default) passes
them. These numbers were computed once through the public API (a run config,
``pt_train.trainer.train`` in-process, step 1 of ``metrics.jsonl``) and are compared to
1e-5 relative: a change to the model, the batch layout, a loss, its reduction or its
defaults shows here. When a change is meant to move one, compute it again and say why in
the commit.

The fixed model: ``model.init`` with seed 0 (the tiny Llama of the root conftest: hidden
128, 2 layers, the tiny tokenizer), in float32 on the CPU; the reference of ASFT and DPO
and the teacher of OPD: the same architecture with seed 1. The fixed batch: rows and pairs
of token ids from a linear congruential sequence (no RNG state), prompts written out.
"""

from __future__ import annotations

import json

import pytest

from pt_core.files import write_rows
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train

# objective -> (step-1 loss, step-1 gradient norm before clipping)
REFERENCE = {
    "sft": (6.156828193254368, 2.729771852493286),
    "dft": (0.013332556652766402, 0.006223943084478378),
    "asft": (0.018687302066433813, 0.012234269641339779),
    "dpo": (0.6920521855354309, 1.7998802661895752),
    "orpo": (6.230449676513672, 4.306971073150635),
    "kto": (0.49955374002456665, 0.45196929574012756),
    "opd": (0.004462260752916336, 0.05523042008280754),
    "grpo": (0.0, 1.577571988105774),
}


def token_ids(n: int, seed: int, length: tuple[int, int] = (8, 24)) -> list[list[int]]:
    """``n`` lists of ordinary token ids (5..299 of the tiny tokenizer's 462) of lengths in
    ``length``, from a linear congruential sequence."""
    out, x = [], seed
    for _ in range(n):
        x = (1103515245 * x + 12345) % 2**31
        size = length[0] + x % (length[1] - length[0])
        ids = []
        for _ in range(size):
            x = (1103515245 * x + 12345) % 2**31
            ids.append(5 + (x >> 8) % 295)
        out.append(ids)
    return out


def sft_rows() -> list[dict]:
    """8 rows; the first 2-5 tokens of each (its prompt) are not trained."""
    return [
        {"input_ids": ids, "labels": [-100] * (2 + i % 4) + ids[2 + i % 4 :]}
        for i, ids in enumerate(token_ids(8, seed=1))
    ]


def preference_pairs() -> list[dict]:
    """8 pairs: a prompt, a chosen and a rejected completion of different lengths."""
    prompts, chosen, rejected = (token_ids(8, seed=s, length=(3, 12)) for s in (2, 3, 4))
    return [
        {
            "prompt_input_ids": p,
            "chosen_input_ids": c,
            "chosen_labels": c,
            "rejected_input_ids": r,
            "rejected_labels": r,
        }
        for p, c, r in zip(prompts, chosen, rejected, strict=True)
    ]


PROMPTS = [
    {"id": i, "prompt": f"What is {i} plus {2 * i}?", "answer": str(3 * i)} for i in range(4)
]
# GRPO's reward: the share of even token ids in a completion, which differs between the
# untrained model's samples (its completions all run to max_tokens, so a reward of length or
# of a stated answer would be equal within every group, and the advantages 0).
REWARD = (
    "def reward(rows):\n"
    "    return [sum(t % 2 == 0 for t in r['completion_token_ids']) / len(r['completion_token_ids'])\n"
    "            for r in rows]\n"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """The data files, the seed-1 model and the reward module, in one directory."""
    from pt_train.model import build_llama

    root = tmp_path_factory.mktemp("reference-losses")
    write_rows(root / "rows.jsonl", sft_rows())
    write_rows(root / "pairs.jsonl", preference_pairs())
    write_rows(root / "prompts.jsonl", PROMPTS)
    other = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=1)
    other.save_pretrained(str(root / "seed1"))
    tiny_tokenizer.save_pretrained(str(root / "seed1"))
    (root / "frozen_reward.py").write_text(REWARD)
    return root


def config(root, tokenizer_dir, name: str) -> dict:
    """The run of objective ``name``: 8 rows (or pairs, or 4 prompts x 2 samples) in one
    optimizer step of one micro-batch."""
    seed1 = str(root / "seed1")
    online = {"prompts": str(root / "prompts.jsonl"), "samples_per_prompt": 2, "max_tokens": 8}
    sections = {
        "sft": {"objective": {"name": "sft"}, "data": {"path": str(root / "rows.jsonl")}},
        "dft": {"objective": {"name": "dft"}, "data": {"path": str(root / "rows.jsonl")}},
        "asft": {
            "objective": {"name": "asft", "kl_coef": 0.1, "reference": {"path": seed1}},
            "data": {"path": str(root / "rows.jsonl")},
        },
        "dpo": {
            "objective": {"name": "dpo", "beta": 0.1, "reference": {"path": seed1}},
            "data": {"path": str(root / "pairs.jsonl")},
        },
        "orpo": {
            "objective": {"name": "orpo", "beta": 0.1},
            "data": {"path": str(root / "pairs.jsonl")},
        },
        "kto": {
            "objective": {"name": "kto", "beta": 0.1, "reference": {"path": seed1}},
            "data": {"path": str(root / "pairs.jsonl")},
        },
        "opd": {
            "objective": {"name": "opd", "loss": "forward_kl", "teacher": {"path": seed1}},
            "rollout": {**online, "samples_per_prompt": 1},
        },
        "grpo": {
            "objective": {"name": "grpo"},
            "reward": {"function": "frozen_reward:reward"},
            "rollout": online,
        },
    }[name]
    rows = 4 if name == "opd" else 8
    return {
        "run_name": name,
        "output_dir": str(root / "runs"),
        "model": {"init": {"tokenizer": str(tokenizer_dir)}},
        **sections,
        "training": {
            "seed": 0,
            "learning_rate": 1e-3,
            "lr_schedule": "constant",
            "global_batch_size": rows,
            "micro_batch_size": rows,
            "max_steps": 1,
        },
    }


def step_one(root, tokenizer_dir, name: str, monkeypatch) -> tuple[float, float]:
    """Train objective ``name`` for one step in this process; its logged loss and gradient
    norm."""
    monkeypatch.syspath_prepend(str(root))  # the reward module, here and in grading workers
    monkeypatch.setenv("PYTHONPATH", str(root))
    cfg = TrainConfig.model_validate(config(root, tokenizer_dir, name))
    train(cfg)
    (record,) = read_metrics(cfg.run_dir)
    return record["loss"], record["grad_norm"]


def test_every_objective_of_the_registry_has_its_frozen_values():
    """A new objective gets its row here when it is added to the registry."""
    from pt_train.objectives import NAMES

    assert sorted(REFERENCE) == sorted(NAMES)


@pytest.mark.parametrize("name", list(REFERENCE))
def test_step_one_loss_and_gradient_norm_are_the_frozen_values(
    name, world, tiny_tokenizer_dir, monkeypatch
):
    loss, grad_norm = step_one(world, tiny_tokenizer_dir, name, monkeypatch)
    expected_loss, expected_grad_norm = REFERENCE[name]
    print(json.dumps({name: [loss, grad_norm]}))
    # abs=1e-7 for GRPO's loss, which is 0: on-policy (ratio 1) its completions all run
    # to max_tokens, so the token mean of the advantages is their mean, 0 in every group;
    # its gradient (REINFORCE's) is not 0.
    assert loss == pytest.approx(expected_loss, rel=1e-5, abs=1e-7)
    assert grad_norm == pytest.approx(expected_grad_norm, rel=1e-5, abs=1e-7)
