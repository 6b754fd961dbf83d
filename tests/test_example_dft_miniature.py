"""examples/dft-miniature: its configs are ones the tools accept, its script passes
shellcheck and runs end to end at a small size, and its report's figures are the hand
counts of the graded rows it reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from shell import sh, tools_path
from test_examples import assert_shellcheck_passes
from test_examples_envs import load_example

REPO = Path(__file__).resolve().parents[1]
HERE = REPO / "examples" / "dft-miniature"


def load_report():
    return load_example("dft-miniature", "report.py")


def test_the_script_passes_shellcheck():
    assert_shellcheck_passes(HERE / "run.sh")


@pytest.mark.parametrize("name", ["broad.yaml", "narrow.yaml", "test-prompts.yaml"])
def test_the_data_configs_validate(name):
    from pt_data.config import load_data_config

    assert load_data_config(HERE / name).datasets


@pytest.mark.parametrize("name", ["pretrain.yaml", "finetune.yaml"])
def test_the_training_configs_pass_pt_train_check(cli, name):
    cli("pt-train", "check", HERE / name)


def test_a_bad_size_is_refused_before_anything_is_written(tmp_path):
    env = {**os.environ, "PATH": tools_path(), "PT_NO_SYNC": "1", "PT_DFT_STEPS": "10"}
    proc = subprocess.run(["bash", str(HERE / "run.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 2
    assert "PT_DFT_STEPS=10" in proc.stderr and "multiple of 8" in proc.stderr
    assert not any(tmp_path.iterdir())


def graded(prefix: str, correct: list[bool]) -> list[dict]:
    """Rows of one test set: problem i's samples, correct as given (two samples each)."""
    return [{"id": f"{prefix}-test-{i // 2}", "sample": i % 2, "correct": c}
            for i, c in enumerate(correct)]  # fmt: skip


def test_each_test_sets_accuracy_is_counted_from_its_own_rows():
    """add3: 3 of 4 samples correct; sub3: 1 of 2; arith4: 0 of 2; arith: 2 of 2, in
    rows mixed as one prompt set gives them."""
    report = load_report()
    rows = (graded("add3", [True, False, True, True]) + graded("sub3", [False, True])
            + graded("arith4", [False, False]) + graded("arith", [True, True]))  # fmt: skip
    rows = rows[1::2] + rows[::2]
    found = report.by_set(rows)
    assert {k: v["accuracy"] for k, v in found.items()} == {
        "add3": 75.0, "sub3": 50.0, "arith4": 0.0, "arith": 100.0
    }  # fmt: skip
    assert (found["add3"]["problems"], found["add3"]["samples"]) == (2, 4)
    with pytest.raises(ValueError, match="of no test set"):
        report.by_set([{"id": "mul-test-0", "correct": True}])


def test_the_report_table_and_summary_are_the_hand_counts(tmp_path):
    """Graded rows written by hand for the pretrained model and two seeds of each method
    at one rate: the summary's means, standard deviations and off-the-task means are
    those counted here, and the curves are drawn."""
    report = load_report()
    grades = tmp_path / "grades"
    grades.mkdir()

    def write(run: str, right: dict[str, int]) -> None:  # right: correct of 4 samples a set
        rows = [
            r for prefix, k in right.items() for r in graded(prefix, [True] * k + [False] * (4 - k))
        ]
        (grades / f"{run}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    write("start-0", {"add3": 2, "sub3": 4, "arith4": 4, "arith": 4})
    for method, _ in report.METHODS:
        for seed, right in ((0, {"add3": 4, "sub3": 1, "arith4": 2, "arith": 3}),
                            (1, {"add3": 4, "sub3": 3, "arith4": 2, "arith": 4})):  # fmt: skip
            for step in (1, 2, 4, 8):
                write(f"{method}-lr1e-4-s{seed}-{step}", right)
    proc = subprocess.run(
        [sys.executable, str(HERE / "report.py"), str(tmp_path), "--steps", "8",
         "--seeds", "0 1", "--lrs", "1e-4"], capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["pretrained"] == {"add3": 50.0, "sub3": 100.0, "arith4": 100.0, "arith": 100.0}
    dft = summary["dft@1e-4"]
    assert dft["add3"]["mean"] == 100.0 and dft["add3"]["sd"] == 0.0
    assert dft["sub3"]["seeds"] == [25.0, 75.0]
    assert dft["sub3"]["sd"] == pytest.approx(35.3553, abs=1e-4)  # sqrt(2 * 25^2)
    # off the task, seed 0: (25 + 50 + 75) / 3 = 50; seed 1: (75 + 50 + 100) / 3 = 75
    assert dft["off_the_task"]["seeds"] == pytest.approx([50.0, 75.0])
    assert "DFT, lr 1e-4" in proc.stdout and "100.0 ± 0.0" in proc.stdout
    assert (tmp_path / "curves.png").stat().st_size > 0


@pytest.mark.slow
def test_the_example_runs_end_to_end_at_a_small_size(tmp_path):
    """run.sh with 4 pretraining steps, 8 of fine-tuning at one rate and seed, 5 problems
    a test set sampled once: every snapshot of every method graded on the four sets, the
    table printed, the curves drawn."""
    env = {**os.environ, "PATH": tools_path(), "PT_NO_SYNC": "1", "OMP_NUM_THREADS": "1",
           "PT_DFT_PRETRAIN_STEPS": "4", "PT_DFT_STEPS": "8", "PT_DFT_SEEDS": "0",
           "PT_DFT_LRS": "3e-4", "PT_DFT_TEST": "5", "PT_DFT_SAMPLES": "1"}  # fmt: skip
    proc = sh(f"bash {HERE / 'run.sh'}", tmp_path, env)
    out = tmp_path / "dft-miniature-out"
    runs = ["start-0"] + [
        f"{m}-lr3e-4-s0-{k}" for m in ("sft", "dft", "asft") for k in (1, 2, 4, 8)
    ]
    for run in runs:
        rows = [json.loads(x) for x in (out / "grades" / f"{run}.jsonl").read_text().splitlines()]
        assert sorted({r["id"].rsplit("-", 2)[0] for r in rows}) == [
            "add3",
            "arith",
            "arith4",
            "sub3",
        ]
        assert len(rows) == 20
    printed = " ".join(proc.stdout.split())  # the title may wrap
    assert "5 held-out problems a set, 1 sample each" in printed
    assert "ASFT, lr 3e-4" in printed
    assert (out / "curves.png").stat().st_size > 0
