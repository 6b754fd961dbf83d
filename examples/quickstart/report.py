"""Print the quickstart's table (base / SFT / DFT accuracy and pass@k on the test set) and draw
the two runs' loss curves into one PNG.

    python examples/quickstart/report.py quickstart-out [--seconds N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def load_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_losses(out: Path, runs: dict[str, Path]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = {"loss": "training loss (the run's own objective)"}
    if any("ce_loss" in row for run in runs.values() for row in load_metrics(run)):
        keys["ce_loss"] = "cross-entropy on trained tokens"
    fig, axes = plt.subplots(1, len(keys), figsize=(6 * len(keys), 4), squeeze=False)
    for ax, (key, title) in zip(axes[0], keys.items(), strict=True):
        for name, run in runs.items():
            rows = [r for r in load_metrics(run) if key in r]
            ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=name)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    target = out / "loss_curves.png"
    fig.savefig(target, dpi=120)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, default=None)
    args = parser.parse_args()

    console = Console()
    table = Table(title="Arithmetic test set (held-out problems)")
    table.add_column("model")
    summaries = {}
    for name in ("base", "sft", "dft"):
        path = args.out / f"grades-{name}.json"
        if path.exists():
            summaries[name] = json.loads(path.read_text().strip().splitlines()[-1])
    pass_keys = sorted(
        {k for s in summaries.values() for k in s.get("pass@k", {})}, key=lambda k: int(k)
    )
    table.add_column("accuracy", justify="right")
    for k in pass_keys:
        table.add_column(f"pass@{k}", justify="right")
    table.add_column("maj@n", justify="right")
    table.add_column("no answer", justify="right")
    for name, s in summaries.items():
        table.add_row(
            {"base": "untrained", "sft": "SFT", "dft": "DFT"}[name],
            f"{100 * s['accuracy']:.1f}%",
            *[f"{100 * s['pass@k'][k]:.1f}%" for k in pass_keys],
            f"{100 * s.get('maj@n', 0.0):.1f}%",
            str(s.get("no_answer", "")),
        )
    console.print(table)
    runs = {
        name: args.out / "runs" / name
        for name in ("sft", "dft")
        if (args.out / "runs" / name).exists()
    }
    png = plot_losses(args.out, runs)
    console.print(f"loss curves: {png}")
    if args.seconds is not None:
        console.print(f"total time: {args.seconds // 60} min {args.seconds % 60} s")


if __name__ == "__main__":
    main()
