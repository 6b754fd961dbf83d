"""`pt-train plot`: curves of metrics.jsonl keys against step, as PNG, for one run or several.

pt-train plot runs/sft                          # runs/sft/loss.png and runs/sft/lr.png
pt-train plot runs/sft runs/dft --out cmp.png   # one panel per key, one line per run
pt-train plot runs/sft runs/dft --out cmp.png --key loss --key grad_norm
pt-train plot runs/grpo --key sampled_reward --smooth 10   # and a running mean of 10 steps
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

from pt_core.errors import InputError
from pt_core.files import atomic_path
from pt_core.log import get_logger
from pt_train.metrics import read_metrics

log = get_logger(__name__)

DEFAULT_KEYS = ("loss", "lr")
LABELS = {"loss": "loss", "lr": "learning rate"}


def plot_metrics(
    run_dirs: Sequence[str | Path],
    out: str | Path | None = None,
    keys: tuple[str, ...] = DEFAULT_KEYS,
    smooth: int = 0,
) -> list[Path]:
    """What ``pt-train plot`` draws: with ``out``, one figure comparing the runs; without,
    one PNG per key in the (single) run directory. ``smooth`` > 1 draws each line faint
    with its running mean over that many points on top. Returns the files written."""
    keys = tuple(dict.fromkeys(keys))  # a key given twice is drawn once
    if smooth < 0:
        raise InputError(
            f"--smooth {smooth} is negative", hint="give a number of points, 0 or more"
        )
    if out is not None:
        return [plot_runs(run_dirs, out, keys, smooth)]
    if len(run_dirs) > 1:
        raise InputError(
            f"{len(run_dirs)} runs to compare, and no --out",
            hint="pass --out FILE.png: one figure with a line per run",
        )
    return plot_run(run_dirs[0], keys, smooth)


def plot_run(
    run_dir: str | Path, keys: tuple[str, ...] = DEFAULT_KEYS, smooth: int = 0
) -> list[Path]:
    """One PNG per key in ``run_dir`` (``RUN_DIR/<key>.png``); keys the run did not log are
    skipped."""
    run = Path(run_dir)
    series = load_series([run], keys)
    out = []
    for key in keys:
        if key not in series[run]:
            continue
        path = run / f"{_file_name(key)}.png"
        _draw(path, [key], {run: series[run]}, title=f"{run.name}: ", smooth=smooth)
        out.append(path)
    return out


def plot_runs(
    run_dirs: Sequence[str | Path], out: str | Path, keys: tuple[str, ...] = DEFAULT_KEYS,
    smooth: int = 0,
) -> Path:  # fmt: skip
    """One figure at ``out``: a panel per key, a line per run named after the run; a run
    that did not log a key has no line in that panel."""
    runs = [Path(r) for r in run_dirs]
    series = load_series(runs, keys)
    present = [k for k in keys if any(k in series[r] for r in runs)]
    out = Path(out)
    _draw(out, present, series, title="", smooth=smooth)
    return out


def running_mean(values: list[float], window: int) -> list[float]:
    """The mean of each value and the ``window - 1`` before it (fewer at the start)."""
    return [
        sum(values[max(0, i - window + 1) : i + 1]) / min(i + 1, window) for i in range(len(values))
    ]


def load_series(
    runs: list[Path], keys: tuple[str, ...]
) -> dict[Path, dict[str, list[tuple[int, float]]]]:
    """Per run, per key, the (step, value) points with a numeric value. A key that no run
    logged is an InputError listing the keys there are."""
    if not keys:
        raise InputError("no key to plot", hint="pass --key loss (repeatable)")
    series: dict[Path, dict[str, list[tuple[int, float]]]] = {}
    logged: set[str] = set()
    for run in runs:
        records = _records(run)
        series[run] = {}
        for key in keys:
            points = [
                (r["step"], float(r[key]))
                for r in records
                if _is_number(r.get(key)) and _is_number(r.get("step"))
            ]
            if points:
                series[run][key] = points
        logged.update(k for r in records for k, v in r.items() if k != "step" and _is_number(v))
    for key in keys:
        missing = [run for run in runs if key not in series[run]]
        if len(missing) == len(runs):
            raise InputError(
                f"no run logged {key!r}; the runs logged: {', '.join(sorted(logged))}",
                hint="pass one of those to --key",
            )
        for run in missing:
            log.info("%s did not log %r; it has no line in that plot", run, key)
    return series


def _records(run: Path) -> list[dict]:
    if not run.exists():
        raise InputError(f"{run}: no such directory", hint="pass a run directory of pt-train")
    if not (run / "metrics.jsonl").is_file():
        raise InputError(
            f"{run}: no metrics.jsonl", hint="point at a run directory that pt-train wrote"
        )
    records = read_metrics(run)
    if not records:
        raise InputError(f"{run}/metrics.jsonl is empty; no step was logged yet")
    return records


def run_labels(runs: list[Path]) -> dict[Path, str]:
    """Each run's name in a legend: its directory name, with as many parent directories
    as it takes to tell runs of the same name apart."""
    parts = {run: run.resolve().parts for run in runs}
    depth = {run: 1 for run in runs}
    while True:
        labels = {run: "/".join(parts[run][-depth[run] :]) for run in runs}
        clashes = [r for r in runs if list(labels.values()).count(labels[r]) > 1]
        growable = [r for r in clashes if depth[r] < len(parts[r])]
        if not growable:
            return labels
        for run in growable:
            depth[run] += 1


def draw_figure(keys: list[str], series: dict, *, title: str = "", smooth: int = 0):
    """A matplotlib figure with a panel per key and, in each, a line per run that logged
    the key, labelled with :func:`run_labels`; with ``smooth`` > 1 the line is faint and
    its running mean over ``smooth`` points is drawn over it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = 1 if len(keys) == 1 else 2
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(7 * cols, 4 * rows), squeeze=False)
    labels = run_labels(list(series))
    for ax, key in zip(axes.flat, keys, strict=False):
        for run, by_key in series.items():
            points = by_key.get(key)
            if not points:
                continue
            steps, values = [p[0] for p in points], [p[1] for p in points]
            if smooth > 1:
                (line,) = ax.plot(steps, values, lw=1.0, alpha=0.3)
                ax.plot(steps, running_mean(values, smooth), lw=1.6, color=line.get_color(),
                        label=f"{labels[run]}, mean of {smooth}")  # fmt: skip
            else:
                ax.plot(steps, values, lw=1.2, label=labels[run])
        ax.set_xlabel("step")
        ax.set_ylabel(LABELS.get(key, key))
        ax.set_title(f"{title}{LABELS.get(key, key)}")
        ax.grid(alpha=0.3)
        if len(series) > 1 or smooth > 1:
            ax.legend()
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


def _draw(path: Path, keys: list[str], series: dict, *, title: str, smooth: int = 0) -> None:
    fig = draw_figure(keys, series, title=title, smooth=smooth)
    import matplotlib.pyplot as plt  # after draw_figure chose the Agg backend

    try:
        fmt = path.suffix.lstrip(".").lower() or "png"
        if fmt not in fig.canvas.get_supported_filetypes():
            raise InputError(
                f"{path}: cannot draw a '.{fmt}' file",
                hint="name the output .png (or .svg, .pdf)",
            )
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=110)
    finally:
        plt.close(fig)


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _file_name(key: str) -> str:
    return re.sub(r"[^\w.-]+", "_", key)
