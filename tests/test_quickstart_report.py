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


def middle(report) -> dict[str, float]:
    """Each row's accuracy (%) with the figure its check reads at the middle of its range:
    the SFT model's accuracy, and a gain or a share over that."""
    kind = {name: spec[0] for name, spec in report.EXPECTED.items()}
    mid = {name: (spec[1] + spec[2]) / 2 for name, spec in report.EXPECTED.items()}
    return {
        name: mid[name] if kind[name] == report.ACCURACY
        else mid["sft"] + mid[name] if kind[name] == report.GAIN
        else mid["sft"] * mid[name] / 100
        for name in mid
    }  # fmt: skip


def test_the_self_check_reads_gains_over_sft_and_names_each_row_outside_its_range():
    """Every row at the middle of its range: all ok. Then DFT no better than SFT and OPD at
    half of SFT: those two say CHECK, below, and what it may mean. Then SFT at 12% with
    every method keeping its gain over it: only SFT's line says CHECK (the gains, which
    move less with the arithmetic than the rows, are what the methods' lines read)."""
    report = load_report()
    accuracy = middle(report)
    summaries = {name: {"accuracy": acc / 100} for name, acc in accuracy.items()}
    lines = report.self_check(summaries)
    assert len(lines) == len(report.MODELS) and all(" ok " in line for line in lines)
    sft = accuracy["sft"]

    def by_label(summaries):
        return {line.split(":")[0].split()[-1]: line for line in report.self_check(summaries)}

    lines = by_label({**summaries, "dft": {"accuracy": sft / 100},
                      "opd": {"accuracy": sft / 200}})  # fmt: skip
    _, low, high, _ = report.EXPECTED["dft"]
    assert lines["DFT"].startswith(
        f"  CHECK  DFT: {sft:.1f}%, +0.0 points over SFT (expected {low:+g} to {high:+g}), "
        "below the range: DFT weights each token by its probability"
    )
    _, low, high, _ = report.EXPECTED["opd"]
    assert lines["OPD"].startswith(
        f"  CHECK  OPD: {sft / 2:.1f}%, 50% of SFT's (expected {low:g}-{high:g}%), below"
    )
    assert sum("CHECK" in line for line in lines.values()) == 2

    moved = {name: {"accuracy": (acc - sft + 12) / 100} for name, acc in accuracy.items()}
    moved["opd"] = {"accuracy": accuracy["opd"] / sft * 12 / 100}
    for name in ("untrained", "base"):
        moved[name] = summaries[name]
    lines = by_label(moved)
    _, low, high, _ = report.EXPECTED["sft"]
    assert lines["SFT"].startswith(f"  CHECK  SFT: 12.0% (expected {low:g}-{high:g}%), below")
    assert "uv sync --locked" in lines["SFT"]
    assert sum("CHECK" in line for line in lines.values()) == 1


def test_the_report_prints_the_errors_and_the_check_on_a_doctored_run(tmp_path):
    """report.py on an output of eight rows, DFT doctored to 1 of 4 samples per problem
    on half the problems: its table has the ± s.e. column and the self-check ends it,
    each line whole in a file of rich's 80 columns."""
    report = load_report()
    for name, acc in middle(report).items():
        k = round(acc / 100 * 40)  # correct problems of 40, all samples alike
        write_grades(tmp_path, name, {f"p{i}": [i < k] * 4 for i in range(40)})
    write_grades(tmp_path, "dft", {f"p{i}": [i < 20, False, False, False] for i in range(40)})
    proc = subprocess.run(
        [sys.executable, REPORT, tmp_path], capture_output=True, text=True, check=True,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    out = proc.stdout
    assert "± s.e." in out
    (check,) = [line for line in out.splitlines() if line.startswith("  CHECK  DFT: 12.5%, ")]
    assert " points over SFT (expected " in check and "below the range: DFT weights" in check
    assert out.count("  ok     ") == len(report.MODELS) - 1


def test_a_gain_is_paired_over_problems_and_holds_past_two_standard_errors(tmp_path):
    """SFT gets a 1 of 2, b 0 of 2, c 2 of 2; DPO a 2 of 2, b 1 of 2, c 2 of 2. The
    per-problem differences 0.5, 0.5, 0: a gain of 33.33 points, their standard
    deviation 0.2887 over the square root of 3: a standard error of 16.67, so the gain is
    exactly two standard errors, which is not past two. One more problem that both get
    right (a difference of 0) and one DPO gets right where SFT did not (1) make it hold."""
    report = load_report()
    write_grades(tmp_path, "sft", {"a": [True, False], "b": [False, False], "c": [True, True]})
    write_grades(tmp_path, "dpo", {"a": [True, True], "b": [True, False], "c": [True, True]})
    gain, se = report.paired_gain(
        tmp_path / "grades" / "dpo.jsonl", tmp_path / "grades" / "sft.jsonl"
    )
    assert gain == pytest.approx(100 / 3) and se == pytest.approx(100 * 0.5 / 3)
    summaries = {name: {"accuracy": 0.5} for name in ("sft", "dpo")}
    (line,) = report.claims(tmp_path, summaries)
    assert line == (
        "  not    DPO above the SFT model it starts from: +33.3 points (paired s.e. 16.7: 2.0 s.e.)"
    )
    write_grades(tmp_path, "sft", {"a": [True, False], "b": [False, False], "c": [True, True],
                                   "d": [True, True], "e": [False, False]})  # fmt: skip
    write_grades(tmp_path, "dpo", {"a": [True, True], "b": [True, False], "c": [True, True],
                                   "d": [True, True], "e": [True, True]})  # fmt: skip
    (line,) = report.claims(tmp_path, summaries)
    # differences 0.5, 0.5, 0, 0, 1: mean 0.4, s.d. 0.4183, s.e. 0.1871: 2.14 s.e.
    assert line.startswith("  holds  DPO above the SFT model it starts from: +40.0 points ")
    assert line.endswith("(paired s.e. 18.7: 2.1 s.e.)")


def test_opd_holds_at_85_percent_of_its_teacher():
    report = load_report()
    lines = report.claims(Path("."), {"sft": {"accuracy": 0.80}, "opd": {"accuracy": 0.72}})
    assert lines == [
        "  holds  OPD near its teacher, the SFT model: 72.0% is 90% of 80.0% (at least 85%)"
    ]
    lines = report.claims(Path("."), {"sft": {"accuracy": 0.80}, "opd": {"accuracy": 0.60}})
    assert lines[0].startswith("  not    OPD near") and "is 75% of 80.0%" in lines[0]


def test_a_completion_with_a_unicode_line_separator_is_one_row(tmp_path):
    """An untrained model samples any token, U+2028 and U+0085 among them; JSON leaves
    them raw in a string (pt-eval writes UTF-8), and str.splitlines would cut the row
    there. Two problems, one of them with such a completion: 1 of 2 and 0 of 2."""
    report = load_report()
    rows = [
        {"id": "a", "sample": 0, "correct": True, "completion": "12"},
        {"id": "a", "sample": 1, "correct": False, "completion": "on\u2028P\x85x"},
        {"id": "b", "sample": 0, "correct": False, "completion": "\u2029"},
        {"id": "b", "sample": 1, "correct": False, "completion": "7"},
    ]
    path = tmp_path / "untrained.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    assert len(path.read_text().splitlines()) > len(rows)  # the trap
    assert report.problem_means(path) == {"a": 0.5, "b": 0.0}


def test_two_models_with_the_same_answers_gain_nothing(tmp_path):
    """Every problem answered alike by both: a gain of 0 with no spread, which does not
    hold and is 0 standard errors, not infinitely many."""
    report = load_report()
    answers = {"a": [True, False], "b": [False, False], "c": [True, True]}
    write_grades(tmp_path, "sft", answers)
    write_grades(tmp_path, "grpo", answers)
    summaries = {name: {"accuracy": 0.5} for name in ("sft", "grpo")}
    assert report.claims(tmp_path, summaries) == [
        "  not    GRPO above the SFT model it starts from: +0.0 points (paired s.e. 0.0: 0.0 s.e.)"
    ]


def test_the_kernel_bench_reads_runs_and_prints_each_checked_figure_with_its_range(tmp_path):
    """bench/quickstart_kernels.py --no-run over three doctored runs (two kernels and a
    seed): each row's accuracy in each run and its largest difference; then what the
    self-check reads (SFT's accuracy, a gain over SFT, OPD's share) with min, max and the
    range; the JSON line last, with the claims held per run."""
    report = load_report()
    bench = Path(__file__).resolve().parents[1] / "bench" / "quickstart_kernels.py"
    base = {name: round(acc / 100 * 40) for name, acc in middle(report).items()}
    for run, shift in (("default", 0), ("avx2", 2), ("seed-1", -4)):
        for name, k in base.items():  # every row moved by `shift` problems of 40
            k = max(0, k + shift) if name != "untrained" else 0
            write_grades(tmp_path / run, name, {f"p{i}": [i < k] * 4 for i in range(40)})
    proc = subprocess.run(
        [sys.executable, bench, "--out", tmp_path, "--kernels", "default,avx2",
         "--sft-seeds", "1", "--no-run"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    lines = proc.stdout.splitlines()
    result = json.loads(lines[-1])
    sft = [100 * (base["sft"] + shift) / 40 for shift in (0, 2, -4)]
    assert result["accuracy"]["sft"] == {"default": sft[0], "avx2": sft[1], "seed 1": sft[2]}
    assert result["max_diff"]["sft"] == 15.0  # 6 problems of 40
    # the rows moved together, so every gain over SFT is the same in the three runs
    gains = result["checked"]["dpo"]
    assert len(set(gains.values())) == 1
    assert gains["default"] == round(100 * (base["dpo"] - base["sft"]) / 40, 1)
    (dpo,) = [line for line in lines if line.startswith("DPO ") and "(gain over SFT)" in line]
    _, low, high, _ = report.EXPECTED["dpo"]
    assert dpo.endswith(f"{low:g} to {high:g} (gain over SFT)")
    assert set(result["claims_held"]) == {"default", "avx2", "seed 1"}
    assert "seconds" not in proc.stdout.split("{")[0]  # nothing was run, nothing timed


def test_the_kernel_bench_refuses_a_bad_seed_and_an_output_with_no_run(tmp_path):
    bench = Path(__file__).resolve().parents[1] / "bench" / "quickstart_kernels.py"
    proc = subprocess.run(
        [sys.executable, bench, "--out", tmp_path, "--sft-seeds", "1,x"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].endswith(
        "error: --sft-seeds '1,x': give whole numbers, comma-separated"
    )
    assert not list(tmp_path.iterdir())
    proc = subprocess.run(
        [sys.executable, bench, "--out", tmp_path, "--kernels", "default", "--no-run"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: {tmp_path / 'default'} has no grades-untrained.json: no finished quickstart "
        "run there (run it without --no-run)\n"
    )
