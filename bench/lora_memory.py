"""Peak memory of LoRA training against full training, and of LoRA's two DPO references.

    uv run --no-sync python bench/lora_memory.py [--hidden 512] [--layers 4] [--vocab 32000]
        [--seq 512] [--steps 3] [--repeats 2]

One tiny Llama (``--hidden``, ``--layers``, head_dim 64, a ``--vocab``-row embedding and
LM head, untied), saved once; every run starts from it, each as its own process
(``python -m pt_train.cli run``), the variants alternating, ``--repeats`` times each:

- ``full``: SFT of every weight (AdamW keeps a gradient and two moments per weight);
- ``lora``: the same SFT steps with ``model.lora`` (r 16 on q, k, v, o): only the adapters
  have gradients and optimizer state;
- ``dpo_copy`` / ``dpo_adapters_off``: DPO with LoRA, the reference a second frozen copy
  of the model (``model.lora.reference: copy``) or the policy with its adapters disabled
  (the default).

Every step trains micro-batches of one ``--seq``-token row (DPO: pairs of about that
length). Peak memory is the kernel's maximum resident set of the process over its whole
life, read when this script reaps it (``wait4``); ``peak_memory_gb`` of the run's last
metrics line is printed too (on a GPU, CUDA's max allocated, which is what the variants
change there). Prints a table on stderr and one JSON line on stdout, last: the medians and
the ratios ``lora / full`` and ``dpo_adapters_off / dpo_copy``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LORA = {"r": 16, "alpha": 32, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
VARIANTS = ("full", "lora", "dpo_copy", "dpo_adapters_off")


def prepare(workdir: Path, args) -> None:
    from pt_data.tokenizer import build_tokenizer
    from pt_train.model import build_llama

    tokenizer = build_tokenizer(workdir / "model")
    model = build_llama(
        tokenizer,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.hidden // 64,
        vocab_size=args.vocab,
        seed=0,
    )
    model.save_pretrained(workdir / "model")
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f}M parameters", file=sys.stderr)
    rng = random.Random(0)
    with open(workdir / "rows.jsonl", "w") as fh:
        for _ in range(8):
            ids = [rng.randrange(5, args.vocab) for _ in range(args.seq)]
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * 16 + ids[16:]}) + "\n")
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    with open(workdir / "pairs.jsonl", "w") as fh:
        for i in range(8):
            text = " ".join(rng.choice(words) for _ in range(args.seq // 8))
            fh.write(json.dumps({"prompt": f"Question {i}?", "chosen": text,
                                 "rejected": text[::-1]}) + "\n")  # fmt: skip


def write_config(workdir: Path, name: str, variant: str, args) -> Path:
    import yaml

    model: dict = {"name_or_path": str(workdir / "model")}
    data = {"path": str(workdir / "rows.jsonl"), "shuffle": False, "max_seq_length": 2 * args.seq}
    objective = {"name": "sft"}
    if variant != "full":
        model["lora"] = dict(LORA)
    if variant.startswith("dpo"):
        model["lora"]["reference"] = "copy" if variant == "dpo_copy" else "adapters_off"
        data["path"] = str(workdir / "pairs.jsonl")
        objective = {"name": "dpo"}
    config = {
        "run_name": name,
        "output_dir": str(workdir / "runs"),
        "model": model,
        "data": data,
        "objective": objective,
        "training": {
            "learning_rate": 1e-4,
            "lr_schedule": "constant",
            "global_batch_size": 2,
            "micro_batch_size": 1,
            "max_steps": args.steps,
            "seed": 0,
        },
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(config: Path, run_dir: Path, threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PT_QUIET": "1"}
    cmd = [sys.executable, "-m", "pt_train.cli", "--quiet", "run", str(config)]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()[-3000:]}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "run_peak_memory_gb": records[-1]["peak_memory_gb"],
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in records[1:] or records),
        "losses": [r["loss"] for r in records],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    results: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="pt-bench-lora-") as tmp:
        workdir = Path(tmp)
        prepare(workdir, args)
        for repeat in range(args.repeats):
            for variant in VARIANTS:
                name = f"{variant}-{repeat}"
                config = write_config(workdir, name, variant, args)
                result = run(config, workdir / "runs" / name, args.threads)
                results[variant].append(result)
                print(
                    f"{name}: peak RSS {result['peak_rss_mb']:.0f} MB, run's peak "
                    f"{result['run_peak_memory_gb']:.3f} GB, {result['tokens_per_s']:.0f} tokens/s",
                    file=sys.stderr,
                )

    summary = {
        v: {
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in results[v]),
            "run_peak_memory_gb": statistics.median(r["run_peak_memory_gb"] for r in results[v]),
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results[v]),
        }
        for v in VARIANTS
    }
    ratios = {
        "lora_over_full": summary["lora"]["peak_rss_mb"] / summary["full"]["peak_rss_mb"],
        "dpo_adapters_off_over_copy": summary["dpo_adapters_off"]["peak_rss_mb"]
        / summary["dpo_copy"]["peak_rss_mb"],
    }
    dpo_diff = max(
        abs(a - b)
        for x, y in zip(results["dpo_copy"], results["dpo_adapters_off"], strict=True)
        for a, b in zip(x["losses"], y["losses"], strict=True)
    )
    print(
        f"\n{'variant':<18}{'peak RSS MB':>13}{'run peak GB':>13}{'tokens/s':>10}", file=sys.stderr
    )
    for v, s in summary.items():
        print(
            f"{v:<18}{s['peak_rss_mb']:>13.0f}{s['run_peak_memory_gb']:>13.3f}"
            f"{s['tokens_per_s']:>10.0f}",
            file=sys.stderr,
        )
    print(f"lora / full peak RSS: {ratios['lora_over_full']:.2f}", file=sys.stderr)
    print(
        f"DPO adapters_off / copy peak RSS: {ratios['dpo_adapters_off_over_copy']:.2f} "
        f"(losses differ by at most {dpo_diff:.1e})",
        file=sys.stderr,
    )
    print(
        json.dumps(
            {
                "hidden": args.hidden,
                "layers": args.layers,
                "vocab": args.vocab,
                "seq": args.seq,
                "steps": args.steps,
                "medians": summary,
                **ratios,
                "dpo_loss_max_abs_diff": dpo_diff,
            }
        )
    )


if __name__ == "__main__":
    main()
