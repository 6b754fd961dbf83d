"""pt-train vs TRL's SFTTrainer: the same tiny Llama, data and batch, on CPU.

    uv run --no-sync python bench/train_vs_trl.py [--steps 40] [--threads 2] [--repeats 3]

Both train a randomly initialised Llama (hidden 256, 4 layers, head_dim 64) on
the same synthetic arithmetic conversations, tokenized once with pt-data's
``tokenize_conversation`` (assistant-only loss), packed into rows of at most
256 tokens, 8 rows per step, for 40 steps. Each trainer runs in its own
process: TRL in a child of this script, pt-train as its CLI (``pt-train run``).
Throughput is non-padding tokens per second of the training steps after the
first (warm-up) one, measured the same way for both: the wall time of each
optimizer step and the tokens it consumed. Peak RSS is measured the same way
for both too: the kernel's maximum resident set of the process over its whole
life, start-up and exit included, read by this script when it reaps it. It
varies by a few percent from run to run (thread timing changes how the
C allocator fragments), so each trainer runs ``--repeats`` times, alternating
TRL and pt-train, and the table shows the median of each and every run's value.

Prints one table on stderr and one JSON line on stdout with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEQ_LEN = 256
MICRO_BATCH = 8
HIDDEN, LAYERS, HEADS = 256, 4, 4


def make_conversations(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        terms = [rng.randint(1, 999) for _ in range(rng.randint(2, 8))]
        steps, total = [], terms[0]
        for t in terms[1:]:
            steps.append(f"{total} + {t} = {total + t}")
            total += t
        question = "What is " + " + ".join(map(str, terms)) + "? Please reason step by step."
        answer = (
            "We add one term at a time. "
            + ". ".join(steps)
            + f". The answer is \\boxed{{{total}}}."
        )
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": question},
                    {"role": "assistant", "content": answer},
                ]
            }
        )
    return rows


def prepare(workdir: Path, steps: int) -> dict:
    """Tokenizer, model, conversations and their tokenization, written to ``workdir``."""
    from pt_data.tokenize import tokenize_conversation
    from pt_data.tokenizer import build_tokenizer
    from pt_train.model import build_llama

    conversations = make_conversations(60 * steps)
    tokenizer = build_tokenizer(
        workdir / "model", texts=[m["content"] for c in conversations[:500] for m in c["messages"]]
    )
    model = build_llama(tokenizer, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS, seed=0)
    model.save_pretrained(workdir / "model")
    with open(workdir / "conversations.jsonl", "w") as fh:
        for c in conversations:
            fh.write(json.dumps(c) + "\n")
    with open(workdir / "tokenized.jsonl", "w") as fh:
        for c in conversations:
            fh.write(json.dumps(tokenize_conversation(tokenizer, c["messages"])) + "\n")
    return {
        "conversations": len(conversations),
        "params": sum(p.numel() for p in model.parameters()),
    }


# --------------------------------------------------------------------------- the two runs


def run_trl(workdir: Path, steps: int) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    model = AutoModelForCausalLM.from_pretrained(
        workdir / "model", dtype=torch.float32, attn_implementation="sdpa"
    )
    rows = [json.loads(x) for x in (workdir / "tokenized.jsonl").read_text().splitlines()]
    dataset = datasets.Dataset.from_list(rows)  # input_ids + labels: used as they are
    step_times: list[float] = []
    step_tokens: list[int] = []

    class CountingSFT(SFTTrainer):
        def training_step(self, model, inputs, *args, **kwargs):
            mask = inputs.get("attention_mask")
            step_tokens.append(
                int(mask.sum()) if mask is not None else int(inputs["input_ids"].numel())
            )
            return super().training_step(model, inputs, *args, **kwargs)

    config = SFTConfig(
        **TRL_CPU_ARGS,
        output_dir=str(workdir / "trl"),
        max_steps=steps,
        per_device_train_batch_size=MICRO_BATCH,
        gradient_accumulation_steps=1,
        learning_rate=1e-4,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=10,
        packing=True,
        max_length=SEQ_LEN,
    )
    trainer = CountingSFT(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_timer(step_times)],
    )
    trainer.train()
    return {"step_times": step_times, "step_tokens": step_tokens}


def write_pt_train_config(workdir: Path, steps: int) -> Path:
    import yaml

    config = {
        "run_name": "pt-train",
        "output_dir": str(workdir / "runs"),
        "model": {"name_or_path": str(workdir / "model"), "attn_implementation": "sdpa"},
        "data": {"path": str(workdir / "conversations.jsonl"), "max_seq_length": SEQ_LEN},
        "objective": {"name": "sft"},
        "training": {
            "learning_rate": 1e-4,
            "lr_schedule": "cosine",
            "max_grad_norm": 1.0,
            "global_batch_size": MICRO_BATCH,
            "micro_batch_size": MICRO_BATCH,
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


# What every peer-vs-pt bench shares: TRL's trainers on the CPU without saving, logging
# backends, workers or bars; the environment of a measured process; the command of the TRL
# child; and a callback timing each optimizer step.
TRL_CPU_ARGS = dict(
    save_strategy="no",
    report_to=[],
    use_cpu=True,
    bf16=False,
    seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)


def bench_env(threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("CUDA_VISIBLE_DEVICES", "")
    return env


def trl_child_cmd(script: str, workdir: Path, steps: int, threads: int) -> list[str]:
    return [sys.executable, script, "--child", "trl", "--workdir", str(workdir),
            "--steps", str(steps), "--threads", str(threads)]  # fmt: skip


def step_timer(step_times: list[float]):
    """A TrainerCallback appending each optimizer step's wall time to ``step_times``."""
    from transformers import TrainerCallback

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_times.append(time.perf_counter() - self.t0)

    return Timer()


def run_measured(cmd: list[str], env: dict) -> tuple[int, str, str, float]:
    """Run ``cmd``; return its exit code, stdout, stderr and peak RSS in MB: the largest
    resident set of the process (or of any process it waited for) over its whole life,
    start-up and exit included, as the kernel reports it to the parent (wait4)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read(), usage.ru_maxrss / 1024


def measure(which: str, workdir: Path, steps: int, threads: int) -> dict:
    """One run of one trainer in its own process: per-step times and tokens, peak RSS."""
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
            "step_tokens": [r["tokens"] for r in records],
            # ru_maxrss of the process, logged after every step (the final saves excluded)
            "training_peak_rss_mb": max(r["peak_memory_gb"] for r in records) * 1024,
        }
    times, tokens = result["step_times"][1:], result["step_tokens"][1:]
    result["tokens_per_s"] = sum(tokens) / sum(times)
    result["steps"] = len(result["step_times"])
    result["tokens"] = sum(result["step_tokens"])
    result["peak_rss_mb"] = peak
    return result


def summarise(results: list[dict]) -> dict:
    """The median tokens/s and peak RSS of repeated runs, and every run's values."""
    return {
        "steps": results[0]["steps"],
        "tokens": results[0]["tokens"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in results),
        "training_peak_rss_mb": statistics.median(r["training_peak_rss_mb"] for r in results),
        "all_tokens_per_s": [r["tokens_per_s"] for r in results],
        "all_peak_rss_mb": [r["peak_rss_mb"] for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each trainer")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--child", choices=["trl"], default=None)
    args = parser.parse_args()
    if args.child:
        child_trl(args.workdir, args.steps, args.threads)
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="train-vs-trl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    setup = prepare(workdir, args.steps)  # the same data for both, made fresh every time
    runs: dict[str, list[dict]] = {"trl": [], "pt-train": []}
    for _ in range(args.repeats):
        for which in runs:
            runs[which].append(measure(which, workdir, args.steps, args.threads))
    trl, pt = summarise(runs["trl"]), summarise(runs["pt-train"])
    ratio = pt["tokens_per_s"] / trl["tokens_per_s"]
    lines = [
        f"model: Llama hidden {HIDDEN}, {LAYERS} layers, {setup['params'] / 1e6:.2f}M params; "
        f"seq len {SEQ_LEN}, micro-batch {MICRO_BATCH}, packing, assistant-only loss, "
        f"{args.steps} steps, {args.threads} threads, median of {args.repeats} runs each",
        f"{'':10} {'steps':>6} {'tokens':>8} {'tokens/s':>10} {'peak RSS MB':>12}   every run",
    ]
    for name, r in (("TRL", trl), ("pt-train", pt)):
        every = ", ".join(
            f"{t:.0f} tok/s {m:.0f} MB"
            for t, m in zip(r["all_tokens_per_s"], r["all_peak_rss_mb"], strict=True)
        )
        lines.append(
            f"{name:10} {r['steps']:>6} {r['tokens']:>8} {r['tokens_per_s']:>10.0f} "
            f"{r['peak_rss_mb']:>12.0f}   {every}"
        )
    lines.append(f"ratio pt-train / TRL tokens/s: {ratio:.2f}")
    lines.append(f"ratio pt-train / TRL peak RSS: {pt['peak_rss_mb'] / trl['peak_rss_mb']:.3f}")
    lines.append(
        f"peak RSS while training (median; each process's own reading, TRL's after "
        f"trainer.train(), pt-train's after its last step, before its final saves): "
        f"TRL {trl['training_peak_rss_mb']:.0f} MB, pt-train {pt['training_peak_rss_mb']:.0f} MB"
    )
    print("\n".join(lines), file=sys.stderr)
    print(
        json.dumps(
            {
                "trl_tokens_per_s": round(trl["tokens_per_s"], 1),
                "pt_train_tokens_per_s": round(pt["tokens_per_s"], 1),
                "ratio": round(ratio, 3),
                "trl_peak_rss_mb": round(trl["peak_rss_mb"], 1),
                "pt_train_peak_rss_mb": round(pt["peak_rss_mb"], 1),
                "trl_training_peak_rss_mb": round(trl["training_peak_rss_mb"], 1),
                "pt_train_training_peak_rss_mb": round(pt["training_peak_rss_mb"], 1),
                "trl_runs": [
                    [round(t), round(m)]
                    for t, m in zip(trl["all_tokens_per_s"], trl["all_peak_rss_mb"], strict=True)
                ],
                "pt_train_runs": [
                    [round(t), round(m)]
                    for t, m in zip(pt["all_tokens_per_s"], pt["all_peak_rss_mb"], strict=True)
                ],
                "workdir": str(workdir),
            }
        )
    )


if __name__ == "__main__":
    main()
