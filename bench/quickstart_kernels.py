"""The quickstart's table under each of torch's CPU kernels: how far a row moves with the
arithmetic alone.

Runs ``examples/quickstart/run.sh`` once per ``ATEN_CPU_CAPABILITY`` (``default``,
``avx2``, and ``avx512`` where the CPU has it), each into its own output directory, and
prints every row's accuracy under each, with the largest difference between kernels
and the row's standard error (over problems, from the first run), and under each kernel
whether each method's claim holds on its table (report.py's ``claims``).

    uv run --no-sync python bench/quickstart_kernels.py [--out DIR] [--kernels default,avx2]

The last line is one JSON object: the accuracies by row and kernel, the differences,
the seconds of each run.
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
    opts = parser.parse_args()
    kernels = opts.kernels.split(",") if opts.kernels else cpu_kernels()
    report = load_report()

    accuracy: dict[str, dict[str, float]] = {}
    errors: dict[str, float] = {}
    seconds: dict[str, int] = {}
    claims: dict[str, list[str]] = {}  # each method's claim line, by kernel
    for kernel in kernels:
        out = (opts.out / kernel).resolve()
        env = {**os.environ, "ATEN_CPU_CAPABILITY": kernel, "PT_QUICKSTART_OUT": str(out)}
        started = time.monotonic()
        print(f"== quickstart with ATEN_CPU_CAPABILITY={kernel} -> {out}", flush=True)
        subprocess.run(
            ["bash", str(QUICKSTART / "run.sh")], env=env, check=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        seconds[kernel] = round(time.monotonic() - started)
        summaries = {}
        for name, _, _ in report.MODELS:
            summary = json.loads((out / f"grades-{name}.json").read_text().splitlines()[-1])
            summaries[name] = summary
            accuracy.setdefault(name, {})[kernel] = round(100 * summary["accuracy"], 1)
            if name not in errors:
                se = report.standard_error(out / "grades" / f"{name}.jsonl")
                errors[name] = round(se, 1) if se is not None else 0.0
        claims[kernel] = report.claims(out, summaries)

    spread = {name: round(max(v.values()) - min(v.values()), 1) for name, v in accuracy.items()}
    labels = {name: label for name, label, _ in report.MODELS}
    print(f"{'row':12}" + "".join(f"{k:>10}" for k in kernels) + f"{'max diff':>10}{'s.e.':>8}")
    for name, by_kernel in accuracy.items():
        cells = "".join(f"{by_kernel[k]:>9.1f}%" for k in kernels)
        print(f"{labels[name]:12}{cells}{spread[name]:>10.1f}{errors[name]:>8.1f}")
    for kernel, lines in claims.items():
        print(f"each method's claim under {kernel}:")
        print("\n".join(lines))
    holds = {k: sum(line.lstrip().startswith("holds") for line in v) for k, v in claims.items()}
    print("seconds: " + ", ".join(f"{k} {s}" for k, s in seconds.items()))
    print(json.dumps({"accuracy": accuracy, "max_diff": spread, "se": errors, "seconds": seconds,
                      "claims_held": holds, "claims": len(report.CLAIMS)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
