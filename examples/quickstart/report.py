"""Print the quickstart's table (accuracy and pass@k of every model on the held-out problems)
and draw the runs' training curves into one PNG.

    python examples/quickstart/report.py quickstart-out [--seconds N]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pt_train.plot import running_mean

# (grades and run name, row label, what it is)
MODELS = (
    ("untrained", "untrained", "random weights"),
    ("base", "warm start", "step 240 of the SFT run"),
    ("sft", "SFT", "600 steps of SFT on the flawed demonstrations"),
    ("dft", "DFT", "SFT + 120 steps of DFT on the same demonstrations"),
    ("asft", "ASFT", "SFT + 120 steps of DFT anchored by KL to SFT"),
    ("dpo", "DPO", "SFT + DPO on its own graded samples"),
    ("opd", "OPD", "warm start distilled from SFT, on-policy"),
    ("grpo", "GRPO", "SFT + GRPO rewarded by pt-eval"),
)

SFT_STEPS = 600  # DFT and ASFT continue from the SFT run's last step

# What each method claims, shown on the table: (row, the row it is measured against,
# the claim). A gain holds when it exceeds two standard errors of the difference, paired
# over problems (both models answer the same problems); OPD's when the student reaches
# OPD_SHARE of its teacher's accuracy.
CLAIMS = (
    ("dft", "sft", "DFT above the SFT model it continues"),
    ("asft", "sft", "ASFT above the SFT model it continues"),
    ("dpo", "sft", "DPO above the SFT model it starts from"),
    ("grpo", "sft", "GRPO above the SFT model it starts from"),
    ("opd", "sft", "OPD near its teacher, the SFT model"),
)
OPD_SHARE = 0.85

# What each row is checked by, and its range: the untrained model, the warm start and the
# SFT model by their accuracy (%); the methods that start from the SFT model by their gain
# over it (points), which moves far less with the arithmetic than the rows themselves;
# OPD by its share of its teacher's accuracy (%). The ranges are those the quickstart gave
# under torch's default, AVX2 and AVX-512 kernels on one CPU and with four other seeds of
# its SFT run (the README's figures; bench/quickstart_kernels.py), widened by two standard
# errors: inside, as expected; outside, what that may mean.
ACCURACY, GAIN, SHARE = "accuracy", "gain over SFT", "share of SFT"
EXPECTED = {
    "untrained": (ACCURACY, 0.0, 0.5, "random weights state no answer: the grader may credit "
                  "a cut-off response's digits, or the model was not initialised at random"),
    "base": (ACCURACY, 7.0, 28.0, "the warm start (SFT step 240) comes before SFT's accuracy "
             "climbs; far off, check that SFT ran with the quickstart's sft.yaml and data"),
    "sft": (ACCURACY, 66.0, 91.0, "SFT imitates demonstrations that forget 39% of the "
            "carries, so it settles near 80%: far off, the install differs from the lock (uv "
            "sync --locked), or the data (synth --flawed 0.4) or configs were changed"),
    "dft": (GAIN, 4.0, 17.0, "DFT weights each token by its probability, which favours the "
            "demonstrations' majority (the right carry); no gain: its objective is not that"),
    "asft": (GAIN, 6.0, 16.0, "ASFT is DFT anchored to the SFT model: read it with DFT's line"),
    "dpo": (GAIN, 3.0, 15.0, "DPO learns from pairs of the SFT model's graded samples; "
            "far below, check pt-data pairs' count in logs/lane_a.log"),
    "opd": (SHARE, 84.0, 99.0, "OPD distils the SFT model into the warm start: far below, "
            "check logs/lane_a.log"),
    "grpo": (GAIN, 7.0, 17.0, "GRPO learns from the grader's rewards on the SFT model's "
             "samples: far below, check logs/lane_b.log"),
}  # fmt: skip


def standard_error(grades: Path) -> float | None:
    """The standard error of the accuracy (in points), over problems: the samples of one
    problem are not independent, so each problem's mean counts once."""
    means = list(problem_means(grades).values())
    if len(means) < 2:
        return None
    return 100 * statistics.stdev(means) / len(means) ** 0.5


def problem_means(grades: Path) -> dict[str, float]:
    """Each problem's share of correct samples in a grades file (none if it is missing)."""
    by_problem: dict[str, list[float]] = {}
    if grades.exists():
        for line in grades.read_text().split("\n"):  # not splitlines: a sampled
            # completion may hold U+2028 or U+0085, which JSON leaves in its strings
            if line.strip():
                row = json.loads(line)
                by_problem.setdefault(str(row["id"]), []).append(float(bool(row["correct"])))
    return {pid: sum(v) / len(v) for pid, v in by_problem.items()}


def paired_gain(grades: Path, against: Path) -> tuple[float, float] | None:
    """The accuracy of ``grades`` minus that of ``against`` over the problems both
    answered, and its standard error (points): the per-problem differences' standard
    deviation over the square root of their number."""
    mine, theirs = problem_means(grades), problem_means(against)
    shared = sorted(mine.keys() & theirs.keys())
    if len(shared) < 2:
        return None
    diffs = [mine[p] - theirs[p] for p in shared]
    return 100 * statistics.mean(diffs), 100 * statistics.stdev(diffs) / len(diffs) ** 0.5


def claims(out: Path, summaries: dict[str, dict]) -> list[str]:
    """One line per method's claim: ``holds`` or ``not``, with the figures behind it."""
    lines = []
    for name, base, claim in CLAIMS:
        if name not in summaries or base not in summaries:
            continue
        if name == "opd":
            share = summaries[name]["accuracy"] / max(summaries[base]["accuracy"], 1e-9)
            verdict = "holds" if share >= OPD_SHARE else "not  "
            lines.append(
                f"  {verdict}  {claim}: {100 * summaries[name]['accuracy']:.1f}% is "
                f"{100 * share:.0f}% of {100 * summaries[base]['accuracy']:.1f}% "
                f"(at least {100 * OPD_SHARE:.0f}%)"
            )
            continue
        gain = paired_gain(out / "grades" / f"{name}.jsonl", out / "grades" / f"{base}.jsonl")
        if gain is None:
            continue
        points, se = gain
        verdict = "holds" if points > 2 * se else "not  "
        # (no spread at all: every problem moved by the same amount, or none moved)
        ratio = points / se if se else (math.copysign(math.inf, points) if points else 0.0)
        lines.append(
            f"  {verdict}  {claim}: {points:+.1f} points (paired s.e. {se:.1f}: {ratio:.1f} s.e.)"
        )
    return lines


def checked(name: str, summaries: dict[str, dict]) -> float | None:
    """The figure row ``name`` is checked by (:data:`EXPECTED`): its accuracy (%), its gain
    over the SFT model (points) or its share of the SFT model's accuracy (%); None without
    the rows it needs."""
    if name not in summaries:
        return None
    accuracy = 100 * summaries[name]["accuracy"]
    what = EXPECTED[name][0]
    if what == ACCURACY:
        return accuracy
    if "sft" not in summaries:
        return None
    sft = 100 * summaries["sft"]["accuracy"]
    return accuracy - sft if what == GAIN else 100 * accuracy / max(sft, 1e-7)


def self_check(summaries: dict[str, dict]) -> list[str]:
    """One line per row: the figure it is checked by against its range."""
    lines = []
    for name, label, _ in MODELS:
        value = checked(name, summaries)
        if value is None:
            continue
        accuracy = 100 * summaries[name]["accuracy"]
        what, low, high, meaning = EXPECTED[name]
        if what == ACCURACY:
            where = f"{accuracy:.1f}% (expected {low:g}-{high:g}%)"
        elif what == GAIN:
            where = (f"{accuracy:.1f}%, {value:+.1f} points over SFT "
                     f"(expected {low:+g} to {high:+g})")  # fmt: skip
        else:
            where = f"{accuracy:.1f}%, {value:.0f}% of SFT's (expected {low:g}-{high:g}%)"
        if low <= value <= high:
            lines.append(f"  ok     {label}: {where}")
        else:
            side = "below" if value < low else "above"
            lines.append(f"  CHECK  {label}: {where}, {side} the range: {meaning}")
    return lines


def load_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


SMOOTH = {"sampled_reward": 10, "reward": 10}  # noisy per-round figures: drawn with a running mean


def plot_curves(out: Path) -> Path:
    """Four panels: the fine-tunes' cross-entropy, DPO's reward accuracy and margin, OPD's
    KL to the teacher on fresh samples, GRPO's reward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: load_metrics(out / "runs" / name) for name, _, _ in MODELS if name != "base"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    panels = [
        (axes[0][0], "cross-entropy on trained tokens (SFT data), by SFT step", [
            ("sft", "loss", "SFT (the warm start is its step 240)"),
            ("dft", "ce_loss", f"DFT from step {SFT_STEPS}", SFT_STEPS),
            ("asft", "ce_loss", f"ASFT from step {SFT_STEPS}", SFT_STEPS),
        ], True),
        (axes[0][1], "DPO: reward accuracy and margin", [
            ("dpo", "rewards/accuracies", "accuracy (the step's batch)"),
            ("dpo", "rewards/margins", "margin (the step's batch)"),
            ("dpo", "eval/rewards/accuracies", "accuracy over all pairs, after each epoch"),
        ], False),
        (axes[1][0], "OPD: KL(student || teacher) on the student's samples", [
            ("opd", "sampled_kl", "per token, single-sample estimate"),
            ("opd", "kl", "forward KL over the teacher's top-8 and the rest"),
        ], False),
        (axes[1][1], "GRPO: reward (pt-eval correct) per round", [
            ("grpo", "sampled_reward", "every sample drawn (fresh prompts)"),
            ("grpo", "reward", "the groups trained on (rewards differ)"),
        ], False),
    ]  # fmt: skip
    for ax, title, lines, log_scale in panels:
        for run, key, label, *offset in lines:
            rows = [r for r in runs[run] if r.get(key) is not None]
            shift = offset[0] if offset else 0
            if rows:
                style = {"marker": "o"} if key.startswith("eval/") else {}
                steps, values = [shift + r["step"] for r in rows], [r[key] for r in rows]
                line = ax.plot(
                    steps, values, label=label, alpha=0.35 if key in SMOOTH else 1, **style
                )
                if key in SMOOTH:  # and its running mean over SMOOTH rounds
                    window = SMOOTH[key]
                    ax.plot(
                        steps, running_mean(values, window), color=line[0].get_color(),
                        label=f"{label}, mean of {window}",
                    )  # fmt: skip
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        if log_scale:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    target = out / "training_curves.png"
    fig.savefig(target, dpi=110)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=int, default=None)
    args = parser.parse_args()

    console = Console()
    table = Table(title="Arithmetic test set (200 held-out problems)")
    table.add_column("model")
    summaries = {}
    for name, _, _ in MODELS:
        path = args.out / f"grades-{name}.json"
        if path.exists():
            summaries[name] = json.loads(path.read_text().strip().splitlines()[-1])
    pass_keys = sorted(
        {k for s in summaries.values() for k in s.get("pass@k", {})}, key=lambda k: int(k)
    )
    table.add_column("accuracy", justify="right")
    table.add_column("± s.e.", justify="right")
    for k in pass_keys:
        table.add_column(f"pass@{k}", justify="right")
    table.add_column("maj@n", justify="right")
    table.add_column("no answer", justify="right")
    for name, label, _ in MODELS:
        s = summaries.get(name)
        if s is None:
            continue
        se = standard_error(args.out / "grades" / f"{name}.jsonl")
        table.add_row(
            label,
            f"{100 * s['accuracy']:.1f}%",
            "" if se is None else f"{se:.1f}",
            *[f"{100 * s['pass@k'][k]:.1f}%" for k in pass_keys],
            f"{100 * s.get('maj@n', 0.0):.1f}%",
            str(s.get("no_answer", "")),
        )
    console.print(table)
    for name, label, origin in MODELS:
        if name in summaries:
            console.print(f"  {label + ':':12} {origin}")
    evaluated = [
        r for r in load_metrics(args.out / "runs" / "dpo") if "eval/rewards/accuracies" in r
    ]
    if evaluated:
        console.print(
            f"DPO reward accuracy over all its pairs after training: "
            f"{100 * evaluated[-1]['eval/rewards/accuracies']:.1f}%"
        )
    console.print(f"training curves: {plot_curves(args.out)}")
    console.print("each method's claim, on this table:")
    for line in claims(args.out, summaries):
        console.print(line, markup=False, soft_wrap=True)  # one line each, in a file too
    console.print("self-check, each row against the range the README gives:")
    for line in self_check(summaries):
        console.print(line, markup=False, soft_wrap=True)  # one line each, in a file too
    if args.seconds is not None:
        console.print(f"total time: {args.seconds // 60} min {args.seconds % 60} s")


if __name__ == "__main__":
    main()
