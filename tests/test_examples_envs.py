"""The examples of environments (examples/calculator, examples/guess): their configs are
accepted, their scripts pass shellcheck, the calculator the example's policy calls is the
one pt-data's traces call, and each script runs end to end at a small size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from shell import sh, tools_path
from test_examples import assert_shellcheck_passes

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CONFIGS = [EXAMPLES / "calculator" / f"{n}.yaml" for n in ("sft", "grpo")] + [
    EXAMPLES / "guess" / f"{n}.yaml" for n in ("sft", "grpo")
]


def test_the_scripts_pass_shellcheck():
    assert_shellcheck_passes(EXAMPLES / "calculator" / "run.sh", EXAMPLES / "guess" / "run.sh")


@pytest.mark.parametrize("path", CONFIGS, ids=[f"{p.parent.name}/{p.name}" for p in CONFIGS])
def test_the_training_configs_pass_pt_train_check(cli, path):
    cli("pt-train", "check", path)


def test_the_direct_arms_data_config_validates():
    from pt_data.config import load_data_config

    assert load_data_config(EXAMPLES / "calculator" / "direct-data.yaml").datasets


def test_the_calculator_is_the_tool_the_synthetic_traces_call():
    """calc.py's multiply, as the tool environment offers it (the schema from its signature
    and docstring), is the tool the rows of ``pt-data synth calculator`` list in their
    tools column."""
    import importlib.util

    from pt_data.synth import multiply_schema
    from pt_rollout.tools.schema import function_schema

    spec = importlib.util.spec_from_file_location("calc", EXAMPLES / "calculator" / "calc.py")
    assert spec is not None and spec.loader is not None
    calc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calc)
    assert function_schema(calc.multiply, "calc.py:multiply") == multiply_schema()
    assert calc.multiply(12345, 67890) == 838102050


def small_run(tmp_path: Path, script: str, **sizes: int) -> tuple[Path, str]:
    env = {**os.environ, "PATH": tools_path(), "PT_NO_SYNC": "1", "OMP_NUM_THREADS": "1",
           **{k: str(v) for k, v in sizes.items()}}  # fmt: skip
    proc = sh(f"bash {EXAMPLES / script / 'run.sh'}", tmp_path, env)
    return tmp_path / f"{script}-out", proc.stdout


@pytest.mark.slow
def test_the_calculator_example_runs_end_to_end_at_a_small_size(tmp_path):
    """run.sh on 200 problems, 4 SFT steps per arm and 2 of GRPO: every model evaluated,
    the tool arm's as episodes in the tool environment (a row per sample, its calls
    counted), the table printed and GRPO's reward curve drawn."""
    out, stdout = small_run(tmp_path, "calculator", PT_CALCULATOR_TRAIN=200, PT_CALCULATOR_TEST=10,
                            PT_CALCULATOR_SFT_STEPS=4, PT_CALCULATOR_WARM=2,
                            PT_CALCULATOR_GRPO_STEPS=2, PT_CALCULATOR_SAMPLES=2)  # fmt: skip
    for name in ("direct", "warm", "tool", "grpo"):
        rows = [json.loads(x) for x in (out / "grades" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == 20
        assert all(("tool_calls" in r) == (name != "direct") for r in rows)
    assert "5-digit products, 20 held-out samples each" in stdout
    assert "tool, GRPO" in stdout
    assert (out / "reward.png").stat().st_size > 0
    rounds = list((out / "runs" / "grpo" / "rounds").glob("round-*/rollouts.jsonl"))
    assert rounds and all("tool_calls" in json.loads(p.read_text().splitlines()[0]) for p in rounds)


@pytest.mark.slow
def test_the_guessing_game_example_runs_end_to_end_at_a_small_size(tmp_path):
    """run.sh with 4 SFT steps and 2 of GRPO: both models play 10 test games twice as
    episodes of guess.py's Guess, the table is printed and GRPO's reward curve drawn."""
    out, stdout = small_run(tmp_path, "guess", PT_GUESS_SFT_STEPS=4, PT_GUESS_GRPO_STEPS=2,
                            PT_GUESS_TEST=10, PT_GUESS_SAMPLES=2)  # fmt: skip
    for name in ("sft", "grpo"):
        rows = [
            json.loads(x) for x in (out / "rollouts" / f"{name}.jsonl").read_text().splitlines()
        ]
        assert len(rows) == 20 and all(1 <= r["num_turns"] <= 4 for r in rows)
    assert "10 held-out games, 2 plays each" in stdout and "SFT + GRPO" in stdout
    assert (out / "reward.png").stat().st_size > 0


def load_example(folder: str, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", EXAMPLES / folder / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guess_reports_figures_are_the_hand_counts():
    """Three games of secret 7, counted by hand: guesses after the first 2 + 3 + 0 = 5, of
    which outside what the answers left open 1 (game 1: 3 after "lower" at 5) + 2 (game 2:
    2 after "higher" at 4, 9 after "lower" at 8) = 3; won 2 of 3; turns 3, 4, 1."""
    report = load_example("guess", "report.py")

    def game(*turns: str) -> list[dict]:
        messages = [{"role": "user", "content": "Guess my number from 1 to 10."}]
        for guess in turns:
            messages.append({"role": "assistant", "content": guess})
            if guess != "7":
                messages.append(
                    {"role": "user", "content": "higher" if int(guess) < 7 else "lower"}
                )
        return messages

    rows = [
        {"id": "a", "messages": game("9", "3", "7"), "env_reward": 1.0, "num_turns": 3},
        {"id": "a", "messages": game("4", "2", "8", "9"), "env_reward": 0.0, "num_turns": 4},
        {"id": "b", "messages": game("7"), "env_reward": 1.0, "num_turns": 1},
    ]
    assert report.contradictions(rows[0]["messages"]) == (2, 0)
    rows[0]["messages"] = game("5", "3", "7")  # 3 after "higher" at 5: against it
    assert report.contradictions(rows[0]["messages"]) == (2, 1)
    s = report.summary(rows)
    assert (s["n"], s["games"]) == (3, 2)
    assert s["reward"] == pytest.approx(2 / 3)
    assert s["turns"] == pytest.approx(8 / 3)
    assert s["contradicting"] == pytest.approx(3 / 5)


def test_the_calculator_reports_figures_are_the_hand_counts():
    """Four graded episodes: 2 correct, 3 with a call, 1 tool error and 2 parse failures
    in all, one answer not found."""
    report = load_example("calculator", "report.py")
    rows = [
        {"correct": True, "tool_calls": 1, "tool_errors": 0, "parse_failures": 0, "extracted": "6"},
        {"correct": True, "tool_calls": 2, "tool_errors": 1, "parse_failures": 0, "extracted": "8"},
        {
            "correct": False,
            "tool_calls": 1,
            "tool_errors": 0,
            "parse_failures": 2,
            "extracted": "9",
        },
        {
            "correct": False,
            "tool_calls": 0,
            "tool_errors": 0,
            "parse_failures": 0,
            "extracted": None,
        },
    ]
    s = report.summary(rows)
    assert (s["n"], s["accuracy"], s["called"], s["no_answer"]) == (4, 0.5, 0.75, 1)
    assert s["stderr"] == pytest.approx((0.5 * 0.5 / 4) ** 0.5)
    assert (s["tool_errors"], s["parse_failures"]) == (0.25, 0.5)
