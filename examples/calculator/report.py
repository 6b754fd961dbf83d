"""Print the calculator example's table: each model's accuracy on the held-out problems
(with its standard error), and, played in the tool environment, how often it called the
tool and how its calls went.

    python examples/calculator/report.py calculator-out [--seconds N]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

# (grades file, row label, what it is)
MODELS = (
    ("direct", "no tool", "SFT on the products answered directly, all its steps"),
    ("warm", "tool, warm", "SFT on the calculator traces, at the step GRPO starts from"),
    ("tool", "tool, SFT", "SFT on the calculator traces, all its steps"),
    ("grpo", "tool, GRPO", "the warm start + GRPO in the tool environment (pt-eval's grade)"),
)


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def summary(rows: list[dict]) -> dict:
    """Accuracy over the samples with its standard error; the share of episodes that called
    the tool, and the calls' errors and parse failures per episode (0 without the tool)."""
    n = len(rows)
    correct = sum(bool(r.get("correct")) for r in rows)
    p = correct / n
    return {
        "n": n,
        "accuracy": p,
        "stderr": math.sqrt(p * (1 - p) / n),
        "called": sum(r.get("tool_calls", 0) > 0 for r in rows) / n,
        "tool_errors": sum(r.get("tool_errors", 0) for r in rows) / n,
        "parse_failures": sum(r.get("parse_failures", 0) for r in rows) / n,
        "no_answer": sum(r.get("extracted") in (None, "") for r in rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, default=None)
    args = parser.parse_args()
    console = Console()
    found = {name: summary(read_rows(args.out / "grades" / f"{name}.jsonl"))
             for name, _, _ in MODELS if (args.out / "grades" / f"{name}.jsonl").exists()}  # fmt: skip
    some = next(iter(found.values()))
    table = Table(title=f"5-digit products, {some['n']} held-out samples each")
    for column in ("model", "accuracy", "± s.e.", "called", "tool errors", "parse failures",
                   "no answer"):  # fmt: skip
        table.add_column(column, justify="left" if column == "model" else "right")
    for name, label, _ in MODELS:
        s = found.get(name)
        if s is not None:
            table.add_row(label, f"{100 * s['accuracy']:.1f}%", f"{100 * s['stderr']:.1f}",
                          f"{100 * s['called']:.0f}%", f"{s['tool_errors']:.2f}",
                          f"{s['parse_failures']:.2f}", str(s["no_answer"]))  # fmt: skip
    console.print(table)
    for name, label, origin in MODELS:
        if name in found:
            console.print(f"  {label + ':':12} {origin}")
    console.print(
        "  called: the share of episodes with a call of the tool; tool errors and\n"
        "  parse failures: per episode"
    )
    rounds = read_rows(args.out / "runs" / "grpo" / "metrics.jsonl") if (
        args.out / "runs" / "grpo" / "metrics.jsonl").exists() else []  # fmt: skip
    rewards = [r["sampled_reward"] for r in rounds if r.get("sampled_reward") is not None]
    if len(rewards) >= 10:
        console.print(f"GRPO's reward on fresh problems: {sum(rewards[:5]) / 5:.2f} over its "
                      f"first 5 rounds, {sum(rewards[-5:]) / 5:.2f} over its last 5")  # fmt: skip
    if args.seconds is not None:
        console.print(f"total time: {args.seconds // 60} min {args.seconds % 60} s")


if __name__ == "__main__":
    main()
