"""The trainer's logged loss and its gradients, against references computed here.

These run the real trainer (DeepSpeed, one CPU rank) in-process on a tiny Llama.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from pt_core.files import write_rows as pt_write_rows
from pt_train.config import TrainConfig
from pt_train.metrics import read_metrics
from pt_train.trainer import train


def make_config(tmp_path, tokenizer_dir, data_path, objective="sft", **training) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "run_name": "run",
            "output_dir": str(tmp_path),
            "model": {
                "init": {
                    "tokenizer": str(tokenizer_dir),
                    "hidden_size": 128,
                    "num_layers": 2,
                    "num_heads": 2,
                }
            },
            "data": {"path": str(data_path), "shuffle": True},
            "objective": {"name": objective} if isinstance(objective, str) else objective,
            "training": {"seed": 0, "lr_schedule": "constant", **training},
        }
    )


def write_rows(path, rows):
    with open(path, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    return path


@pytest.mark.parametrize("loss", ["sft", "dft"])
def test_step_one_loss_with_lr_zero_equals_the_reference(
    tmp_path, tiny_tokenizer, tiny_tokenizer_dir, loss
):
    """With lr=0 the first logged loss is the loss of the freshly initialised model,
    which we recompute here from the same seed with plain torch ops."""
    from pt_train.model import build_llama

    ids = tiny_tokenizer("Solve for n: 3n + 4 = 19, so 3n = 15 and n = 5.")["input_ids"]
    labels = [-100] * 6 + ids[6:]  # a prompt of 6 tokens carries no loss
    # laid out as pt-data writes a dataset: <dir>/train/part-00000.parquet
    data = tmp_path / "dataset"
    row = {"input_ids": ids, "labels": labels, "position_ids": list(range(len(ids)))}
    pt_write_rows(data / "train" / "part-00000.parquet", [{**row, "seq_lens": [len(ids)]}])
    cfg = make_config(
        tmp_path, tiny_tokenizer_dir, data, objective=loss, learning_rate=0.0,
        global_batch_size=1, micro_batch_size=1, max_steps=1,
    )  # fmt: skip
    train(cfg)
    logged = read_metrics(tmp_path / "run")[0]["loss"]

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)  # position t predicts token t + 1
    trained = [t for t in range(len(ids) - 1) if labels[t + 1] != -100]
    nll = torch.stack([-logp[t, ids[t + 1]] for t in trained])
    reference = nll.mean() if loss == "sft" else (torch.exp(-nll) * nll).mean()
    assert len(trained) == len(ids) - 6
    assert logged == pytest.approx(reference.item(), abs=1e-5)


def _varied_rows(tokenizer, n=16):
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        length = int(torch.randint(12, 40, (1,), generator=g))
        ids = torch.randint(5, len(tokenizer), (length,), generator=g).tolist()
        prompt = 3 + i % 5
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


def test_eight_micro_batches_of_one_equal_one_of_eight(
    tmp_path, tiny_tokenizer, tiny_tokenizer_dir
):
    """The loss is normalised by the trained tokens of the whole step, so accumulating
    8 micro-batches of 1 row gives the same losses and weights as 1 micro-batch of 8,
    although the rows have different lengths and numbers of trained tokens."""
    data = write_rows(tmp_path / "rows.jsonl", _varied_rows(tiny_tokenizer))
    runs = {}
    # (micro-batch, gradient checkpointing): recomputing activations changes no number either
    for micro, checkpointing in ((8, False), (1, False), (8, True)):
        name = f"micro{micro}-{checkpointing}"
        cfg = make_config(
            tmp_path / name, tiny_tokenizer_dir, data, learning_rate=1e-3,
            global_batch_size=8, micro_batch_size=micro, max_steps=3,
        )  # fmt: skip
        cfg.model.gradient_checkpointing = checkpointing
        train(cfg)
        run = tmp_path / name / "run"
        runs[micro, checkpointing] = (
            [r["loss"] for r in read_metrics(run)],
            load_file(run / "inference" / "step-3" / "model.safetensors"),
        )
    loss_8, weights_8 = runs[8, False]
    assert loss_8[0] != pytest.approx(loss_8[2], abs=1e-3)  # the model did learn
    for other in ((1, False), (8, True)):
        loss, weights = runs[other]
        assert loss == pytest.approx(loss_8, abs=1e-5)
        # The gradients agree to float32 rounding (~1e-7 relative: the layouts add the
        # same terms in another order); AdamW divides each update by sqrt(v), which for
        # the few weights whose gradient is near 0 turns that rounding into up to a few
        # percent of one step of lr 1e-3.
        for name, w in weights_8.items():
            torch.testing.assert_close(weights[name], w, atol=5e-5, rtol=0)
