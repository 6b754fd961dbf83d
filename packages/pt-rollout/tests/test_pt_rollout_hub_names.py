"""``--model`` given a hub name that neither the hub nor the local cache can serve, or a
path that is not there, stops pt-rollout at once with one error (exit 2), whether
HF_HUB_OFFLINE is set or the hub is merely out of reach, before an engine retries."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE=1", "hub-unreachable"])
@pytest.mark.parametrize(
    ("model", "first_line"),
    [
        ("./models/qwen2.5-0.5b", "error: --model ./models/qwen2.5-0.5b: no such directory"),
        ("Qwen/Qwen2.5-0.5B", "error: --model 'Qwen/Qwen2.5-0.5B' is not a directory and "),
    ],
    ids=["mistyped-path", "hub-name"],
)
def test_a_model_that_cannot_be_loaded_fails_at_once(tmp_path, model, first_line, offline):
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"id": "1", "prompt": "2 + 2?"}) + "\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy",
                 "ALL_PROXY", "all_proxy"):  # fmt: skip
        env.pop(name, None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:  # no route to the hub on any machine: nothing answers at a closed local port
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{closed_port()}"
    pt_rollout = os.path.join(os.path.dirname(sys.executable), "pt-rollout")
    start = time.monotonic()
    proc = subprocess.run(
        [
            pt_rollout,
            "generate",
            "--model",
            model,
            "--prompts",
            "prompts.jsonl",
            "--out",
            "o.jsonl",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert time.monotonic() - start < 5
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(first_line), lines
    assert len(lines) == 2 and lines[1].startswith("  fix:"), lines
    if model.startswith("Qwen"):
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face hub cannot be reached"
        assert why in lines[0] and lines[0].endswith("it is not in the Hugging Face cache")
    assert not (tmp_path / "o.jsonl").exists()
