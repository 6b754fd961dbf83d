"""docs/coming-from.md's commands, and docs/pt-train.md's plots of the quickstart's runs,
run as written in a quickstart output directory: the session's ``quickstart_out``
(tests/conftest.py), made by the quickstart's own configs with fewer rows and steps."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shell import sh

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # six runs of the tools


def commands_of(block: str) -> list[str]:
    """The command lines of a fenced block, each without its trailing comment."""
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("pt")]


def coming_from_commands() -> list[str]:
    page = (REPO / "docs" / "coming-from.md").read_text()
    section = page.split("## On the quickstart's outputs", 1)[1]
    return commands_of(section.split("```bash", 1)[1].split("```", 1)[0])


def test_the_table_names_each_trainer_and_command_it_maps():
    page = (REPO / "docs" / "coming-from.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    mapped = {
        "SFTTrainer": "name: sft",
        "DPOTrainer": "name: dpo",
        "GRPOTrainer": "name: grpo",
        "GKDTrainer": "name: opd",
        "llamafactory-cli train": "pt-train run",
        "axolotl preprocess config.yml": "pt-data build",
        "llamafactory-cli chat": "pt-rollout chat",
    }
    for theirs, ours in mapped.items():
        (row,) = [r for r in rows if theirs in r]
        assert ours in row.split(" | ")[1], row
    readme = (REPO / "README.md").read_text()
    assert "(docs/coming-from.md)" in readme


def test_the_commands_run_on_the_quickstarts_outputs(quickstart_out):
    out, env = quickstart_out
    commands = coming_from_commands()
    assert len(commands) >= 6
    for command in commands:
        if command.startswith("pt-rollout chat"):
            chat_in_a_terminal(command, out)
        else:
            sh(command, out, env)
    assert (out / "sft-dft.png").stat().st_size > 0
    assert len((out / "samples.jsonl").read_text().splitlines()) == 2 * 20


def test_pt_train_md_plots_the_quickstarts_runs(quickstart_out):
    """The plots in docs/pt-train.md's summary of the runs the quickstart makes (runs/sft,
    runs/dft, runs/dpo); eval_loss is logged by the runs with an eval: section, which
    among the quickstart's is DPO."""
    out, env = quickstart_out
    page = (REPO / "docs" / "pt-train.md").read_text()
    summary = page.split("```", 2)[1]
    plots = [
        c
        for c in commands_of(summary)
        if c.startswith("pt-train plot")
        and all((out / r).is_dir() for r in re.findall(r"runs/\S+", c))
    ]
    assert any("--key eval_loss" in c for c in plots), plots
    for command in plots:
        sh(command, out, env)
    assert (out / "runs" / "dpo" / "eval_loss.png").stat().st_size > 0


def chat_in_a_terminal(command: str, cwd: Path) -> None:
    """Run ``command`` in a tmux terminal, wait for the chat's prompt, type /exit."""
    if shutil.which("tmux") is None:
        pytest.skip("needs tmux (apt-get install tmux)")
    bindir = Path(sys.executable).parent
    session = f"pt-coming-from-{os.getpid()}"
    script = f"PATH={bindir}:$PATH HF_HUB_OFFLINE=1 {command}; echo chat exited $?; sleep 60"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", "-c", str(cwd),
         script],
        check=True,
    )  # fmt: skip

    def screen() -> str:
        return subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
        ).stdout

    def wait_for(text: str) -> str:
        deadline = time.monotonic() + 180
        while text not in screen():
            assert time.monotonic() < deadline, f"{text!r} never showed:\n{screen()}"
            time.sleep(0.2)
        return screen()

    try:
        wait_for("you>")
        subprocess.run(["tmux", "send-keys", "-t", session, "/exit", "Enter"], check=True)
        assert "Traceback" not in wait_for("chat exited 0")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
