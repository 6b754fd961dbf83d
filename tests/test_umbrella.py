"""`pt TOOL ...` is `pt-TOOL ...`: the same exit codes (85 after a checkpoint on SIGTERM),
the same manifest on stdout, pipes that close (pt train run | pt rollout generate
--model -), and shell completion that reaches each tool's verbs and options."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pt_core.contracts import REQUEUE_EXIT_CODE

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def complete(words: str) -> list[str]:
    """What bash completion offers for the command line ``words``."""
    parts = words.split()
    cword = len(parts) if words.endswith(" ") else len(parts) - 1
    env = {**ENV, "_PT_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
    proc = subprocess.run([BIN / "pt"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_completion_reaches_the_tools_verbs_and_options():
    assert complete("pt tr") == ["train"]
    assert complete("pt train r") == ["run"]
    assert "--model" in complete("pt rollout generate --mo")
    assert {"build", "inspect", "stats", "pairs"} <= set(complete("pt data "))
    assert complete("pt chat --tem") == ["--temperature"]  # pt chat is pt rollout chat
    # --show-completion writes the script of the shell it runs under, found among its
    # parent processes: run it from bash, as a user does (`; true` keeps bash from
    # replacing itself with the command, which would leave the test process as its parent)
    script = subprocess.run(
        ["bash", "-c", f"'{BIN / 'pt'}' --show-completion; true"],
        capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    assert "_PT_COMPLETE=complete_bash" in script.stdout, script.stderr


@pytest.fixture(scope="module")
def train_config(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("umbrella")
    rows = [
        {"input_ids": list(range(5, 5 + n)), "labels": [-100, *range(6, 5 + n)]}
        for n in (6, 9, 12, 7)
    ]
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "train.yaml").write_text(
        f"run_name: tiny\noutput_dir: {root / 'runs'}\n"
        f"model:\n  init:\n    tokenizer: {tiny_tokenizer_dir}\n"
        "    hidden_size: 64\n    num_layers: 1\n    num_heads: 1\n"
        f"data:\n  path: {root / 'rows.jsonl'}\n"
        "training:\n  max_steps: 60\n  global_batch_size: 2\n  micro_batch_size: 2\n"
        "  save_steps: 20\n"
    )
    return root


@pytest.mark.slow
def test_requeue_code_and_manifest_pass_through_pt_unchanged(train_config):
    config, run = train_config / "train.yaml", train_config / "runs" / "tiny"
    proc = subprocess.Popen(
        [BIN / "pt", "train", "run", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    metrics = run / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == REQUEUE_EXIT_CODE, err  # pt-slurm requeues on it
    assert out == ""  # stopped: no manifest

    resumed = subprocess.run(
        [BIN / "pt", "train", "run", config], capture_output=True, text=True, env=ENV
    )
    assert resumed.returncode == 0, resumed.stderr
    manifest = json.loads(resumed.stdout)
    assert resumed.stdout.count("\n") == 1 and manifest["step"] == 60
    # The finished run again, through pt and through pt-train: the same bytes on stdout.
    via_pt = subprocess.run([BIN / "pt", "train", "run", config], capture_output=True, env=ENV)
    direct = subprocess.run([BIN / "pt-train", "run", config], capture_output=True, env=ENV)
    assert via_pt.returncode == direct.returncode == 0
    assert via_pt.stdout == direct.stdout == resumed.stdout.encode()


@pytest.mark.slow
def test_pt_train_pipes_into_pt_rollout_generate(train_config, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": 1, "prompt": "1+1="}\n')
    train = subprocess.Popen(
        [BIN / "pt", "train", "run", train_config / "train.yaml"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=ENV,
    )
    generate = subprocess.run(
        [BIN / "pt", "rollout", "generate", "--model", "-", "--prompts", prompts,
         "--out", tmp_path / "r.jsonl", "--n", "1", "--max-tokens", "3", "--engine", "hf"],
        stdin=train.stdout, capture_output=True, text=True, env=ENV,
    )  # fmt: skip
    train.stdout.close()
    assert train.wait() == 0
    assert generate.returncode == 0, generate.stderr
    rollouts = json.loads(generate.stdout)
    step = train_config / "runs" / "tiny" / "inference" / "step-60"
    assert rollouts["kind"] == "rollouts" and rollouts["model"] == str(step.resolve())


def test_pt_chat_is_pt_rollout_chat(tiny_model_dir):
    """`pt chat` (as `trl chat` and `llamafactory-cli chat` are at their tools' top) runs
    `pt-rollout chat`: the same help, and the same refusal when nothing is a terminal."""
    help_via_pt = subprocess.run(
        [BIN / "pt", "chat", "--help"], capture_output=True, text=True, env=ENV
    )
    direct = subprocess.run(
        [BIN / "pt", "rollout", "chat", "--help"], capture_output=True, text=True, env=ENV
    )
    assert help_via_pt.returncode == direct.returncode == 0
    assert help_via_pt.stdout == direct.stdout and "Usage: pt rollout chat" in direct.stdout
    refused = [
        subprocess.run([BIN / tool, *words, tiny_model_dir], input="hi\n", capture_output=True,
                       text=True, env=ENV)
        for tool, words in (("pt", ["chat"]), ("pt-rollout", ["chat"]))
    ]  # fmt: skip
    assert refused[0].returncode == refused[1].returncode == 2
    assert refused[0].stderr == refused[1].stderr
    assert "reads what you type from a terminal" in refused[0].stderr


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_pt_chat_talks_with_a_checkpoint_in_a_terminal(tiny_model_dir, tmp_path):
    """In a terminal: the chat's prompt, a reply, /exit, exit code 0."""
    session = f"pt-chat-alias-{os.getpid()}"
    script = (
        f"{BIN / 'pt'} chat {tiny_model_dir} --temperature 0 --max-tokens 4; "
        "echo chat exited $?; sleep 60"
    )
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "40", "-c", str(tmp_path),
         script],
        check=True, env=ENV,
    )  # fmt: skip

    def wait_for(text: str, count: int = 1) -> str:
        deadline = time.monotonic() + 180
        while True:
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
            if screen.count(text) >= count:
                return screen
            assert time.monotonic() < deadline, f"{text!r} never showed:\n{screen}"
            time.sleep(0.2)

    try:
        wait_for("you>")
        subprocess.run(["tmux", "send-keys", "-t", session, "What is 2 + 2?", "Enter"], check=True)
        assert "model>" in wait_for("you>", 2)
        subprocess.run(["tmux", "send-keys", "-t", session, "/exit", "Enter"], check=True)
        assert "Traceback" not in wait_for("chat exited 0")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
