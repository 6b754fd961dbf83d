"""The online loop's final weights, held as hashes: every schedule and generator kind of
GRPO and OPD ends with the weights it ended with when these hashes were recorded.

The other online-loop tests check what a run does (versions, staleness, pushes, deaths);
a change that moves the numbers of every path alike passes them. These hashes were
recorded from the online loop as one class (before it was split into a schedule, a
round store, generators and weight pushes), so that a change meant to move no number
shows here as the first one that does: when a change is meant to move one, record it
again and say why in the commit.

Bit-equal weights on every x86-64 CPU: the runs are plain processes with one thread,
torch's scalar kernels (``ATEN_CPU_CAPABILITY=default``) and MKL's reproducible mode
(``MKL_CBWR=COMPATIBLE``), so that neither the vector width of the CPU nor the cache
sizes that MKL and oneDNN block their loops by change a sum's order (checked by capping
MKL's and oneDNN's instruction sets: the hashes stay). vLLM's CPU kernels are built per
instruction set (AVX2, AVX-512, AVX-512 with bf16) and chosen by the CPU: its runs'
hash is held for the build it was recorded on, and on every CPU the three ways weights
reach a vLLM engine (files to a process, in memory to a colocated engine, vLLM's
weight-transfer API) end with one hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
VLLM_BIN = REPO / ".venv-vllm" / "bin"
# Arithmetic that is the same on every x86-64 CPU (see the module docstring).
PINNED = {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}

GRPO = {"name": "grpo"}
GRPO_DYNAMIC = {"name": "grpo", "dynamic_sampling": {"enabled": True, "max_tries": 2}}
OPD = {"name": "opd", "loss": "forward_kl", "teacher": {"path": "teacher", "top_k": 4}}

# case -> (objective, reward module, rollout keys, other keys)
CASES = {
    "grpo-sync-local": (GRPO_DYNAMIC, "short", {"updates_per_round": 2}, {}),
    "grpo-sync-server2": (GRPO, "even", {"generator": "server", "servers": 2,
                                         "updates_per_round": 2}, {}),
    "grpo-step_off-server2": (GRPO, "even", {"generator": "server", "servers": 2,
                                             "schedule": "step_off"}, {}),
    "grpo-async-server2": (GRPO, "even", {"generator": "server", "servers": 2,
                                          "schedule": "async", "max_staleness": 2}, {}),
    "grpo-sync-server-zero3-2ranks": (GRPO, "even", {"generator": "server"},
                                      {"launcher": {"nproc": 2},
                                       "deepspeed": {"zero_stage": 3}}),
    "opd-sync-local": (OPD, None, {}, {}),
    "opd-step_off-server": (OPD, None, {"generator": "server", "schedule": "step_off"}, {}),
}  # fmt: skip
VLLM = {"engine": "vllm", "python": "vllm"}  # "vllm": .venv-vllm's, in config()
# schedule -> {case: ...}: the ways weights reach a vLLM engine under that schedule
VLLM_CASES = {
    "sync": {
        "grpo-sync-vllm-server": (GRPO, "even", {"generator": "server", **VLLM}, {}),
        "grpo-sync-vllm-colocate": (GRPO, "even", {"generator": "colocate",
                                                   "engine": "vllm"}, {}),
        "grpo-sync-vllm-gloo": (GRPO, "even", {"generator": "server", **VLLM,
                                               "weight_transfer": "gloo"}, {}),
    },
    "step_off": {
        "grpo-step_off-vllm-server": (GRPO, "even", {"generator": "server", **VLLM,
                                                     "schedule": "step_off"}, {}),
        "grpo-step_off-vllm-gloo": (GRPO, "even", {"generator": "server", **VLLM,
                                                   "schedule": "step_off",
                                                   "weight_transfer": "gloo"}, {}),
    },
    "async": {
        "grpo-async-vllm-server": (GRPO, "even", {"generator": "server", **VLLM,
                                                  "schedule": "async", "max_staleness": 2}, {}),
        "grpo-async-vllm-gloo": (GRPO, "even", {"generator": "server", **VLLM,
                                                "schedule": "async", "max_staleness": 2,
                                                "weight_transfer": "gloo"}, {}),
    },
}  # fmt: skip

# sha256 of the final weights (names and bytes, in name order), first 16 hex digits. OPD's
# were recorded again when it came to compare the student and the teacher at the sampling
# temperature (0.9 here) rather than at 1.
HASHES = {
    "grpo-sync-local": "2de5ff5d226cf7ed",
    "grpo-sync-server2": "b4f02250012d0ed2",
    "grpo-step_off-server2": "7cafab214accb8fc",
    "grpo-async-server2": "cf84a166ddadb129",
    "grpo-sync-server-zero3-2ranks": "89b3856ad0f054a7",
    "opd-sync-local": "9c59d84071ad3a96",
    "opd-step_off-server": "0a89453cd47ba3e2",
}
# vLLM's kernel build (see vllm_kernels) -> the hash of every VLLM_CASES run
VLLM_HASHES = {
    "avx512bf16": {"sync": "01eb7422188518ce", "step_off": "95133c061941e8c1",
                   "async": "cfe8e4ed1575ae54"},
}  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_tokenizer):
    """A student and a teacher (tiny Llamas, head_dim 64 as vLLM's CPU backend wants), 16
    prompts, and two rewards: ``even`` (the share of even token ids: it differs within
    every group, so every step trains) and ``short`` (1 for a completion under 6 tokens:
    some groups are all equal, so dynamic sampling draws more prompts)."""
    from pt_train.model import build_llama

    root = tmp_path_factory.mktemp("online-weights")
    for name, seed in (("student", 0), ("teacher", 1)):
        model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=seed)
        model.save_pretrained(root / name)
        tiny_tokenizer.save_pretrained(root / name)
    with open(root / "prompts.jsonl", "w") as fh:
        for i in range(16):
            row = {"id": f"p{i}", "prompt": f"What is {i} + {2 * i}?", "answer": str(3 * i)}
            fh.write(json.dumps(row) + "\n")
    (root / "even.py").write_text(
        "def reward(rows):\n"
        "    return [sum(t % 2 == 0 for t in r['completion_token_ids'])\n"
        "            / max(1, len(r['completion_token_ids'])) for r in rows]\n"
    )
    (root / "short.py").write_text(
        "def reward(rows):\n    return [float(len(r['completion_token_ids']) < 6) for r in rows]\n"
    )
    return root


def config(world: Path, name: str, case: tuple) -> dict:
    """4 optimizer steps of 8 rows (2 prompts x 4 samples) at temperature 0.9."""
    objective, reward, rollout, other = case
    if "teacher" in objective:
        objective = {**objective, "teacher": {**objective["teacher"],
                                              "path": str(world / "teacher")}}  # fmt: skip
    cfg = {
        "run_name": name,
        "output_dir": str(world / "runs"),
        "model": {"name_or_path": str(world / "student")},
        "objective": objective,
        "rollout": {
            "prompts": str(world / "prompts.jsonl"),
            "samples_per_prompt": 4,
            "max_tokens": 8,
            "temperature": 0.9,
            **rollout,
        },
        "training": {
            "seed": 0,
            "learning_rate": 1e-3,
            "lr_schedule": "constant",
            "global_batch_size": 8,
            "micro_batch_size": 4,
            "max_steps": 4,
        },
        **other,
    }
    if reward is not None:
        cfg["reward"] = {"function": f"{reward}:reward"}
    if rollout.get("python") == "vllm":
        cfg["rollout"]["python"] = str(VLLM_BIN / "python")
    return cfg


def weights_hash(path: Path) -> str:
    """sha256 of a safetensors file's tensors (names and raw bytes, in name order)."""
    tensors = load_file(path)
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def run_case(world: Path, name: str, case: tuple, bindir: Path) -> str:
    """``pt-train run`` of the case as a plain process with pinned arithmetic; the hash of
    its final weights."""
    path = world / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(world, name, case)))
    env = {**os.environ, **PINNED, "PYTHONPATH": str(world)}
    done = subprocess.run(
        [str(bindir / "pt-train"), "run", str(path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found = weights_hash(world / "runs" / name / "inference" / "step-4" / "model.safetensors")
    assert found != weights_hash(world / "student" / "model.safetensors"), "nothing trained"
    return found


@pytest.mark.parametrize("name", list(CASES))
def test_final_weights_are_the_recorded_ones(world, name):
    found = run_case(world, name, CASES[name], Path(sys.executable).parent)
    assert found == HASHES.get(name), f"{name}: final weights {found}, recorded {HASHES.get(name)}"


def vllm_kernels() -> str:
    """The build of vLLM's CPU kernels this CPU gets (vllm.platforms.cpu's choice)."""
    probe = (
        "import torch\n"
        "print('avx512bf16' if torch.cpu._is_avx512_bf16_supported() else "
        "'avx512' if torch.cpu._is_avx512_supported() else 'avx2')\n"
    )
    done = subprocess.run(
        [str(VLLM_BIN / "python"), "-c", probe], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.vllm
@pytest.mark.parametrize("schedule", list(VLLM_CASES))
def test_vllm_paths_end_with_one_weights_and_the_recorded_ones(world, schedule):
    if not (VLLM_BIN / "python").exists():
        if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
            pytest.fail(".venv-vllm is missing (PT_REQUIRE_VLLM=1 / CI requires it)")
        pytest.skip(".venv-vllm is missing: bash .ci/setup-vllm.sh makes it")
    cases = VLLM_CASES[schedule]
    found = {name: run_case(world, name, case, VLLM_BIN) for name, case in cases.items()}
    assert len(set(found.values())) == 1, found
    recorded = VLLM_HASHES.get(vllm_kernels(), {}).get(schedule)
    if recorded is not None:
        assert set(found.values()) == {recorded}, (vllm_kernels(), found)
