"""Rollout throughput: the vLLM engine against the HF engine on the same prompts.

    uv run --no-sync python bench/rollout.py                 # tiny model, vLLM-CPU vs HF
    uv run --no-sync python bench/rollout.py --model Qwen/Qwen2.5-0.5B-Instruct   # on a GPU

512 prompts of mixed lengths (8 to ~300 tokens), n=4 samples each at temperature 1.0,
64 new tokens. The HF engine runs in this process; the vLLM engine runs as
``pt-rollout generate --engine vllm`` in the interpreter given by --vllm-python (by default
the side environment .venv-vllm that .ci/setup-vllm.sh builds, or this interpreter when it
has vllm). Throughput is generated tokens per second of generation, engine start-up
excluded (it is printed separately as wall time).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    *[
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "lazy",
        "dog",
        "please",
        "reason",
        "step",
        "by",
        "step",
        "and",
        "put",
        "your",
    ],
    *[
        "final",
        "answer",
        "within",
        "boxed",
        "what",
        "is",
        "twelve",
        "plus",
        "thirty",
        "four",
        "we",
        "add",
        "tens",
        "ones",
    ],
    *[
        "compute",
        "seven",
        "times",
        "eight",
        "minus",
        "five",
        "first",
        "then",
        "train",
        "travels",
        "sixty",
        "miles",
    ],
]


def make_prompts(path: Path, count: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(count):
            length = int(rng.choice([8, 16, 32, 64, 128, 256]) * rng.uniform(0.5, 1.2))
            text = " ".join(rng.choice(WORDS) for _ in range(length))
            fh.write(json.dumps({"id": i, "prompt": text}) + "\n")


def tiny_model(path: Path) -> str:
    from pt_data.tokenizer import build_tokenizer
    from pt_train.model import build_llama

    tokenizer = build_tokenizer(path)
    build_llama(tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0).save_pretrained(
        str(path)
    )
    return str(path)


def vllm_python(arg: str | None) -> str | None:
    if arg:
        return arg
    side = REPO / ".venv-vllm" / "bin" / "python"
    if side.exists():
        return str(side)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def run_vllm(python: str, model: str, prompts: Path, out: Path, args) -> dict:
    cmd = [
        python, "-m", "pt_rollout.cli", "--quiet", "generate", "--engine", "vllm",
        "--model", model, "--prompts", str(prompts), "--out", str(out),
        "--n", str(args.n), "--max-tokens", str(args.max_tokens), "--temperature", "1.0",
        "--batch-size", str(args.batch_size),
    ]  # fmt: skip
    if args.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode:
        sys.exit(f"vLLM run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    manifest = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**manifest, "wall_s": wall}


def run_hf(model: str, prompts: Path, out: Path, args) -> dict:
    import torch

    from pt_rollout.generate import GenerateOptions, generate

    torch.set_num_threads(args.hf_threads)

    options = GenerateOptions(
        n=args.n,
        max_tokens=args.max_tokens,
        temperature=1.0,
        engine="hf",
        batch_size=args.batch_size,
    )
    started = time.perf_counter()
    manifest = generate(model, prompts, out, options)
    return {**manifest, "wall_s": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model dir or hub name (default: a tiny random Llama)")
    parser.add_argument("--prompts", type=int, default=512)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--vllm-python", help="interpreter with vllm (default .venv-vllm)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument(
        "--hf-threads",
        type=int,
        default=max(1, (os.cpu_count() or 2) - 1),
        help="torch threads of the HF engine (default: the cores vLLM-CPU computes on, "
        "which binds one OpenMP thread per core and keeps one core for itself)",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="pt-bench-rollout-") as tmp:
        tmp = Path(tmp)
        model = args.model or tiny_model(tmp / "model")
        prompts = tmp / "prompts.jsonl"
        make_prompts(prompts, args.prompts)
        results = {}
        python = vllm_python(args.vllm_python)
        if python is None:
            print("vllm: not installed (run .ci/setup-vllm.sh); measuring HF only", file=sys.stderr)
        else:
            results["vllm"] = run_vllm(python, model, prompts, tmp / "vllm.jsonl", args)
        if not args.skip_hf:
            results["hf"] = run_hf(model, prompts, tmp / "hf.jsonl", args)

    print(
        f"rollout bench: {args.prompts} prompts x n={args.n}, {args.max_tokens} new tokens, "
        f"model {args.model or 'tiny Llama (hidden 128, 2 layers)'}, HF on {args.hf_threads} "
        "thread(s)"
    )
    for name, r in results.items():
        print(
            f"  {name:5s} {r['tokens_per_s']:10.1f} tok/s  ({r['completion_tokens']} tokens, "
            f"{r['rows']} rows, wall {r['wall_s']:.1f} s incl. start-up)"
        )
    if "vllm" in results and "hf" in results:
        ratio = results["vllm"]["tokens_per_s"] / max(results["hf"]["tokens_per_s"], 1e-9)
        print(f"  vllm/hf throughput ratio: {ratio:.2f}x")


if __name__ == "__main__":
    main()
