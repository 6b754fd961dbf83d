"""Fixtures of the workspace-level tests: the quickstart's outputs at a small size, built
once per test session for the tests that run the docs' commands on them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # helper modules beside the tests

from shell import sh, tools_path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "examples" / "quickstart"


@pytest.fixture(scope="session")
def quickstart_out(tmp_path_factory):
    """A quickstart output directory, beside examples/ as ``quickstart-out/`` is after
    ``bash examples/quickstart/run.sh`` in the repository: the quickstart's steps 1-5 on
    200 problems and a few steps each (runs/sft, runs/dft, runs/dpo with its evaluations,
    synth, tokenizer, data/sft, data/test-prompts, manifest-sft.json). DPO trains on 16
    pairs written here instead of the SFT model's graded samples (a 4-step model has no
    correct sample to pair), with an evaluation after every step. Returns the directory
    and the environment the tools run in."""
    root = tmp_path_factory.mktemp("repo")
    (root / "examples").symlink_to(REPO / "examples")
    out = root / "quickstart-out"
    out.mkdir()
    env = {
        **os.environ,
        "PATH": tools_path(),
        "HF_HUB_OFFLINE": "1",
        "DS_ACCELERATOR": "cpu",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
    }
    pairs = [
        {"prompt": f"What is {a} + 2?", "chosen": f"{a + 2}.", "rejected": f"{a + 3}."}
        for a in range(16)
    ]
    (out / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    q = QUICKSTART
    for command in (
        "pt-data synth arithmetic --n 200 --n-test 20 --out synth",
        "pt-data tokenizer --texts synth/train.jsonl --out tokenizer",
        f"pt-data build {q}/prompts.yaml",
        f"pt-data build {q}/data.yaml | pt-train run {q}/sft.yaml --data - training.max_steps=4"
        " training.inference_steps=2 training.logging_steps=1 > manifest-sft.json",
        f"pt-train run {q}/finetune.yaml --data data/sft model.name_or_path=runs/sft/inference/"
        "step-2 training.max_steps=2 training.logging_steps=1",
        f"pt-train run {q}/dpo.yaml --data pairs.jsonl model.name_or_path=runs/sft/inference/"
        "step-4 training.num_epochs=null training.max_steps=2 eval.steps=1",
    ):
        sh(command, out, env)
    return out, env
