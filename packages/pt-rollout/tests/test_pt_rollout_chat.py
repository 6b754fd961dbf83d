"""``pt-rollout chat``: a conversation in the terminal, rendered with the model's chat
template, streamed, and ended at the template's end-of-turn token; /system, /reset and
/exit. The model here answers every turn with "4" and then ``<|im_end|>``: the reply is
"4" only because the chat stops at the end-of-turn token (the same model would go on
"4<|im_end|>4<|im_end|>..." up to --max-tokens)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def says_four(tmp_path_factory, tiny_tokenizer):
    """A 2-layer Llama whose layers add nothing (zero output projections), so the hidden
    state is the current token's embedding; one dimension of it is +1 for every token but
    "4" (-1 there), the final norm keeps only that dimension, and the head maps + to "4"
    and - to <|im_end|>: after any token it says "4", after "4" it ends its turn."""
    import torch

    from pt_train.model import build_llama

    four = tiny_tokenizer.encode("4", add_special_tokens=False)
    assert len(four) == 1
    four = four[0]
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = model.model.embed_tokens.weight
        embed[:, 0] = 1.0
        embed[four, 0] = -1.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[four, 0] = 10.0
        model.lm_head.weight[end, 0] = -10.0
    out = tmp_path_factory.mktemp("says-four")
    model.save_pretrained(str(out))
    tiny_tokenizer.save_pretrained(str(out))
    return out


@pytest.mark.slow
def test_a_reply_is_streamed_and_ends_at_the_end_of_turn_token(says_four, tiny_tokenizer):
    from pt_rollout.chat import Chat

    chat = Chat(str(says_four), temperature=0, max_tokens=16, system="Be brief.")
    user = "What is 2 + 2?"
    # the prompt is the model's own template over the system prompt and the user's turn
    expected = tiny_tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": user}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert tiny_tokenizer.decode(chat.prompt_ids(user)) == expected
    shown = io.StringIO()
    assert chat.reply(user, shown) == "4"
    assert shown.getvalue() == "4\n"
    assert chat.messages == [
        {"role": "user", "content": user},
        {"role": "assistant", "content": "4"},
    ]


@pytest.mark.slow
def test_system_and_reset_start_the_conversation_over_and_exit_stops_reading(says_four):
    from pt_rollout.chat import Chat, run_chat

    chat = Chat(str(says_four), temperature=0, max_tokens=16)
    lines = iter(
        ["What is 2 + 2?", "/system Answer with a number.", "/bogus", "And 3 + 1?", "/reset",
         "/exit", "never read"]
    )  # fmt: skip
    history = []  # the conversation as it stands before each line is read

    def read(prompt):
        history.append(list(chat.messages))
        return next(lines)

    shown = io.StringIO()
    run_chat(chat, read, shown)
    asked = {"role": "user", "content": "And 3 + 1?"}
    # the first turn is gone after /system; the second is all there is before /reset
    assert history[4] == [asked, {"role": "assistant", "content": "4"}]
    assert chat.messages == [] and chat.system == "Answer with a number."
    system_turn = "<|im_start|>system\nAnswer with a number.<|im_end|>"
    assert system_turn in chat.tokenizer.decode(chat.prompt_ids("x"))
    assert next(lines) == "never read"
    text = shown.getvalue()
    assert text.count("model> 4\n") == 2
    assert "(system prompt: Answer with a number.; the conversation is cleared)" in text
    assert "(unknown command /bogus; /system TEXT:" in text
    assert text.endswith("(the conversation is cleared)\n")


def test_without_a_terminal_to_type_in_it_stops_before_loading_the_model(tmp_path):
    """The manifest piped in and no terminal (a job, a CI step): one error, exit 2."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"kind": "checkpoint", "path": str(tmp_path)}) + "\n")
    (tmp_path / "config.json").write_text("{}")
    with open(manifest) as stdin:
        proc = subprocess.run(
            [Path(sys.executable).with_name("pt-rollout"), "chat", "-"],
            stdin=stdin,
            capture_output=True,
            text=True,
            start_new_session=True,  # no controlling terminal
        )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: pt-rollout chat reads what you type from a terminal" in proc.stderr


class Tmux:
    """A detached tmux session running one command; keys typed into it, its screen read."""

    def __init__(self, name: str, command: str, cwd: Path):
        self.name = name
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", name, "-x", "120", "-y", "50", "-c", str(cwd),
             command],
            check=True,
        )  # fmt: skip

    def type(self, line: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, "-l", line], check=True)
        subprocess.run(["tmux", "send-keys", "-t", self.name, "Enter"], check=True)

    def screen(self) -> str:
        """What the terminal shows (each line's trailing spaces dropped)."""
        proc = subprocess.run(
            ["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True
        )
        return proc.stdout

    def wait_for(self, text: str, count: int = 1, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if screen.count(text) >= count:
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{text!r} (x{count}) never showed; the screen:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_chat_in_a_terminal_with_the_manifest_piped_in(says_four, tmp_path):
    """The checkpoint manifest on stdin, what the user types from the terminal."""
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"kind": "checkpoint", "path": str(says_four)}) + "\n")
    chat = Path(sys.executable).with_name("pt-rollout")
    command = (
        f"cat {manifest} | {chat} chat - --temperature 0 --max-tokens 16; "
        "echo chat exited $?; sleep 60"
    )
    tmux = Tmux(f"pt-chat-{tmp_path.name}", command, tmp_path)
    try:
        tmux.wait_for("you>")  # capture-pane drops the space after it
        tmux.type("What is 2 + 2?")
        screen = tmux.wait_for("you>", 2)
        assert "you> What is 2 + 2?\nmodel> 4\nyou>" in screen
        tmux.type("/system Answer with a number.")
        tmux.wait_for("(system prompt: Answer with a number.; the conversation is cleared)")
        tmux.type("/reset")
        tmux.wait_for("(the conversation is cleared)")
        tmux.type("/exit")
        screen = tmux.wait_for("chat exited 0")
        assert "Traceback" not in screen
    finally:
        tmux.close()
