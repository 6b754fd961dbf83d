"""The online loop on episodes of an environment: GRPO trains on what the generator sampled
(the trainer's log-probs of the policy's tokens are the generator's), and an episode whose
turns were sampled by different weights says so, turn by turn and token by token."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from pt_train.metrics import read_metrics

pytestmark = pytest.mark.slow

ENVS = Path(__file__).resolve().parents[2] / "pt-rollout" / "tests"  # episode_envs.py


def run(tmp_path: Path, model_dir: Path, name: str, **rollout) -> Path:
    """``pt-train run`` of GRPO on the Guess environment (8 prompts, 4 episodes each, at
    most 3 turns of 12 tokens), 4 steps of 8 episodes; its run directory."""
    import subprocess

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": "guess", "secret": 2 + i % 4}) + "\n"
                               for i in range(8)))  # fmt: skip
    cfg = {
        "run_name": name, "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(model_dir)},
        "objective": {"name": "grpo"},
        "environment": {"name": "episode_envs:Guess", "options": {"high": 5}, "max_turns": 3},
        "rollout": {"prompts": str(prompts), "samples_per_prompt": 4, "max_tokens": 12,
                    "temperature": 1.0, **rollout},
        "training": {"seed": 0, "learning_rate": 1e-3, "lr_schedule": "constant",
                     "global_batch_size": 8, "micro_batch_size": 4, "max_steps": 4},
    }  # fmt: skip
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ENVS), "OMP_NUM_THREADS": "1"}
    pt_train = Path(sys.executable).parent / "pt-train"
    done = subprocess.run([str(pt_train), "run", str(path)], capture_output=True, text=True,
                          env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "runs" / name


def rows_of(run_dir: Path) -> list[dict]:
    return [
        json.loads(line)
        for path in sorted((run_dir / "rounds").glob("round-*/rollouts.jsonl"))
        for line in path.read_text().splitlines()
    ]


def test_grpo_on_episodes_trains_the_policys_tokens_at_the_generators_log_probs(
    tmp_path, chatty_model_dir
):
    """Episodes of several turns are played by the policy itself (local generator): the
    trainer's log-probs of the policy's tokens equal those the generator recorded
    (rollout_kl ~ 0: the masks line the two up, the environment's tokens left out), the
    rewards are the environment's, and each round logs its episodes' figures."""
    run_dir = run(tmp_path, chatty_model_dir, "local")
    rows = rows_of(run_dir)
    assert any(r["num_turns"] > 1 for r in rows)
    assert all(r["reward"] == r["env_reward"] for r in rows)  # no reward section: the env's
    metrics = read_metrics(run_dir)
    assert all(m["rollout_kl"] < 1e-6 for m in metrics)
    first = metrics[0]
    assert {"turns", "episode_tokens", "policy_tokens", "env_reward"} <= set(first)
    assert first["policy_tokens"] < first["episode_tokens"]  # the environment's are not trained
    assert all(m["staleness_max"] == 0 and m["samples_spanning_versions"] == 0 for m in metrics)


def test_an_episode_whose_turns_came_from_other_weights_records_each_turns_version(
    tmp_path, chatty_model_dir
):
    """step_off 1 with two generator processes: a round's first turns are asked for while
    the round before trains, its later turns when it is wanted, after the newest weights
    were pushed. Those episodes record both versions, per turn and per token, and the
    metrics count them; the first turns' version is the row's."""
    run_dir = run(tmp_path, chatty_model_dir, "step-off", generator="server", servers=2,
                  schedule="step_off")  # fmt: skip
    rows = rows_of(run_dir)
    spanning = [r for r in rows if len(set(r["token_weight_version"])) > 1]
    assert spanning, "no episode had turns after a push"
    for row in spanning:
        versions = [t["weight_version"] for t in row["turns"] if t["role"] == "policy"]
        assert versions == sorted(versions) and versions[0] < versions[-1]
        assert row["weight_version"] == versions[0]
        policy_ids = sum(t["end"] - t["start"] for t in row["turns"] if t["role"] == "policy")
        assert len(row["token_weight_version"]) == policy_ids
    metrics = read_metrics(run_dir)
    assert max(m["samples_spanning_versions"] for m in metrics) > 0
    assert max(m["token_staleness_max"] for m in metrics) > 0


def test_opd_on_episodes_distils_the_policys_turns_alone(
    tmp_path, chatty_model_dir, other_model_dir
):
    """OPD in episodes: the teacher scores every id of an episode once it is over (the
    environment's are its context), and a step trains the policy's ids alone: its trained
    tokens are the sum of the rows' masks."""
    import subprocess

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": "guess", "secret": 2 + i % 4}) + "\n"
                               for i in range(4)))  # fmt: skip
    cfg = {
        "run_name": "opd", "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(chatty_model_dir)},
        "objective": {"name": "opd", "loss": "forward_kl",
                      "teacher": {"path": str(other_model_dir), "top_k": 4}},
        "environment": {"name": "episode_envs:Guess", "options": {"high": 5}, "max_turns": 3},
        "rollout": {"prompts": str(prompts), "samples_per_prompt": 2, "max_tokens": 12},
        "training": {"seed": 0, "learning_rate": 1e-3, "global_batch_size": 4,
                     "micro_batch_size": 2, "max_steps": 2},
    }  # fmt: skip
    path = tmp_path / "opd.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(ENVS), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "pt-train"), "run", str(path)],
                          capture_output=True, text=True, env=env, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = rows_of(tmp_path / "runs" / "opd")
    assert any(r["num_turns"] > 1 for r in rows)
    for row in rows:
        assert len(row["teacher_topk_ids"]) == len(row["completion_token_ids"])
    metrics = read_metrics(tmp_path / "runs" / "opd")
    per_step = [rows[i : i + 4] for i in range(0, len(rows), 4)]
    assert [m["step_trained_tokens"] for m in metrics] == [
        sum(sum(r["completion_mask"]) for r in step) for step in per_step
    ]
    assert all(m["kl"] is not None and m["kl"] >= 0 for m in metrics)


def test_grpo_in_the_tool_environment_adds_the_reward_section_where_grade_says_so(
    tmp_path, chatty_model_dir
):
    """The built-in tool environment in the online loop, with ``grade: true`` and a reward
    function: each row's reward is the function's value of its last turn (the tool
    environment gives none of its own), every row counts its calls, and each round logs
    the means of the counts."""
    import subprocess

    (tmp_path / "calc.py").write_text(
        'def multiply(a: int, b: int) -> int:\n    """Multiply.\n\n    Args:\n        a: a factor\n'
        '        b: a factor\n    """\n    return a * b\n'
    )
    (tmp_path / "length.py").write_text(
        "def length(rows):\n    return [len(r['completion']) / 10 for r in rows]\n"
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "prompt": f"{i} times 3?", "answer": 3 * i})
                               + "\n" for i in range(4)))  # fmt: skip
    cfg = {
        "run_name": "tools", "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(chatty_model_dir)},
        "objective": {"name": "grpo"},
        "environment": {"name": "tools", "tools": [f"{tmp_path}/calc.py:multiply"],
                        "max_turns": 2, "grade": True},
        "reward": {"function": f"{tmp_path}/length.py:length"},
        "rollout": {"prompts": str(prompts), "samples_per_prompt": 2, "max_tokens": 12},
        "training": {"seed": 0, "learning_rate": 1e-3, "global_batch_size": 4,
                     "micro_batch_size": 4, "max_steps": 2},
    }  # fmt: skip
    path = tmp_path / "tools.yaml"
    path.write_text(yaml.safe_dump(cfg))
    pt_train = Path(sys.executable).parent / "pt-train"
    done = subprocess.run([str(pt_train), "run", str(path)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "tools"
    rows = rows_of(run_dir)
    assert len(rows) == 8
    for row in rows:
        assert row["env_reward"] == 0.0
        assert row["reward"] == pytest.approx(len(row["completion"]) / 10)
        assert {"tool_calls", "tool_errors", "parse_failures"} <= set(row)
    metrics = read_metrics(run_dir)
    assert all({"tool_calls", "tool_errors", "parse_failures"} <= set(m) for m in metrics)
