"""Print the DFT example's table and draw its curves: each method's accuracy on the narrow
task and off it, the mean and spread over seeds, at the end of fine-tuning and at every
snapshot on the way.

    python examples/dft-miniature/report.py dft-miniature-out --steps 80 --seeds "0 1 2" \
        --lrs "1e-4 3e-4"

Reads ``grades/<run>.jsonl`` (pt-eval grade's rows): ``start-0`` for the pretrained model,
``<method>-lr<lr>-s<seed>-<step>`` for a snapshot; a row's test set is its id's prefix.
Writes ``curves.png`` and ``summary.json`` (every figure of the table) into the output
directory.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rich.console import Console
from rich.table import Table

METHODS = (("sft", "SFT"), ("dft", "DFT"), ("asft", "ASFT"))
SETS = (  # (the ids' prefix, the column, what it measures)
    ("add3", "3-digit +", "the narrow task"),
    ("sub3", "3-digit -", "another operation"),
    ("arith4", "4-digit ±", "longer numbers"),
    ("arith", "2-digit ±", "the basics"),
)


def by_set(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Per test set: its problems, samples, and the share of samples graded correct (%)."""
    found: dict[str, list[dict]] = {prefix: [] for prefix, _, _ in SETS}
    for row in rows:
        prefix = row["id"].rsplit("-", 2)[0]
        if prefix not in found:
            raise ValueError(f"row id {row['id']!r} is of no test set ({', '.join(found)})")
        found[prefix].append(row)
    return {
        prefix: {"problems": len({r["id"] for r in got}), "samples": len(got),
                 "accuracy": 100 * sum(bool(r["correct"]) for r in got) / len(got) if got else 0.0}
        for prefix, got in found.items()
    }  # fmt: skip


def accuracies(out: Path, run: str) -> dict[str, float]:
    """Each test set's accuracy (%) of one model's graded samples."""
    path = out / "grades" / f"{run}.jsonl"
    rows = [json.loads(line) for line in path.read_text().split("\n") if line.strip()]
    return {prefix: s["accuracy"] for prefix, s in by_set(rows).items()}


def mean_sd(values: list[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation (0 for a single value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def collect(out: Path, steps: int, seeds: list[int], lr: str) -> dict:
    """Every accuracy at one learning rate: ``{"start": {set: acc}, method: {set: {step:
    [acc per seed]}}}``."""
    found: dict = {"start": accuracies(out, "start-0")}
    for method, _ in METHODS:
        runs = {k: [accuracies(out, f"{method}-lr{lr}-s{seed}-{k}") for seed in seeds]
                for k in (steps * j // 8 for j in (1, 2, 4, 8))}  # fmt: skip
        found[method] = {s: {k: [a[s] for a in got] for k, got in runs.items()} for s, _, _ in SETS}
    return found


def draw(found: dict[str, dict], steps: int, target: Path) -> None:
    """A row of panels per learning rate, a panel per test set: accuracy against
    fine-tuning steps, a line per method (the mean over seeds) and its band (lowest to
    highest seed), from the pretrained model at step 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(len(found), len(SETS), figsize=(4 * len(SETS), 3.2 * len(found)),
                             sharey=True, squeeze=False)  # fmt: skip
    for axes, (lr, at) in zip(grid, found.items(), strict=True):
        for ax, (s, label, what) in zip(axes, SETS, strict=True):
            for method, name in METHODS:
                xs = sorted(at[method][s])
                runs = [[at["start"][s]], *(at[method][s][k] for k in xs)]
                line = ax.plot([0, *xs], [sum(r) / len(r) for r in runs], marker="o", label=name)[0]
                ax.fill_between([0, *xs], [min(r) for r in runs], [max(r) for r in runs],
                                color=line.get_color(), alpha=0.2)  # fmt: skip
            ax.set_title(f"{label} ({what}), lr {lr}", fontsize=10)
            ax.set_xlim(0, steps)
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("held-out accuracy %")
    for ax in grid[-1]:
        ax.set_xlabel("fine-tuning step")
    grid[0][0].legend()
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, required=True, help="fine-tuning steps")
    parser.add_argument("--seeds", required=True, help="the seeds, space-separated")
    parser.add_argument("--lrs", required=True, help="the learning rates, space-separated")
    parser.add_argument("--seconds", type=int, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split()]
    found = {lr: collect(args.out, args.steps, seeds, lr) for lr in args.lrs.split()}
    start_rows = (args.out / "grades" / "start-0.jsonl").read_text().split("\n")
    counts = by_set([json.loads(line) for line in start_rows if line.strip()])["add3"]
    samples = counts["samples"] // max(counts["problems"], 1)

    console = Console()
    if not console.is_terminal:  # a file or pipe gets the table unwrapped
        console = Console(width=130)
    table = Table(
        title=f"accuracy %, after {args.steps} fine-tuning steps on 3-digit sums: mean ± s.d. "
        f"over seeds {', '.join(map(str, seeds))}; {counts['problems']} held-out problems a "
        f"set, {samples} sample{'' if samples == 1 else 's'} each"
    )
    table.add_column("model", no_wrap=True)
    for _, label, what in SETS:
        table.add_column(f"{label}\n{what}", justify="right")
    table.add_column("off the task\n(mean of 3)", justify="right")
    start = next(iter(found.values()))["start"]
    table.add_row("pretrained", *(f"{start[s]:.1f}" for s, _, _ in SETS),
                  f"{sum(start[s] for s, _, _ in SETS[1:]) / 3:.1f}")  # fmt: skip
    summary: dict = {"pretrained": start, "steps": args.steps, "seeds": seeds}
    for lr, at in found.items():
        for method, name in METHODS:
            final = {s: at[method][s][args.steps] for s, _, _ in SETS}
            off = [sum(final[s][i] for s, _, _ in SETS[1:]) / 3 for i in range(len(seeds))]
            cells = [f"{m:.1f} ± {sd:.1f}" for m, sd in (mean_sd(final[s]) for s, _, _ in SETS)]
            table.add_row(f"{name}, lr {lr}", *cells, "{:.1f} ± {:.1f}".format(*mean_sd(off)))
            summary[f"{method}@{lr}"] = {
                **{s: {"mean": mean_sd(v)[0], "sd": mean_sd(v)[1], "seeds": v}
                   for s, v in final.items()},
                "off_the_task": {"mean": mean_sd(off)[0], "sd": mean_sd(off)[1], "seeds": off},
            }  # fmt: skip
    console.print(table)
    draw(found, args.steps, args.out / "curves.png")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    console.print(f"curves: {args.out / 'curves.png'}")
    if args.seconds is not None:
        console.print(f"total time: {args.seconds // 60} min {args.seconds % 60} s")


if __name__ == "__main__":
    main()
