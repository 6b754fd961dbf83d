"""The quickstart's table under each of torch's CPU kernels, and with other seeds of its
SFT run: how far a row moves with the arithmetic alone.

Runs ``examples/quickstart/run.sh`` once per ``ATEN_CPU_CAPABILITY`` (``default``,
``avx2``, and ``avx512`` where the CPU has it), then once per seed in ``--sft-seeds``
under the ``default`` kernel (``PT_QUICKSTART_SFT_SEED``: another CPU's arithmetic moves
the SFT run as another seed does, and every model after it follows), each into its own
output directory. Prints every row's accuracy in each run, with the largest difference
and the row's standard error (over problems, from the first run); then the figure
report.py's self-check reads for each row (an accuracy, a gain over the SFT model, or
OPD's share of it) in each run, with its smallest and largest, and the range the
self-check gives; and under each run whether each method's claim holds on its table.

    uv run --no-sync python bench/quickstart_kernels.py [--out DIR] [--kernels default,avx2]
        [--sft-seeds 1,2,3,4] [--no-run]

``--no-run`` reads the runs already in ``--out`` (the tables again, e.g. against new
ranges). The last line is one JSON object: the accuracies and checked figures by row and run,
the differences, the seconds of each run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"


def cpu_kernels() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    kernels = ["default", "avx2"] if " avx2" in flags else ["default"]
    if " avx512f" in flags:
        kernels.append("avx512")
    return kernels


def load_report():
    spec = importlib.util.spec_from_file_location("quickstart_report", QUICKSTART / "report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("quickstart-kernels"))
    parser.add_argument("--kernels", default=None, help="comma-separated (default: the CPU's)")
    parser.add_argument("--sft-seeds", default="", help="comma-separated SFT seeds to add, "
                        "each run under the default kernel (default: none)")  # fmt: skip
    parser.add_argument("--no-run", action="store_true",
                        help="read the runs already in --out instead of running them")  # fmt: skip
    opts = parser.parse_args()
    kernels = opts.kernels.split(",") if opts.kernels else cpu_kernels()
    seeds = [s.strip() for s in opts.sft_seeds.split(",") if s.strip()]
    if not all(s.isdigit() for s in seeds):
        parser.error(f"--sft-seeds {opts.sft_seeds!r}: give whole numbers, comma-separated")
    runs = [(k, {"ATEN_CPU_CAPABILITY": k}) for k in kernels] + [
        (f"seed {s}", {"ATEN_CPU_CAPABILITY": "default", "PT_QUICKSTART_SFT_SEED": str(s)})
        for s in seeds
    ]
    report = load_report()

    accuracy: dict[str, dict[str, float]] = {}
    figure: dict[str, dict[str, float]] = {}  # what the self-check reads, by row and run
    errors: dict[str, float] = {}
    seconds: dict[str, int] = {}
    claims: dict[str, list[str]] = {}  # each method's claim line, by run
    for run, extra in runs:
        out = (opts.out / run.replace(" ", "-")).resolve()
        env = {**os.environ, **extra, "PT_QUICKSTART_OUT": str(out)}
        started = time.monotonic()
        if not opts.no_run:
            print(f"== quickstart, {' '.join(f'{k}={v}' for k, v in extra.items())} -> {out}",
                  flush=True)  # fmt: skip
            done = subprocess.run(
                ["bash", str(QUICKSTART / "run.sh")], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if done.returncode != 0:
                print(f"error: the quickstart failed (exit {done.returncode}) for {run}; "
                      f"its logs are in {out}/logs", file=sys.stderr)  # fmt: skip
                return 1
            seconds[run] = round(time.monotonic() - started)
        missing = [n for n, _, _ in report.MODELS if not (out / f"grades-{n}.json").is_file()]
        if missing:
            print(f"error: {out} has no grades-{missing[0]}.json: no finished quickstart run "
                  f"there (run it without --no-run)", file=sys.stderr)  # fmt: skip
            return 2
        summaries = {}
        for name, _, _ in report.MODELS:
            summary = json.loads((out / f"grades-{name}.json").read_text().splitlines()[-1])
            summaries[name] = summary
            accuracy.setdefault(name, {})[run] = round(100 * summary["accuracy"], 1)
            if name not in errors:
                se = report.standard_error(out / "grades" / f"{name}.jsonl")
                errors[name] = round(se, 1) if se is not None else 0.0
        for name, _, _ in report.MODELS:
            value = report.checked(name, summaries)
            if value is not None:
                figure.setdefault(name, {})[run] = round(value, 1)
        claims[run] = report.claims(out, summaries)

    spread = {name: round(max(v.values()) - min(v.values()), 1) for name, v in accuracy.items()}
    labels = {name: label for name, label, _ in report.MODELS}
    names = [run for run, _ in runs]
    print("accuracy (%)")
    print(f"{'row':12}" + "".join(f"{r:>9}" for r in names) + f"{'max diff':>10}{'s.e.':>7}")
    for name, by_run in accuracy.items():
        cells = "".join(f"{by_run[r]:>9.1f}" for r in names)
        print(f"{labels[name]:12}{cells}{spread[name]:>10.1f}{errors[name]:>7.1f}")
    print("what the self-check reads (accuracy %, gain over SFT in points, or share of SFT %)")
    print(f"{'row':12}" + "".join(f"{r:>9}" for r in names) + f"{'min':>7}{'max':>7}  range")
    for name, by_run in figure.items():
        what, low, high, _ = report.EXPECTED[name]
        cells = "".join(f"{by_run[r]:>9.1f}" for r in names)
        print(f"{labels[name]:12}{cells}{min(by_run.values()):>7.1f}{max(by_run.values()):>7.1f}"
              f"  {low:g} to {high:g} ({what})")  # fmt: skip
    for run, lines in claims.items():
        print(f"each method's claim, {run}:")
        print("\n".join(lines))
    holds = {k: sum(line.lstrip().startswith("holds") for line in v) for k, v in claims.items()}
    if seconds:
        print("seconds: " + ", ".join(f"{k} {s}" for k, s in seconds.items()))
    print(json.dumps({"accuracy": accuracy, "max_diff": spread, "checked": figure,
                      "se": errors, "seconds": seconds, "claims_held": holds,
                      "claims": len(report.CLAIMS)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
