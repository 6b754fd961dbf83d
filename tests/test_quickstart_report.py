"""The quickstart's report: each row's standard error against a hand count, and the
self-check line per row on a doctored table (rows moved out of their ranges, each named
with what it may mean), as a user sees them at the end of run.sh."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPORT = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "report.py"


def load_report():
    spec = importlib.util.spec_from_file_location("quickstart_report", REPORT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_grades(out: Path, name: str, correct: dict[str, list[bool]]) -> float:
    """A grades summary and its per-sample rows; returns the accuracy."""
    rows = [
        {"id": pid, "sample": k, "correct": c}
        for pid, cs in correct.items()
        for k, c in enumerate(cs)
    ]
    accuracy = sum(r["correct"] for r in rows) / len(rows)
    (out / "grades").mkdir(parents=True, exist_ok=True)
    (out / "grades" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"kind": "grades", "accuracy": accuracy, "pass@k": {"1": accuracy}, "no_answer": 0}
    (out / f"grades-{name}.json").write_text(json.dumps(summary) + "\n")
    return accuracy


def test_the_standard_error_is_over_problems(tmp_path):
    """Problems with 2 of 2, 1 of 2 and 0 of 2 correct: means 1, 0.5, 0; their standard
    deviation 0.5, over the square root of 3 problems: 28.87 points (not the 20.41 of six
    independent samples)."""
    report = load_report()
    write_grades(tmp_path, "sft", {"a": [True, True], "b": [True, False], "c": [False, False]})
    assert report.standard_error(tmp_path / "grades" / "sft.jsonl") == pytest.approx(
        100 * 0.5 / 3**0.5
    )
    assert report.standard_error(tmp_path / "grades" / "none.jsonl") is None


def test_the_self_check_names_each_row_outside_its_range(tmp_path):
    """Every row at the middle of its range: all ok. Then SFT at 12% and GRPO at 95%:
    those two lines say CHECK, below/above, and what it may mean; the rest stay ok."""
    report = load_report()
    middle = {name: (low + high) / 200 for name, (low, high, _) in report.EXPECTED.items()}
    summaries = {name: {"accuracy": acc} for name, acc in middle.items()}
    lines = report.self_check(summaries)
    assert len(lines) == len(report.MODELS) and all(" ok " in line for line in lines)

    summaries["sft"] = {"accuracy": 0.12}
    summaries["grpo"] = {"accuracy": 0.95}
    lines = {line.split(":")[0].split()[-1]: line for line in report.self_check(summaries)}
    assert lines["SFT"].startswith("  CHECK  SFT: 12.0% (expected 48-81%), below the range:")
    assert "uv sync --locked" in lines["SFT"]
    assert lines["GRPO"].startswith("  CHECK  GRPO: 95.0% (expected 59-87%), above the range:")
    assert sum("CHECK" in line for line in lines.values()) == 2


def test_the_report_prints_the_errors_and_the_check_on_a_doctored_run(tmp_path):
    """report.py on an output of eight rows, DFT doctored to 1 of 4 samples per problem
    on half the problems: its table has the ± s.e. column and the self-check ends it."""
    report = load_report()
    for name, _, _ in report.MODELS:
        low, high, _ = report.EXPECTED[name]
        k = round((low + high) / 200 * 20)  # correct problems of 20, all samples alike
        write_grades(tmp_path, name, {f"p{i}": [i < k] * 4 for i in range(20)})
    write_grades(tmp_path, "dft", {f"p{i}": [i < 10, False, False, False] for i in range(20)})
    proc = subprocess.run(
        [sys.executable, REPORT, tmp_path], capture_output=True, text=True, check=True,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out = proc.stdout
    assert "± s.e." in out
    assert "CHECK  DFT: 12.5% (expected 13-56%), below the range" in out
    assert out.count("  ok     ") == len(report.MODELS) - 1
