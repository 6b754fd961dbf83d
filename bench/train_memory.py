"""Peak memory of a training step with a large vocabulary: pt-train now vs an earlier commit.

    uv run --no-sync python bench/train_memory.py [--baseline 8e750c8] [--vocab 131072]
        [--seq 2048] [--repeats 2]

The model is a tiny Llama (hidden 128, 2 layers, head_dim 64) whose vocabulary is
``--vocab`` rows (128k by default, the size of Llama 3's), so the LM head and its logits
dominate: one row of ``--seq`` tokens, every token after the first 16 trained. Both
versions train it from the same saved weights for 2 steps (SFT, then DFT), each as its
own process (``python -m pt_train.cli run``) from its own source tree: the current
working tree, and ``--baseline`` checked out into a temporary git worktree. Peak memory is
the kernel's maximum resident set of the process over its whole life, read when this
script reaps it (``wait4``); the runs alternate, ``--repeats`` times each.

The baseline computed full ``[batch, seq, vocab]`` logits and a cross-entropy over them;
the current code applies the LM head to trained positions only, in checkpointed chunks
(``pt_train.logprobs``). The losses of the two must agree (they are the same formulas).

Prints a table on stderr and one JSON line on stdout, last: ``rss_ratio`` (current peak
over baseline peak, median, SFT) and ``loss_max_abs_diff`` over every logged loss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("pt-core", "pt-data", "pt-train")


def prepare(workdir: Path, vocab: int, seq: int) -> Path:
    import random

    from pt_data.tokenizer import build_tokenizer
    from pt_train.model import build_llama

    tokenizer = build_tokenizer(workdir / "model")
    model = build_llama(
        tokenizer, hidden_size=128, num_layers=2, num_heads=2, vocab_size=vocab, seed=0
    )
    model.save_pretrained(workdir / "model")
    rng = random.Random(0)
    ids = [rng.randrange(5, vocab) for _ in range(seq)]
    row = {"input_ids": ids, "labels": [-100] * 16 + ids[16:]}
    (workdir / "rows.jsonl").write_text(json.dumps(row) + "\n")
    return workdir / "model"


def write_config(workdir: Path, name: str, objective: str) -> Path:
    import yaml

    config = {
        "run_name": name,
        "output_dir": str(workdir / "runs"),
        "model": {"name_or_path": str(workdir / "model")},
        "data": {"path": str(workdir / "rows.jsonl"), "shuffle": False},
        # The key both versions read (the current one maps it to objective.name).
        "training": {
            "loss": objective,
            "learning_rate": 1e-4,
            "lr_schedule": "constant",
            "global_batch_size": 1,
            "micro_batch_size": 1,
            "max_steps": 2,
            "seed": 0,
        },
    }
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(source: Path, config: Path, run_dir: Path, threads: int) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(source / "packages" / p / "src") for p in PACKAGES),
        "OMP_NUM_THREADS": str(threads),
        "DS_ACCELERATOR": "cpu",
        "PT_QUIET": "1",
    }
    cmd = [sys.executable, "-m", "pt_train.cli", "--quiet", "run", str(config)]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        err.seek(0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()[-3000:]}")
    losses = [
        json.loads(line)["loss"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    return {"peak_rss_mb": usage.ru_maxrss / 1024, "losses": losses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="8e750c8")
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="pt-bench-memory-") as tmp:
        workdir = Path(tmp)
        baseline_tree = workdir / "baseline"
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(baseline_tree),
             args.baseline],
            check=True,
        )  # fmt: skip
        try:
            prepare(workdir, args.vocab, args.seq)
            results: dict[tuple[str, str], list[dict]] = {}
            for objective in ("sft", "dft"):
                for repeat in range(args.repeats):
                    for which, source in (("baseline", baseline_tree), ("current", REPO)):
                        name = f"{which}-{objective}-{repeat}"
                        config = write_config(workdir, name, objective)
                        result = run(source, config, workdir / "runs" / name, args.threads)
                        results.setdefault((which, objective), []).append(result)
                        print(
                            f"{name}: peak RSS {result['peak_rss_mb']:.0f} MB, "
                            f"losses {result['losses']}",
                            file=sys.stderr,
                        )
        finally:
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline_tree)],
                check=False,
            )

    summary = {}
    diffs = []
    for objective in ("sft", "dft"):
        peaks = {w: statistics.median(r["peak_rss_mb"] for r in results[w, objective])
                 for w in ("baseline", "current")}  # fmt: skip
        for a, b in zip(results["baseline", objective], results["current", objective], strict=True):
            diffs += [abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True)]
        summary[objective] = {**peaks, "ratio": peaks["current"] / peaks["baseline"]}
    print(
        f"\nvocab {args.vocab}, one row of {args.seq} tokens; median peak RSS of the process\n"
        f"{'objective':<10}{'baseline MB':>14}{'current MB':>14}{'current/baseline':>20}",
        file=sys.stderr,
    )
    for objective, s in summary.items():
        print(
            f"{objective:<10}{s['baseline']:>14.0f}{s['current']:>14.0f}{s['ratio']:>20.2f}",
            file=sys.stderr,
        )
    print(f"largest difference between the versions' losses: {max(diffs):.2e}", file=sys.stderr)
    print(
        json.dumps(
            {
                "vocab": args.vocab,
                "seq": args.seq,
                "baseline": args.baseline,
                "peaks_mb": summary,
                "rss_ratio": summary["sft"]["ratio"],
                "dft_rss_ratio": summary["dft"]["ratio"],
                "loss_max_abs_diff": max(diffs),
            }
        )
    )


if __name__ == "__main__":
    main()
