"""A model path that is not there, or a hub name that cannot be fetched, stops ``pt-train
run`` at once (not after transformers' ~50 s of retries) with one error that names the
model path, whether HF_HUB_OFFLINE is set or the hub is merely out of reach."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from pt_core.errors import ConfigError

CHAT = {"messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}]}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hub_env(tmp_path, offline: bool) -> dict:
    """The environment with an empty Hugging Face cache, and either HF_HUB_OFFLINE=1 or no
    offline variable and a hub endpoint nobody answers at (no route to the hub, on any
    machine)."""
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-cache"), "OMP_NUM_THREADS": "1"}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy"):  # fmt: skip
        env.pop(name, None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed_port()}"
    return env


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE=1", "hub-unreachable"])
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("./models/qwen2.5-0.5b", "is not a directory (no such path)"),
        ("Qwen/Qwen2.5-0.5B", "is not a directory and "),
    ],
    ids=["mistyped-path", "hub-name"],
)
def test_a_model_that_is_not_there_fails_at_once(tmp_path, name, reason, offline):
    (tmp_path / "chats.jsonl").write_text(json.dumps(CHAT) + "\n")
    config = {
        "run_name": "run",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": name},
        "data": {"path": str(tmp_path / "chats.jsonl")},
        "objective": {"name": "sft"},
        "training": {"max_steps": 1, "global_batch_size": 1, "micro_batch_size": 1},
    }
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(config))
    pt_train = os.path.join(os.path.dirname(sys.executable), "pt-train")
    start = time.monotonic()
    proc = subprocess.run(
        [pt_train, "run", tmp_path / "train.yaml"],
        capture_output=True,
        text=True,
        env=hub_env(tmp_path, offline),
        cwd=tmp_path,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    # not after transformers' retries of an unreachable hub (about 52 s here): a bound
    # that separates the two on a loaded machine, not a speed figure
    assert elapsed < 30, elapsed
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    # one error line (and its fix) naming the model path, not the tokenizer
    assert lines[0].startswith(f"error: model.name_or_path {name!r} {reason}"), lines
    assert len(lines) == 2 and lines[1].startswith("  fix:"), lines
    if name.startswith("Qwen"):
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"
        assert why in lines[0]


def test_the_model_path_is_checked_when_the_tokenizer_is_given_apart(monkeypatch, tiny_tokenizer):
    from pt_train.config import ModelConfig
    from pt_train.model import load_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = ModelConfig(name_or_path="./models/typo", tokenizer="unused-here")
    with pytest.raises(ConfigError) as err:
        load_model(cfg, tiny_tokenizer, dtype=None, seed=0)
    assert (
        err.value.message == "model.name_or_path './models/typo' is not a directory (no such path)"
    )


def test_a_teacher_that_is_not_there_is_named(monkeypatch, tiny_tokenizer):
    from pt_train.model import check_same_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as err:
        check_same_tokenizer(tiny_tokenizer, "runs/teacher/inference/step-9", "teacher")
    assert err.value.message == (
        "objective.teacher.path 'runs/teacher/inference/step-9' is not a directory (no such path)"
    )
