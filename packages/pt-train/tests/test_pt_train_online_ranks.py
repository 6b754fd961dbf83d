"""Rounds reach the ranks in memory: in a run of two ranks rank 0 makes each round and the
other gets its rows from rank 0, not from the files written for a resumed run; no rank
reads a round back from disk while it trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

# Installed in every process of the run (a plain process imports sitecustomize from
# PYTHONPATH at start): each open of a round's rows for reading is logged, with the rank.
AUDIT = """
import os, sys

def _log_round_reads(event, args):
    if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.fsdecode(args[0])
    # a round's file as written (the writer's own opens are of a temporary beside it)
    if not (path.endswith("rollouts.jsonl") and os.path.basename(os.path.dirname(path)).startswith("round-")):
        return
    mode, flags = (args[1], args[2]) if len(args) > 2 else (None, 0)
    reading = ("r" in mode and "+" not in mode) if isinstance(mode, str) else flags & 3 == 0
    if reading:
        with open(os.environ["PT_TEST_ROUND_READS"], "a") as log:
            log.write(f"{os.environ.get('RANK', '-')} {path}\\n")

sys.addaudithook(_log_round_reads)
"""


@pytest.fixture
def audited(tmp_path):
    """The environment of a plain process whose reads of round files are logged, and the
    log."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(AUDIT)
    reads = tmp_path / "reads.log"
    reads.write_text("")
    env = {**os.environ, "PYTHONPATH": f"{hooks}{os.pathsep}{tmp_path}", "PT_TEST_FORK": "0",
           "PT_TEST_ROUND_READS": str(reads), "OMP_NUM_THREADS": "1"}  # fmt: skip
    return env, reads


def test_no_rank_reads_a_round_back_from_disk(tmp_path, tiny_model_dir, audited):
    """GRPO on two ranks (ZeRO-2), two rounds of two updates each (the second update's
    ratio against the round's stored old log-probs): both rounds are written for resume,
    and no process of the run opens them to read; the same hook logs a process that does."""
    env, reads = audited
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"{i} + {i} ="}) + "\n"
                               for i in range(8)))  # fmt: skip
    (tmp_path / "even.py").write_text(
        "def reward(rows):\n"
        "    return [sum(t % 2 == 0 for t in r['completion_token_ids']) for r in rows]\n"
    )
    cfg = {
        "run_name": "ranks", "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(tiny_model_dir)},
        "objective": {"name": "grpo"},
        "reward": {"function": "even:reward"},
        "rollout": {"prompts": str(prompts), "samples_per_prompt": 4, "max_tokens": 6,
                    "updates_per_round": 2},
        "training": {"seed": 0, "learning_rate": 1e-3, "global_batch_size": 4,
                     "micro_batch_size": 2, "max_steps": 4},
        "deepspeed": {"zero_stage": 2},
        "launcher": {"nproc": 2},
    }  # fmt: skip
    path = tmp_path / "ranks.yaml"
    path.write_text(yaml.safe_dump(cfg))
    pt_train = Path(sys.executable).parent / "pt-train"
    done = subprocess.run([str(pt_train), "run", str(path)], capture_output=True, text=True,
                          env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = sorted((tmp_path / "runs" / "ranks" / "rounds").glob("round-*/rollouts.jsonl"))
    assert len(rounds) == 2
    assert sorted(p.name for p in rounds[0].parent.iterdir()) == [
        "meta.json",
        "old-logps-rank0.pt",
        "old-logps-rank1.pt",
        "rollouts.jsonl",
    ]
    assert reads.read_text() == ""
    # the hook sees a read where one is made
    reader = f"from pt_core.files import iter_rows; list(iter_rows({str(rounds[0])!r}))"
    subprocess.run([sys.executable, "-c", reader], env=env, check=True, timeout=300)
    assert reads.read_text() == f"- {rounds[0]}\n"
