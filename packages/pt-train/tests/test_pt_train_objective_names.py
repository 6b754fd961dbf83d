"""Every objective pt-train trains (``NAMES``, the one list of them) is named wherever pt
lists its objectives: `pt --help`, `pt-train --help`, docs/pt-train.md's config and LoRA
section, and docs/coming-from.md's table of TRL trainers."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from pt_train.objectives import NAMES

REPO = Path(__file__).resolve().parents[3]
# the trainer a TRL user knows each objective by, where TRL has one
TRL_TRAINERS = {
    "sft": "SFTTrainer",
    "dpo": "DPOTrainer",
    "grpo": "GRPOTrainer",
    "opd": "GKDTrainer",
    "orpo": "ORPOTrainer",
    "kto": "KTOTrainer",
}


def help_of(app) -> str:
    result = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def named(text: str) -> list[str]:
    """The objectives ``text`` names, as upper-case words (SFT, ORPO, ...)."""
    return [name for name in NAMES if re.search(rf"\b{name.upper()}\b", text)]


def test_pt_train_help_and_pt_help_name_every_objective():
    from pt_core.umbrella import app as pt_app
    from pt_train.cli import app as pt_train_app

    assert named(help_of(pt_train_app)) == list(NAMES)
    (train_line,) = [line for line in help_of(pt_app).split(" train ")[1:2]]
    assert named(train_line.split(" rollout ")[0]) == list(NAMES)


def test_the_config_reference_and_the_lora_section_name_every_objective():
    page = (REPO / "docs" / "pt-train.md").read_text()
    (line,) = [line for line in page.splitlines() if re.match(r"\s+name: sft\s+#", line)]
    assert line.split("#", 1)[1].split() == " | ".join(NAMES).split()
    lora = page.split("## LoRA", 1)[1].split("\n## ", 1)[0]
    (works,) = re.findall(r"It works for every objective \(([^)]*)\)", " ".join(lora.split()))
    assert named(works) == list(NAMES)


def test_coming_from_maps_each_trl_trainer_to_its_objective():
    page = (REPO / "docs" / "coming-from.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| ")]
    for name, trainer in TRL_TRAINERS.items():
        (row,) = [r for r in rows if f"`{trainer}`" in r or f"{trainer} " in r]
        assert f"name: {name}" in row.split(" | ")[1], row
