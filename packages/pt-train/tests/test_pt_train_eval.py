"""Evaluation during training: the held-out loss and greedy answers graded by pt-eval."""

from __future__ import annotations

import json

import pytest
import torch

from pt_core.files import write_rows
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train


def _rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, 300, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g)
        ids = ids.tolist()
        out.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    return out


@pytest.fixture
def dataset(tmp_path):
    write_rows(tmp_path / "data" / "train" / "part-00000.parquet", _rows(16, 0))
    write_rows(tmp_path / "data" / "validation" / "part-00000.parquet", _rows(5, 1))
    with open(tmp_path / "prompts.jsonl", "w") as fh:
        for i in range(3):
            fh.write(json.dumps({"id": i, "prompt": f"{i} + 1 =", "answer": str(i + 1)}) + "\n")
    return tmp_path


def config(root, tokenizer_dir, **eval_cfg) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "run_name": "run",
            "output_dir": str(root / "runs"),
            "model": {
                "init": {
                    "tokenizer": str(tokenizer_dir),
                    "hidden_size": 128,
                    "num_layers": 2,
                    "num_heads": 2,
                }
            },  # fmt: skip
            "data": {"path": str(root / "data")},
            "training": {
                "learning_rate": 1e-3,
                "global_batch_size": 4,
                "micro_batch_size": 2,
                "max_steps": 5,
                "logging_steps": 100,
                "lr_schedule": "constant",
            },  # fmt: skip
            "eval": eval_cfg,
        }
    )


def test_held_out_loss_is_logged_every_eval_steps_and_at_the_end(dataset, tiny_tokenizer_dir):
    train(config(dataset, tiny_tokenizer_dir, steps=2))
    records = read_metrics(dataset / "runs" / "run")
    # logging_steps 100: only the eval steps (2, 4) and the last one (5) are logged
    assert [r["step"] for r in records] == [2, 4, 5]
    assert all(r["eval_loss"] > 0 for r in records)


def test_the_held_out_loss_is_the_token_mean_over_the_validation_rows(dataset, tiny_tokenizer_dir):
    """With lr 0 the model stays at its initial weights, so the logged eval loss is the
    token-mean cross-entropy of the 5 validation rows under the freshly built model, which
    is computed here with plain transformers."""
    from transformers import AutoTokenizer

    from pt_core.files import iter_rows
    from pt_train.model import build_llama

    cfg = config(dataset, tiny_tokenizer_dir, steps=5)
    cfg.training.learning_rate = 0.0
    train(cfg)
    logged = read_metrics(dataset / "runs" / "run")[-1]["eval_loss"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    model = build_llama(tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    nll, count = 0.0, 0
    for row in iter_rows(dataset / "data" / "validation"):
        ids = torch.tensor([row["input_ids"]])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        for t in range(3, len(row["input_ids"])):  # labels start at position 3
            nll -= logp[t - 1, row["input_ids"][t]].item()
            count += 1
    assert logged == pytest.approx(nll / count, abs=1e-5)


def test_generation_eval_grades_greedy_answers(dataset, tiny_tokenizer_dir):
    train(
        config(
            dataset,
            tiny_tokenizer_dir,
            steps=5,
            generate={"prompts": str(dataset / "prompts.jsonl"), "max_tokens": 8},
        )  # fmt: skip
    )
    record = read_metrics(dataset / "runs" / "run")[-1]
    # an untrained model answers nothing right; what matters is that all 3 were graded
    assert record["eval_accuracy"] == 0.0
    assert record["eval_no_answer"] is not None and record["eval_generate_s"] > 0
