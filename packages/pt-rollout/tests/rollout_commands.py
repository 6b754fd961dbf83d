"""``pt-rollout generate`` started as a user starts it, for the tests that stop it
part-way (Ctrl-C, a full disk) and run it again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def start_generate(prompts: Path, out: Path, model: Path) -> subprocess.Popen:
    """2 samples of at most 16 tokens per prompt with the HF engine, in batches of 4, so
    that the output grows batch by batch."""
    return subprocess.Popen(
        [Path(sys.executable).parent / "pt-rollout", "generate", "--model", model,
         "--prompts", prompts, "--out", out, "--n", "2", "--max-tokens", "16",
         "--engine", "hf", "--batch-size", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
