"""bench/data_scale.py at its smallest: it builds two sizes and one and two workers, and
its last line holds every figure, the outputs of one and two workers the same bytes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "data_scale.py"


def test_the_data_scale_bench_runs_and_reports_each_size(tmp_path):
    proc = subprocess.run(
        [sys.executable, BENCH, "--sizes", "300,900", "--workers-rows", "600", "--trl-rows", "0",
         "--work", tmp_path],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout.splitlines()[-1])
    assert set(figures["sizes"]) == {"300", "900"}
    for size, f in figures["sizes"].items():
        # rows/s of unrounded seconds: within the 0.05 s the printed seconds are rounded to
        assert abs(f["rows_per_s"] * f["seconds"] - int(size)) <= f["rows_per_s"] * 0.05 + 1
        assert f["peak_rss_gb"] >= f["peak_rss_main_gb"] > 0
        assert f["packed_rows"] > 0 and f["tokens"] > 0
    assert figures["workers"]["same_bytes"] is True and figures["workers"]["rows"] == 600
    # the rows are the same for a given index at every size (a prefix)
    small = (tmp_path / "rows-300.jsonl").read_text().splitlines()
    assert small == (tmp_path / "rows-900.jsonl").read_text().splitlines()[:300]
