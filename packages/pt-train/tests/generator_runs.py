"""A GRPO run's final weights with generator processes (started, or listening where
:mod:`serving` starts them), for the tests that compare ways of generating."""

from __future__ import annotations

from pathlib import Path


def grpo_weights(
    tmp_path: Path,
    model_dir: Path,
    name: str,
    rollout: dict,
    *,
    reward: str = "pool_even_reward:reward",
    deaths: tuple[int, int] = (0, 0),
) -> dict:
    """The final weights of GRPO, 2 steps of 2 prompts x 4 samples at temperature 1 from
    generator processes (``rollout``: the keys that place them), rewarded by a
    completion's even token ids (``pool_even_reward:reward``, in ``tmp_path``; they differ
    within every group, so the steps train); ``deaths``: each round's generator_deaths.
    The rollout correction is off: it weighs tokens by the generator's log-probs, which
    another batch width rounds differently (about 1e-6), while the samples are the same."""
    import json
    import sys

    from safetensors.torch import load_file

    from pt_train.config import TrainConfig
    from pt_train.metrics import read_metrics
    from pt_train.trainer import train

    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        with open(prompts, "w") as fh:
            for i in range(8):
                fh.write(json.dumps({"id": f"p{i}", "prompt": f"What is {i} + {i}?",
                                     "answer": str(2 * i)}) + "\n")  # fmt: skip
        (tmp_path / "pool_even_reward.py").write_text(
            "def reward(rows):\n"
            "    return [sum(t % 2 == 0 for t in r['completion_token_ids']) for r in rows]\n"
        )
    cfg = {
        "run_name": name,
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": str(model_dir)},
        "objective": {"name": "grpo", "rollout_correction": {"level": "none"}},
        "reward": {"function": reward},
        "rollout": {"prompts": str(prompts), "samples_per_prompt": 4, "max_tokens": 8,
                    "temperature": 1.0, "generator": "server", **rollout},
        "training": {"seed": 0, "learning_rate": 1e-3, "lr_schedule": "constant",
                     "global_batch_size": 8, "micro_batch_size": 4, "max_steps": 2},
    }  # fmt: skip
    sys.path.insert(0, str(tmp_path))  # the reward's module
    try:
        train(TrainConfig.model_validate(cfg))
    finally:
        sys.path.remove(str(tmp_path))
    metrics = read_metrics(tmp_path / "runs" / name)
    assert [m["generator_deaths"] for m in metrics] == list(deaths)
    assert any(m["reward_std"] > 0 for m in metrics)  # a gradient to follow
    return load_file(tmp_path / "runs" / name / "inference" / "step-2" / "model.safetensors")
