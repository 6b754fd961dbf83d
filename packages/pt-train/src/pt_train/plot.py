"""`pt-train plot RUN_DIR`: loss and learning-rate curves from metrics.jsonl, as PNG."""

from __future__ import annotations

from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import atomic_path
from pt_train.metrics import read_metrics


def plot_run(run_dir: str | Path) -> list[Path]:
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise InputError(
            f"{run_dir}: no metrics.jsonl", hint="point at a run directory that pt-train wrote"
        )
    records = read_metrics(run_dir)
    if not records:
        raise InputError(f"{run_dir}/metrics.jsonl is empty; no step was logged yet")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    for key, ylabel in (("loss", "loss"), ("lr", "learning rate")):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([p[0] for p in points], [p[1] for p in points], lw=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{run_dir.name}: {ylabel}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = run_dir / f"{key}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
        plt.close(fig)
        out.append(path)
    return out
