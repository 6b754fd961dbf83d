"""Training time a full checkpoint costs: synchronous saves against ``training.async_save``.

    uv run --no-sync python bench/checkpoint_save.py [--hidden 512] [--layers 8]
        [--saves 8] [--every 8] [--threads 1]

One process trains one run (a Llama of ``--hidden`` x ``--layers`` from random weights,
plain engine, fp32, CPU, AdamW) and saves a full checkpoint every ``--every`` steps,
alternating: synchronous, in the background, synchronous, ... (``--saves`` saves in
all). What a save costs the training thread:

- synchronous: the ``save_full`` call (write, fsync, rename, ``latest``);
- background: the ``save_full`` call (the copy into CPU memory), plus the time the
  steps that ran while the write went on took beyond a normal step (the write competes
  with them for the cores and the memory bus), plus any wait for the write before the
  next save (the loop waits before every save and books the wait to the save that
  caused it).

A normal step is the median of the steps that no write overlapped (after 4 warm-up
steps). Prints every save on stderr and one JSON line on stdout, last: the medians per
mode and ``ratio``, the median cost of a background save over that of a synchronous
one. Only ratios measured in one run mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def build(workdir: Path, args) -> Path:
    """A tokenizer, rows of random tokens and the config of the run."""
    import random

    import yaml

    from pt_data.tokenizer import build_tokenizer

    build_tokenizer(workdir / "tok")
    rng = random.Random(0)
    with open(workdir / "rows.jsonl", "w") as fh:
        for _ in range(256):
            ids = [rng.randrange(5, 300) for _ in range(args.seq)]
            fh.write(json.dumps({"input_ids": ids, "labels": ids}) + "\n")
    config = {
        "run_name": "bench",
        "output_dir": str(workdir / "runs"),
        "model": {
            "init": {
                "tokenizer": str(workdir / "tok"),
                "hidden_size": args.hidden,
                "num_layers": args.layers,
                "num_heads": args.hidden // 64,
            }
        },
        "data": {"path": str(workdir / "rows.jsonl")},
        "training": {
            "learning_rate": 1e-4,
            "global_batch_size": 2,
            "micro_batch_size": 2,
            "max_steps": (args.saves + 1) * args.every + 4,
            "async_save": True,
            "save_total_limit": 2,
        },
    }
    path = workdir / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--saves", type=int, default=8, help="saves in all, half each way")
    parser.add_argument("--every", type=int, default=8, help="steps between saves")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    import torch

    from pt_core.log import setup_logging
    from pt_train import checkpoint as ckpt
    from pt_train.config import load_train_config
    from pt_train.trainer import Trainer

    torch.set_num_threads(args.threads)
    setup_logging()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        cfg = load_train_config(build(Path(tmp), args))
        trainer = Trainer(cfg)
        saver = trainer.background
        trainer.engine.train()
        params = sum(p.numel() for p in trainer.engine.module.parameters())
        print(
            f"model: {params / 1e6:.1f} M parameters; a checkpoint holds weights and two "
            f"AdamW moments, {3 * 4 * params / 2**20:.0f} MiB",
            file=sys.stderr,
        )
        step_s: list[float] = []
        overlapped: list[bool] = []  # a write was in flight when the step started
        saves: list[dict] = []  # mode, at (the step it followed), call_s, wait_s
        for step in range(cfg.training.max_steps):
            overlapped.append(saver.writing)
            start = time.perf_counter()
            trainer.train_step(step)
            step_s.append(time.perf_counter() - start)
            trainer.step = step + 1
            if step < 4 or (step + 1 - 4) % args.every or len(saves) == args.saves:
                continue
            start = time.perf_counter()
            saver.wait()  # the background save before, if still writing: its cost
            if saves and saves[-1]["mode"] == "background":
                saves[-1]["wait_s"] = time.perf_counter() - start
            mode = "synchronous" if len(saves) % 2 == 0 else "background"
            start = time.perf_counter()
            ckpt.save_full(
                trainer.engine,
                trainer.run_dir,
                trainer.step,
                trainer.trainer_state(),
                trainer.env,
                cfg.training.save_total_limit,
                background=saver if mode == "background" else None,
            )
            saves.append(
                {
                    "mode": mode,
                    "at": trainer.step,
                    "call_s": time.perf_counter() - start,
                    "wait_s": 0.0,
                }
            )
        saver.finish()
        trainer.metrics.close()

    # Steps 1-4 warm up; step i (1-based) follows save "at" i - 1.
    normal = statistics.median(t for i, t in enumerate(step_s) if i >= 4 and not overlapped[i])
    for s in saves:
        during = []
        for i in range(s["at"], len(step_s)):
            if not overlapped[i]:
                break
            during.append(step_s[i])
        s["steps_during_write"] = len(during)
        s["extra_step_s"] = sum(t - normal for t in during)
        s["cost_s"] = s["call_s"] + s["wait_s"] + s["extra_step_s"]
        print(
            f"save at step {s['at']:3d} {s['mode']:>11}: {s['call_s']:.3f} s in the call, "
            f"{s['wait_s']:.3f} s waited for, {len(during)} steps during the write took "
            f"{s['extra_step_s']:+.3f} s beyond {normal:.3f} s each; cost {s['cost_s']:.3f} s",
            file=sys.stderr,
        )
    result = {"params_m": round(params / 1e6, 1), "normal_step_s": round(normal, 4)}
    for mode in ("synchronous", "background"):
        mine = [s for s in saves if s["mode"] == mode]
        for key in ("call_s", "wait_s", "extra_step_s", "cost_s"):
            result[f"{mode}_{key}"] = round(statistics.median(s[key] for s in mine), 4)
    result["ratio"] = round(result["background_cost_s"] / result["synchronous_cost_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
