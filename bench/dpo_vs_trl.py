"""pt-train's DPO vs TRL's DPOTrainer: the same tiny Llama, pairs, beta and batch, on CPU.

    uv run --no-sync python bench/dpo_vs_trl.py [--steps 30] [--threads 2] [--repeats 3]

Both train a randomly initialised Llama (hidden 256, 4 layers, head_dim 64) with the
sigmoid DPO loss (beta 0.1) against a frozen copy of its starting weights, on the same
synthetic preference pairs: an arithmetic question, the worked solution with the right
answer (chosen) and with a wrong one (rejected). The pairs are tokenized once here the
way TRL tokenizes conversational pairs (chat template on the prompt with the generation
prompt, on prompt + completion, and the completion is what follows the common prefix), so
both trainers see the same tokens: pt-train reads them as tokenized pairs, TRL gets the
text and tokenizes it itself. 8 pairs per optimizer step, one micro-batch, ``--steps``
steps. Each trainer runs in its own process, ``--repeats`` times, alternating.

Throughput is pairs per second over the optimizer steps after the first (warm-up) one,
from each step's wall time. Peak RSS is the kernel's maximum resident set of the process
over its whole life, start-up and exit included (``wait4``).

Prints a table on stderr and one JSON line on stdout, last, with ``ratio`` (pt-train's
pairs/s over TRL's) and ``rss_ratio`` (pt-train's peak RSS over TRL's).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_vs_trl import (  # noqa: E402
    TRL_CPU_ARGS,
    bench_env,
    run_measured,
    step_timer,
    trl_child_cmd,
)

PAIRS_PER_STEP = 8
HIDDEN, LAYERS, HEADS = 256, 4, 4
BETA = 0.1
LR = 5e-6


def make_pairs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        terms = [rng.randint(1, 999) for _ in range(rng.randint(2, 6))]
        steps, total = [], terms[0]
        for t in terms[1:]:
            steps.append(f"{total} + {t} = {total + t}")
            total += t
        wrong = total + rng.choice([-1, 1]) * rng.randint(1, 20)
        work = "We add one term at a time. " + ". ".join(steps)
        question = "What is " + " + ".join(map(str, terms)) + "?"
        pairs.append(
            {
                "prompt": [{"role": "user", "content": question}],
                "chosen": [{"role": "assistant", "content": f"{work}. The answer is {total}."}],
                "rejected": [{"role": "assistant", "content": f"{work}. The answer is {wrong}."}],
            }
        )
    return pairs


def tokenize_like_trl(tokenizer, pair: dict) -> dict:
    def ids(messages, generation_prompt=False):
        text = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    prompt = ids(pair["prompt"], generation_prompt=True)
    chosen = ids(pair["prompt"] + pair["chosen"])
    rejected = ids(pair["prompt"] + pair["rejected"])
    shared = 0
    while (
        shared < len(prompt)
        and chosen[shared] == prompt[shared]
        and rejected[shared] == prompt[shared]
    ):
        shared += 1
    c, r = chosen[shared:], rejected[shared:]
    return {
        "prompt_input_ids": prompt[:shared],
        "chosen_input_ids": c,
        "chosen_labels": c,
        "rejected_input_ids": r,
        "rejected_labels": r,
    }


def prepare(workdir: Path, steps: int) -> dict:
    from pt_data.tokenizer import build_tokenizer
    from pt_train.model import build_llama

    pairs = make_pairs(PAIRS_PER_STEP * steps)
    texts = [m["content"] for p in pairs[:400] for k in ("prompt", "chosen") for m in p[k]]
    tokenizer = build_tokenizer(workdir / "model", texts=texts)
    model = build_llama(tokenizer, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS, seed=0)
    model.save_pretrained(workdir / "model")
    with open(workdir / "pairs.jsonl", "w") as fh:
        for p in pairs:
            fh.write(json.dumps(p) + "\n")
    tokens = 0
    with open(workdir / "tokenized.jsonl", "w") as fh:
        for p in pairs:
            row = tokenize_like_trl(tokenizer, p)
            tokens += 2 * len(row["prompt_input_ids"]) + len(row["chosen_input_ids"])
            tokens += len(row["rejected_input_ids"])
            fh.write(json.dumps(row) + "\n")
    return {"params": sum(p.numel() for p in model.parameters()), "tokens": tokens}


def run_trl(workdir: Path, steps: int) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    model = AutoModelForCausalLM.from_pretrained(
        workdir / "model", dtype=torch.float32, attn_implementation="sdpa"
    )
    rows = [json.loads(x) for x in (workdir / "pairs.jsonl").read_text().splitlines()]
    dataset = datasets.Dataset.from_list(rows)
    step_times: list[float] = []

    config = DPOConfig(
        **TRL_CPU_ARGS,
        output_dir=str(workdir / "trl"),
        max_steps=steps,
        per_device_train_batch_size=PAIRS_PER_STEP,
        gradient_accumulation_steps=1,
        learning_rate=LR,
        lr_scheduler_type="constant",
        beta=BETA,
        loss_type=["sigmoid"],
        max_length=None,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=10,
        precompute_ref_log_probs=False,
    )
    trainer = DPOTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_timer(step_times)],
    )
    trainer.train()
    return {"step_times": step_times}


def write_pt_train_config(workdir: Path, steps: int) -> Path:
    import yaml

    config = {
        "run_name": "pt-train",
        "output_dir": str(workdir / "runs"),
        "model": {"name_or_path": str(workdir / "model"), "attn_implementation": "sdpa"},
        "data": {"path": str(workdir / "tokenized.jsonl"), "shuffle": False},
        "objective": {"name": "dpo", "beta": BETA, "loss_type": "sigmoid"},
        "training": {
            "learning_rate": LR,
            "lr_schedule": "constant",
            "max_grad_norm": 1.0,
            "global_batch_size": PAIRS_PER_STEP,
            "micro_batch_size": PAIRS_PER_STEP,
            "max_steps": steps,
            "seed": 0,
        },
        "deepspeed": {"zero_stage": 0},
    }
    path = workdir / "pt-train.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def child_trl(workdir: Path, steps: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    result = run_trl(workdir, steps)
    result["training_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(which: str, workdir: Path, steps: int, threads: int) -> dict:
    env = bench_env(threads)
    if which == "trl":
        cmd = trl_child_cmd(__file__, workdir, steps, threads)
    else:
        config = write_pt_train_config(workdir, steps)
        shutil.rmtree(workdir / "runs" / "pt-train", ignore_errors=True)  # train, not resume
        cmd = [os.path.join(os.path.dirname(sys.executable), "pt-train"), "-q", "run", str(config)]
    code, out, err, peak = run_measured(cmd, env)
    if code != 0:
        raise RuntimeError(f"{which} failed:\n{err[-4000:]}")
    if which == "trl":
        result = json.loads(out.strip().splitlines()[-1])
    else:
        metrics = workdir / "runs" / "pt-train" / "metrics.jsonl"
        records = [json.loads(x) for x in metrics.read_text().splitlines()]
        result = {
            "step_times": [r["step_time_s"] for r in records],
            "training_peak_rss_mb": max(r["peak_memory_gb"] for r in records) * 1024,
            "final_accuracy": records[-1]["rewards/accuracies"],
        }
    times = result["step_times"][1:]
    result["pairs_per_s"] = PAIRS_PER_STEP * len(times) / sum(times)
    result["peak_rss_mb"] = peak
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each trainer")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--child", choices=["trl"], default=None)
    args = parser.parse_args()
    if args.child:
        child_trl(args.workdir, args.steps, args.threads)
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="dpo-vs-trl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    setup = prepare(workdir, args.steps)
    runs: dict[str, list[dict]] = {"trl": [], "pt-train": []}
    for _ in range(args.repeats):
        for which in runs:
            runs[which].append(measure(which, workdir, args.steps, args.threads))
    med = {
        w: {
            "pairs_per_s": statistics.median(r["pairs_per_s"] for r in rs),
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs),
            "training_peak_rss_mb": statistics.median(r["training_peak_rss_mb"] for r in rs),
            "every": [(r["pairs_per_s"], r["peak_rss_mb"]) for r in rs],
        }
        for w, rs in runs.items()
    }
    ratio = med["pt-train"]["pairs_per_s"] / med["trl"]["pairs_per_s"]
    rss_ratio = med["pt-train"]["peak_rss_mb"] / med["trl"]["peak_rss_mb"]
    lines = [
        f"model: Llama hidden {HIDDEN}, {LAYERS} layers, {setup['params'] / 1e6:.2f}M params; "
        f"{PAIRS_PER_STEP} pairs per step, {setup['tokens'] / (PAIRS_PER_STEP * args.steps):.0f} "
        f"tokens per pair (prompt counted twice), sigmoid DPO beta {BETA}, {args.steps} steps, "
        f"{args.threads} threads, median of {args.repeats} runs each",
        f"{'':10} {'pairs/s':>9} {'peak RSS MB':>12}   every run",
    ]
    for name, key in (("TRL", "trl"), ("pt-train", "pt-train")):
        r = med[key]
        every = ", ".join(f"{p:.1f} pairs/s {m:.0f} MB" for p, m in r["every"])
        lines.append(f"{name:10} {r['pairs_per_s']:>9.1f} {r['peak_rss_mb']:>12.0f}   {every}")
    lines.append(f"ratio pt-train / TRL pairs/s: {ratio:.2f}")
    lines.append(f"ratio pt-train / TRL peak RSS: {rss_ratio:.3f}")
    print("\n".join(lines), file=sys.stderr)
    print(
        json.dumps(
            {
                "trl_pairs_per_s": round(med["trl"]["pairs_per_s"], 2),
                "pt_train_pairs_per_s": round(med["pt-train"]["pairs_per_s"], 2),
                "trl_peak_rss_mb": round(med["trl"]["peak_rss_mb"]),
                "pt_train_peak_rss_mb": round(med["pt-train"]["peak_rss_mb"]),
                "ratio": round(ratio, 3),
                "rss_ratio": round(rss_ratio, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
