"""``pt-rollout chat``: talk with a checkpoint in the terminal.

    pt-rollout chat runs/sft/inference/step-600
    pt-train run train.yaml | pt-rollout chat -

Every turn renders the whole conversation with the model's chat template (or
``--chat-template``), streams the reply as it is sampled (transformers' ``generate`` on
the GPU when there is one, else the CPU), and ends it at the template's end-of-turn token
or the EOS, the tokens ``pt-rollout generate`` stops at. Lines that start with ``/`` are
commands: ``/system TEXT`` sets the system prompt and starts over, ``/reset`` forgets
the conversation, ``/exit`` (or Ctrl-D) ends the chat; Ctrl-C stops a reply.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TextIO

from pt_core.chat import resolve_template
from pt_core.errors import InputError
from pt_rollout.prompts import prompt_token_ids, stop_token_ids

HELP = "/system TEXT: set the system prompt and start over; /reset: start over; /exit: end"


class Chat:
    """A conversation with one model: its messages, and the reply to each new user turn."""

    def __init__(
        self,
        model_path: str,
        *,
        chat_template: str | None = None,
        system: str | None = None,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_tokens: int = 512,
        seed: int = 0,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.chat_template = resolve_template(
            self.tokenizer, chat_template, key="--chat-template"
        )
        self.stop_ids = stop_token_ids(model_path, self.tokenizer)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype="auto")
        # transformers types its @wraps(Module.to) method as unbound
        self.model.to(self.device).eval()  # pyright: ignore[reportArgumentType]
        self.max_length = getattr(self.model.config, "max_position_embeddings", None)
        self.system = system
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.messages: list[dict] = []
        torch.manual_seed(seed)

    def reset(self) -> None:
        self.messages = []

    def prompt_ids(self, user: str) -> list[int]:
        """The conversation so far and ``user``'s turn, rendered up to the reply's start."""
        messages = [*self.messages, {"role": "user", "content": user}]
        return prompt_token_ids(self.tokenizer, messages, system=self.system)

    def reply(self, user: str, out: TextIO) -> str:
        """Stream the reply to ``user`` to ``out`` and add both turns to the conversation;
        a conversation past the model's length is refused with the way out."""
        import torch

        ids = self.prompt_ids(user)
        if self.max_length and len(ids) + self.max_tokens > self.max_length:
            raise InputError(
                f"the conversation is {len(ids)} tokens; with --max-tokens {self.max_tokens} "
                f"it would pass the model's {self.max_length}",
                hint="type /reset to start over",
            )
        streamer = text_streamer(self.tokenizer, out)
        input_ids = torch.tensor([ids], device=self.device)
        sampling = (
            {"do_sample": True, "temperature": self.temperature, "top_p": self.top_p}
            if self.temperature > 0
            else {"do_sample": False}
        )
        with torch.inference_mode():
            # transformers' GenerationMixin protocol does not match its own models
            output = self.model.generate(  # pyright: ignore[reportAttributeAccessIssue]
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                max_new_tokens=self.max_tokens,
                eos_token_id=list(self.stop_ids),
                pad_token_id=self.stop_ids[0] if self.stop_ids else None,
                streamer=streamer,
                **sampling,
            )
        new = output[0, len(ids) :].tolist()
        if new and new[-1] in self.stop_ids:
            new = new[:-1]
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        self.messages += [{"role": "user", "content": user}, {"role": "assistant", "content": text}]
        return text


def text_streamer(tokenizer, out: TextIO):
    """A transformers streamer that writes each piece of a reply to ``out`` as soon as it
    decodes to whole words (special tokens, the end-of-turn one included, left out)."""
    from transformers import TextStreamer

    class Streamer(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            out.write(text + ("\n" if stream_end else ""))
            out.flush()

    return Streamer(tokenizer, skip_prompt=True, skip_special_tokens=True)


def run_chat(chat: Chat, read: Callable[[str], str | None], out: TextIO) -> None:
    """The conversation loop: ``read(prompt)`` gives each line typed after the ``you>``
    prompt, None at the end of the input (Ctrl-D); /exit ends it too."""
    out.write(f"{HELP}\n")
    while True:
        out.flush()
        line = read("you> ")
        if line is None:
            out.write("\n")
            return
        line = line.strip()
        if not line:
            continue
        if line.startswith("/"):
            command, _, rest = line.partition(" ")
            if command == "/exit":
                return
            if command == "/reset":
                chat.reset()
                out.write("(the conversation is cleared)\n")
            elif command == "/system":
                chat.system = rest.strip() or None
                chat.reset()
                said = f"system prompt: {chat.system}" if chat.system else "no system prompt"
                out.write(f"({said}; the conversation is cleared)\n")
            else:
                out.write(f"(unknown command {command}; {HELP})\n")
            continue
        out.write("model> ")
        out.flush()
        try:
            chat.reply(line, out)
        except KeyboardInterrupt:
            out.write("\n(reply stopped; it is not kept)\n")
        except InputError as exc:
            out.write(f"\n({exc.message}; {exc.hint})\n")


def read_terminal(prompt: str) -> str | None:
    """A line typed at the terminal after ``prompt``, with line editing; None at Ctrl-D."""
    import readline  # noqa: F401  (line editing and history for input())

    try:
        return input(prompt)
    except EOFError:
        return None


def attach_terminal() -> None:
    """Read the chat from the terminal when stdin carried the piped manifest."""
    if sys.stdin.isatty():
        return
    try:
        sys.stdin = open("/dev/tty")  # noqa: SIM115  (read until the chat ends)
    except OSError:
        raise InputError(
            "pt-rollout chat reads what you type from a terminal, and there is none",
            hint="run it in a terminal; to answer a file of prompts use pt-rollout generate",
        ) from None
