"""No objective key is silently ignored: a key the rest of the config makes useless is
refused at start with one line that names it (a ConfigError, exit 2), and a key that
applies takes effect. A key at its default value is accepted anywhere, because a run's
frozen config.yaml lists every key and must load again when the run resumes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pt_core.config import config_to_dict, validate
from pt_core.errors import ConfigError
from pt_train.config import TrainConfig
from pt_train.objectives.opd import OPD
from pt_train.producers.rollouts import RolloutSample, rollout_batch


def load(objective: dict, **sections) -> TrainConfig:
    """The config as ``pt-train run``/``check`` validate it."""
    data = {
        "run_name": "r",
        "model": {"init": {"tokenizer": "tok"}},
        "objective": objective,
        "training": {"max_steps": 1},
        **sections,
    }
    return validate(data, TrainConfig)


REFUSED = [
    # OPD: the keys of one loss mode with another
    ({"name": "opd", "loss": "forward_kl", "alpha": 0.3}, "objective.alpha=0.3"),
    ({"name": "opd", "loss": "reverse_kl", "beta": 0.2}, "objective.beta=0.2"),
    ({"name": "opd", "loss": "jsd", "clip_epsilon": 0.1}, "objective.clip_epsilon=0.1"),
    (
        {"name": "opd", "loss": "pg_reverse_kl", "importance_ratio": False, "clip_epsilon": 0.1},
        "objective.clip_epsilon=0.1",
    ),
    ({"name": "opd", "loss": "skewed_kl", "importance_ratio": False}, "objective.importance_ratio"),
    ({"name": "opd", "loss": "forward_kl", "advantage": "online"}, "objective.advantage=online"),
    ({"name": "opd", "loss": "token_kl", "support": "student_topk"}, "objective.support"),
    ({"name": "opd", "loss": "pg_reverse_kl", "renormalize": True}, "objective.renormalize"),
    ({"name": "opd", "loss": "token_kl", "teacher": {"top_k": 4}}, "objective.teacher.top_k=4"),
    (
        {"name": "opd", "support": "full", "teacher": {"path": "t/", "top_k": 4}},
        "objective.teacher.top_k=4",
    ),
    # DPO: SimPO compares no reference model
    (
        {"name": "dpo", "loss_type": "simpo", "reference": {"precompute": True}},
        "objective.reference",
    ),
    ({"name": "dpo", "loss_type": "simpo", "reference": {"path": "ref/"}}, "objective.reference"),
    ({"name": "dpo", "loss_type": "sigmoid", "simpo_gamma": 1.0}, "objective.simpo_gamma=1.0"),
    # GRPO: beta 0 loads no reference
    ({"name": "grpo", "kl_estimator": "k1"}, "objective.kl_estimator"),
    ({"name": "grpo", "reference": {"path": "ref/"}}, "objective.reference"),
    # GRPO: the nested keys of a part that is off
    ({"name": "grpo", "overlong": {"penalty": 0.5}}, "objective.overlong.penalty=0.5"),
    (
        {"name": "grpo", "dynamic_sampling": {"max_tries": 5}},
        "objective.dynamic_sampling.max_tries=5",
    ),
    # OPD: the teacher's dtype is read only where the teacher runs in-process
    ({"name": "opd", "teacher": {"dtype": "bfloat16"}}, "objective.teacher.dtype=bfloat16"),
    # ASFT: kl_coef 0 loads no anchor
    ({"name": "asft", "kl_coef": 0.0, "kl_direction": "reverse"}, "objective.kl_direction"),
    ({"name": "asft", "kl_coef": 0.0, "reference": {"path": "ref/"}}, "objective.reference"),
]


@pytest.mark.parametrize(("objective", "key"), REFUSED, ids=[k for _, k in REFUSED])
def test_a_key_that_has_no_effect_is_refused_naming_it(objective, key):
    with pytest.raises(ConfigError) as caught:
        load(objective)
    assert caught.value.exit_code == 2
    assert key in str(caught.value) and "no effect" in str(caught.value)


ACCEPTED = [
    {"name": "opd", "loss": "skewed_kl", "alpha": 0.3},
    {"name": "opd", "loss": "jsd", "beta": 0.2, "support": "student_topk", "teacher": {"top_k": 4}},
    {"name": "opd", "loss": "pg_reverse_kl", "clip_epsilon": 0.1, "advantage": "online"},
    {"name": "opd", "loss": "reverse_kl", "renormalize": True},
    {"name": "opd", "loss": "token_kl", "alpha": 0.5},  # the default: changes nothing
    {"name": "dpo", "loss_type": ["sigmoid", "simpo"], "reference": {"precompute": True}},
    {"name": "dpo", "loss_type": "simpo", "simpo_gamma": 1.0},
    {"name": "grpo", "beta": 0.1, "kl_estimator": "k1", "reference": {"path": "ref/"}},
    {"name": "grpo", "overlong": {"buffer": 64, "penalty": 0.5}},
    {"name": "grpo", "dynamic_sampling": {"enabled": True, "max_tries": 5}},
    {"name": "opd", "support": "full", "teacher": {"path": "t/", "dtype": "bfloat16"}},
    {"name": "asft", "kl_coef": 0.2, "kl_direction": "reverse", "reference": {"path": "ref/"}},
]


@pytest.mark.parametrize("objective", ACCEPTED)
def test_keys_that_take_effect_and_defaults_are_accepted(objective):
    load(objective)


REWARD_REFUSED = [
    # a reward function alone is the whole reward: nothing is graded
    ("grpo", {"function": "m:f", "format_reward": 0.5}, "reward.format_reward=0.5"),
    ("grpo", {"function": "m:f", "answer_key": "gold"}, "reward.answer_key=gold"),
    ("grpo", {"function_weight": 0.5}, "reward.function_weight=0.5"),
    # an objective that declares no reward reads no reward section
    ("sft", {"format_reward": 0.5}, "reward.format_reward"),
    ("opd", {"function": "m:f"}, "reward.function"),
]


@pytest.mark.parametrize(
    ("name", "reward", "key"), REWARD_REFUSED, ids=[k for *_, k in REWARD_REFUSED]
)
def test_a_reward_key_that_has_no_effect_is_refused_naming_it(name, reward, key):
    with pytest.raises(ConfigError) as caught:
        load({"name": name}, reward=reward)
    assert caught.value.exit_code == 2
    assert key in str(caught.value) and "no effect" in str(caught.value)


REWARD_ACCEPTED = [
    {"format_reward": 0.5},
    {"function": "m:f", "format_reward": 0.0},  # the default: changes nothing
    {"function": "m:f", "function_weight": 0.5, "format_reward": 0.2},  # a weighted mix
]


@pytest.mark.parametrize("reward", REWARD_ACCEPTED)
def test_reward_keys_that_take_effect_are_accepted(reward):
    given = load({"name": "grpo"}, reward=reward).reward.model_dump(exclude_defaults=True)
    assert given == {k: v for k, v in reward.items() if v != 0.0}


def test_the_old_place_of_the_reward_section_still_loads():
    """``objective.reward`` (before rewards were the online loop's component) is the
    ``reward`` section; both at once is an error."""
    cfg = load({"name": "grpo", "reward": {"format_reward": 0.5}})
    assert cfg.reward.format_reward == 0.5
    with pytest.raises(ConfigError, match="both given"):
        load({"name": "grpo", "reward": {"format_reward": 0.5}}, reward={"format_reward": 0.1})


@pytest.mark.parametrize("name", ["opd", "dpo", "grpo"])
def test_a_frozen_config_with_every_key_at_its_default_loads_again(name):
    """config.yaml holds every key, defaults included: it must validate on resume."""
    frozen = config_to_dict(load({"name": name}))
    assert validate(frozen, TrainConfig).objective.name == name


def scored(width: int):
    """One rollout of two completion tokens, scored with the teacher's top-``width``."""
    ids = np.arange(2 * width).reshape(2, width)
    logps = np.log(np.full((2, width), 0.9 / width))
    sample = RolloutSample(
        np.array([1, 2]),
        np.array([3, 4]),
        {
            "teacher_token_logps": np.array([-1.0, -1.0]),
            "teacher_topk_ids": ids,
            "teacher_topk_logps": logps,
        },
    )
    return rollout_batch([sample], pad_token_id=0)


def test_teacher_top_k_cuts_the_scored_lists_to_its_size():
    """Rollouts scored with a top-6 and teacher.top_k 4: the support is the first 4 (the
    lists are most likely first); without top_k it is the whole list."""
    objective = OPD(load({"name": "opd", "teacher": {"top_k": 4}}).objective)
    assert objective.head(scored(6))["extra_ids"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert OPD(load({"name": "opd"}).objective).head(scored(6))["extra_ids"].shape == (2, 6)


def test_teacher_top_k_larger_than_the_scored_lists_is_refused():
    objective = OPD(load({"name": "opd", "teacher": {"top_k": 16}}).objective)
    with pytest.raises(ConfigError, match=r"objective.teacher.top_k=16.*hold 6 tokens"):
        objective.head(scored(6))


def test_teacher_top_k_larger_than_piped_scored_rollouts_is_refused_at_start(tmp_path):
    """The trainer configures the objective before it loads data or models: the first row
    of the scored rollouts shows their lists are 6 wide, shorter than top_k 16."""
    rows = tmp_path / "scores.jsonl"
    row = {
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3, 4],
        "teacher_token_logprobs": [-1.0, -1.0],
        "teacher_topk_ids": [list(range(6))] * 2,
        "teacher_topk_logprobs": [[-2.0] * 6] * 2,
    }
    rows.write_text(json.dumps(row) + "\n")
    for top_k, refused in ((16, True), (6, False), (4, False)):
        cfg = load({"name": "opd", "teacher": {"top_k": top_k}})
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": str(rows)})})
        objective = OPD(cfg.objective)
        if refused:
            with pytest.raises(ConfigError, match=r"objective.teacher.top_k=16.*hold 6 tokens"):
                objective.configure(cfg)
        else:
            objective.configure(cfg)


def test_teacher_path_other_than_the_scorer_of_piped_rollouts_is_refused_at_start(tmp_path):
    """Scored rollouts record the model that scored them (pt-rollout score's teacher_model);
    a teacher.path naming another model would change nothing (the scores in the rows are
    what OPD trains toward), so it is refused. The same model, or no teacher.path, runs."""
    scorer, other = tmp_path / "teacher", tmp_path / "other"
    scorer.mkdir()
    other.mkdir()
    rows = tmp_path / "scores.jsonl"
    row = {
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3, 4],
        "teacher_model": str(scorer.resolve()),
        "teacher_token_logprobs": [-1.0, -1.0],
        "teacher_topk_ids": [list(range(4))] * 2,
        "teacher_topk_logprobs": [[-2.0] * 4] * 2,
    }
    rows.write_text(json.dumps(row) + "\n")
    for path, refused in ((other, True), (scorer, False), (None, False)):
        cfg = load({"name": "opd", "teacher": {"path": str(path) if path else None}})
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": str(rows)})})
        if refused:
            with pytest.raises(ConfigError, match=r"objective.teacher.path=.*other.*scored by"):
                OPD(cfg.objective).configure(cfg)
        else:
            OPD(cfg.objective).configure(cfg)


@pytest.mark.parametrize("sampling", [{"top_p": 0.9}, {"top_k": 20}])
def test_grpo_refuses_sampling_whose_log_probs_the_trainer_does_not_compute(sampling):
    """top_p / top_k reach the generator, and its processed log-probs are renormalised over
    what they keep; the trainer's ratio would divide log-probs of another distribution."""
    from pt_train.objectives import build_objective

    cfg = validate(
        {
            "run_name": "r",
            "model": {"init": {"tokenizer": "tok"}},
            "objective": {"name": "grpo"},
            "rollout": {"prompts": "p.jsonl", **sampling},
            "training": {"max_steps": 1},
        },
        TrainConfig,
    )
    objective = build_objective(cfg.objective)
    with pytest.raises(ConfigError, match="top_p=.* / top_k=") as caught:
        objective.configure(cfg)
    assert caught.value.exit_code == 2


def test_truncate_on_tokenized_pairs_is_refused_at_start(tmp_path):
    """Tokenized pairs were cut (or dropped) by pt-data when it built them: data.truncate
    would change nothing, so loading them with it set stops the run with one line that
    names the key; without it the pair loads."""
    from pt_train.config import DataConfig
    from pt_train.data import load_pairs

    rows = tmp_path / "pairs.jsonl"
    pair = {
        "prompt_input_ids": [1, 2],
        "chosen_input_ids": [3, 4],
        "chosen_labels": [3, 4],
        "rejected_input_ids": [5],
        "rejected_labels": [5],
    }
    rows.write_text(json.dumps(pair) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_pairs(DataConfig(path=str(rows), truncate=True), rows, None, vocab_size=8)
    assert caught.value.exit_code == 2
    assert "data.truncate has no effect" in str(caught.value)
    assert "\n" not in str(caught.value)
    pairs = load_pairs(DataConfig(path=str(rows)), rows, None, vocab_size=8)
    assert [p.chosen.tolist() for p in pairs] == [[3, 4]]


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        ({}, "it needs the online loop"),
        ({"prompts": "p.jsonl", "samples_per_prompt": 1}, "one sample has advantage 0"),
    ],
)
def test_opd_reward_weight_where_no_reward_can_count_is_refused_at_start(rollout, message):
    """OPD's reward_weight rewards samples as the online loop draws them, relative to the
    other samples of their prompt: without the loop, or with one sample a prompt, it
    would change nothing."""
    cfg = load({"name": "opd", "reward_weight": 0.5}, rollout=rollout)
    with pytest.raises(ConfigError) as caught:
        OPD(cfg.objective).configure(cfg)
    assert caught.value.exit_code == 2
    assert "objective.reward_weight=0.5" in str(caught.value) and message in str(caught.value)


def test_opd_with_a_reward_weight_reads_the_reward_section():
    cfg = load(
        {"name": "opd", "reward_weight": 0.5},
        rollout={"prompts": "p.jsonl", "samples_per_prompt": 4},
        reward={"function": "m:f"},
    )
    objective = OPD(cfg.objective)
    objective.configure(cfg)
    assert objective.needs.reward and cfg.reward.function == "m:f"
