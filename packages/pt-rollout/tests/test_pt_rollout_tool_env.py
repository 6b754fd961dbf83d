"""The built-in tool environment (``environment: {name: tools}``): the policy's calls, read
in the template's format, are answered by the tools' results, appended as ids with mask 0;
a turn without a call ends the episode; calls, tool errors and parse failures are counted
per episode as a hand count of the turns says."""

from __future__ import annotations

import json

import pytest

from pt_core.errors import ConfigError
from pt_rollout.engines import Completion
from pt_rollout.episodes import EnvironmentConfig, EpisodeRunner, TurnTemplate, episode_row
from pt_rollout.episodes.environment import open_environment

CALC = '''
def multiply(a: int, b: int) -> int:
    """Multiply two whole numbers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: the dividend
        b: the divisor
    """
    return a / b
'''


@pytest.fixture
def calc(tmp_path):
    path = tmp_path / "calc.py"
    path.write_text(CALC)
    return path


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def qwen_turns(tokenizer, texts: list[str]) -> list[Completion]:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [Completion(tokenizer(t, add_special_tokens=False).input_ids + [end], "stop")
            for t in texts]  # fmt: skip


def row(index: int, prompt: str, answer: str):
    from pt_rollout.prompts import PromptRow

    return PromptRow(index, prompt, {"id": index, "prompt": prompt, "answer": answer}, index)


def runner_for(cfg: EnvironmentConfig, tokenizer) -> tuple[EpisodeRunner, TurnTemplate]:
    environment = open_environment(cfg, tokenizer)
    template = TurnTemplate(tokenizer, tools=environment.tools)
    template.check()
    runner = EpisodeRunner(environment, template, max_turns=cfg.max_turns,
                           max_tokens=cfg.max_tokens, seed=0)  # fmt: skip
    return runner, template


def test_a_call_is_answered_by_the_tool_and_the_answer_ends_the_episode(qwen_tokenizer, calc):
    """On Qwen2.5's template: the opening renders the tool's schema; turn 1 calls
    multiply, the tool's result (408) comes back as the template's tool response, appended
    after the sampled ids with mask 0; turn 2 has no call and ends the episode."""
    cfg = EnvironmentConfig(name="tools", tools=[f"{calc}:multiply"], max_turns=4)
    runner, template = runner_for(cfg, qwen_tokenizer)
    try:
        episode = runner.start(row(0, "What is 12 * 34?", "408"), 0)
        opening = qwen_tokenizer.decode(episode.prompt_ids)
        assert '"name": "multiply"' in opening and "<tool_call>" in opening
        turns = qwen_turns(qwen_tokenizer, [call("multiply", a=12, b=34), "It is 408."])
        for turn in turns:
            runner.advance([episode], [turn], version=0)
        assert episode.stop_reason == "done"
        tool_message = {"role": "tool", "name": "multiply", "content": "408"}
        assert episode.messages[-2:] == [
            tool_message,
            {"role": "assistant", "content": "It is 408."},
        ]
        answer = template.append([tool_message])
        assert "<tool_response>\n408\n</tool_response>" in qwen_tokenizer.decode(answer)
        assert episode.ids == turns[0].token_ids + answer + turns[1].token_ids
        assert episode.mask == ([1] * len(turns[0].token_ids) + [0] * len(answer)
                                + [1] * len(turns[1].token_ids))  # fmt: skip
        # the environment read the call from the turn's text with its special tokens
        assert episode.messages[1]["content"] == call("multiply", a=12, b=34)
        got = episode_row(episode)
        assert (got["tool_calls"], got["tool_errors"], got["parse_failures"]) == (1, 0, 0)
        assert got["completion"] == "It is 408." and got["num_turns"] == 2
    finally:
        runner.environment.close()


def test_tool_errors_and_parse_failures_are_counted_as_the_turns_say(qwen_tokenizer, calc):
    """Turn 1: a call to an unknown tool, a call with a string for an int, and a call
    that is not JSON (1 parse failure, 2 calls read, both errors). Turn 2: a division by
    zero (the tool raises: 1 call, 1 error) and a right call. Turn 3: the answer. Totals
    by hand: 4 calls, 3 errors, 1 parse failure; each error is answered as a tool message
    that says what went wrong."""
    cfg = EnvironmentConfig(name="tools", tools=[f"{calc}:multiply", f"{calc}:divide"])
    runner, _ = runner_for(cfg, qwen_tokenizer)
    try:
        episode = runner.start(row(1, "Work it out.", "6"), 0)
        texts = [
            call("add", a=1, b=2) + call("multiply", a="two", b=3)
            + "<tool_call>\n{name: multiply}\n</tool_call>",
            call("divide", a=1, b=0) + call("multiply", a=2, b=3),
            "6",
        ]  # fmt: skip
        for turn in qwen_turns(qwen_tokenizer, texts):
            runner.advance([episode], [turn], version=0)
        assert episode.stop_reason == "done"
        assert episode.counts == {"tool_calls": 4, "tool_errors": 3, "parse_failures": 1}
        tools = [m["content"] for m in episode.messages if m["role"] == "tool"]
        assert len(tools) == 5
        assert "there is no tool 'add'" in tools[0]
        assert "multiply arguments" in tools[1] and "'a'" in tools[1]
        assert "could not be read" in tools[2] and "not JSON" in tools[2]
        assert "ZeroDivisionError" in tools[3]
        assert tools[4] == "6"
        got = episode_row(episode)
        assert (got["tool_calls"], got["tool_errors"], got["parse_failures"]) == (4, 3, 1)
    finally:
        runner.environment.close()


def test_an_episode_at_max_turns_ends_on_its_last_call(qwen_tokenizer, calc):
    """A policy that calls a tool at every turn stops at max_turns: the last call is
    still answered in the conversation, but no ids follow the last turn."""
    cfg = EnvironmentConfig(name="tools", tools=[f"{calc}:multiply"], max_turns=2)
    runner, _ = runner_for(cfg, qwen_tokenizer)
    try:
        episode = runner.start(row(2, "Again.", "1"), 0)
        turns = qwen_turns(qwen_tokenizer, [call("multiply", a=1, b=1)] * 2)
        for turn in turns:
            runner.advance([episode], [turn], version=0)
        assert episode.stop_reason == "max_turns"
        assert episode.ids[-len(turns[1].token_ids) :] == turns[1].token_ids
        assert episode.counts["tool_calls"] == 2
    finally:
        runner.environment.close()


def test_a_template_without_tool_calls_or_tools_is_refused(tiny_tokenizer, calc):
    """A template that writes no tool calls is refused (which format would the policy's
    calls be in?); one given a format but that does not render the tools' schemas is
    refused too (the policy would never see them); the tool environment's keys are
    refused beside another environment, and without tools."""
    plain = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    plain.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
        "+ '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    cfg = EnvironmentConfig(name="tools", tools=[f"{calc}:multiply"])
    with pytest.raises(ConfigError, match="writes tool calls in no format"):
        open_environment(cfg, plain)
    cfg = cfg.model_copy(update={"tool_format": "hermes"})
    environment = open_environment(cfg, plain)
    try:
        with pytest.raises(ConfigError, match="does not render the tools offered"):
            TurnTemplate(plain, tools=environment.tools)
    finally:
        environment.close()
    with pytest.raises(ValueError, match="offers no tools"):
        EnvironmentConfig(name="tools")
    with pytest.raises(ValueError, match="environment.tools is read by the built-in"):
        EnvironmentConfig(name="episode_envs:Guess", tools=["python"])


def test_a_template_that_drops_tool_messages_is_refused(tiny_tokenizer):
    """A template that renders no tool turns would show the policy none of the tools'
    answers: refused when the template is checked, naming the role."""
    dropping = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    dropping.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'tool' %}{{ '<|im_start|>' + m['role'] "
        "+ '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(ConfigError, match="drops the content of a tool message"):
        TurnTemplate(dropping).check()


def test_generate_refuses_grade(tmp_path, tiny_tokenizer, calc):
    """``grade`` adds a training run's reward: generate refuses it (it writes the
    environment's rewards only)."""
    from pt_rollout.episodes.generate import EpisodeBatches

    section = tmp_path / "env.yaml"
    section.write_text(f"name: tools\ntools: ['{calc}:multiply']\ngrade: true\n")
    options = type("Options", (), {"env": str(section), "max_turns": None,
                                   "max_episode_tokens": None, "seed": 0, "stop": []})()  # fmt: skip
    with pytest.raises(ConfigError, match="environment.grade adds a training run's reward"):
        EpisodeBatches(tiny_tokenizer, options)


def test_the_opening_is_the_rows_prompt_after_the_system_message(qwen_tokenizer, calc):
    """The prompt is read from the first of the prompt columns the prompts are read by
    (here ``question``); ``options.system`` comes before it, unless the row's messages
    have a system message of their own."""
    cfg = EnvironmentConfig(name="tools", tools=[f"{calc}:multiply"],
                            options={"system": "Use the tools."})  # fmt: skip
    environment = open_environment(cfg, qwen_tokenizer)
    try:
        assert environment.reset({"question": "2*3?"}, "0") == (
            [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "2*3?"}],
            None,
        )
        own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "x"}]
        assert environment.reset({"messages": own}, "1")[0] == own
    finally:
        environment.close()


@pytest.mark.slow  # builds the real-shape model and plays its episodes
def test_the_episode_bench_runs_every_turn_and_finds_the_re_rendering_drift():
    """bench/episodes.py at its smallest: every episode runs its turns, the peer's
    re-rendering of random-weight turns differs from the ids sampled, and the JSON line
    carries each way's time outside generation."""
    import subprocess
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[3] / "bench" / "episodes.py"
    done = subprocess.run([sys.executable, str(bench), "--episodes", "2", "--turns", "2",
                           "--turn-tokens", "6"], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["turns"] == 2 and result["episodes"] == 2
    assert result["episode_tokens"] > 2 * 6  # two turns and the tool's answer between them
    assert result["pt_outside_s"] > 0 and result["peer_outside_s"] > 0
    # the fraction is of the unrounded times: within the seconds' rounding to 1e-3 s
    implied = result["pt_outside_fraction"] * result["generate_s"]
    assert abs(implied - result["pt_outside_s"]) <= 1e-3
    assert 0 <= result["drifted"] <= 2
