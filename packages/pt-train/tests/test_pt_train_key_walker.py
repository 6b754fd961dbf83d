"""Every key of every objective section, and of the reward section, either changes what a
run does or is refused at start.

The walker sets each leaf key (nested sections included) to each valid value other than
its default, on a few base configs per objective (a key that only matters beside another
one is walked where that one is set), and validates the whole config. A ConfigError that
says the key has "no effect" (or names it) is a refusal. Otherwise the objective's
behaviour must differ from the base's: its Needs once configured (which models the
trainer loads, and how; what the online loop asks for), its count and head request, the
loss and every metric on a fixed micro-batch, and, for objectives trained on rewards,
the round's rows once rewarded and prepared. Every input is synthetic and small: no
model is loaded, the LM head is a fixed random matrix on fixed hidden states.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import sys
import types
import typing
from typing import Literal

import annotated_types
import numpy as np
import pytest
import torch
from pydantic import BaseModel

from pt_core.config import validate
from pt_core.errors import ConfigError
from pt_train.batch import Row
from pt_train.config import TrainConfig
from pt_train.data import Pair
from pt_train.logprobs import HeadOutput, HeadRequest, head_outputs
from pt_train.objectives import REGISTRY, build_objective
from pt_train.objectives.dpo import LossType
from pt_train.producers.fixed import pairs_producer, rows_producer
from pt_train.producers.rollouts import RolloutSample, rollout_batch
from pt_train.rewards import RewardConfig, Rewards

VOCAB, HIDDEN = 32, 8
MAX_TOKENS = 8  # rollout.max_tokens of every base: the longest synthetic completion
TOPK_WIDTH = 12  # the scored top-k lists, wider than teacher.top_k's default 8 and its moves
REWARD_MODULE = "key_walker_rewards"
REWARD_FUNCTION = f"{REWARD_MODULE}:completion_length"

# --------------------------------------------------------------------------- base configs

DIVERGENCES = ["forward_kl", "reverse_kl", "skewed_kl", "jsd"]
ONE_UPDATE = {}  # the online loop's default: one optimizer step per round, on-policy
TWO_UPDATES = {"updates_per_round": 2}  # rounds trained twice: old log-probs differ
# the online loop on prompts, where OPD's reward_weight applies (a group of four per prompt)
ONLINE = {"prompts": "prompts.jsonl", "samples_per_prompt": 4}

# objective name -> [(objective keys, rollout keys)]: every key is walked on every base
BASES: dict[str, list[tuple[dict, dict]]] = {
    "sft": [({}, ONE_UPDATE)],
    "dft": [({}, ONE_UPDATE)],
    "asft": [
        ({}, ONE_UPDATE),
        ({"kl_coef": 0.0}, ONE_UPDATE),
        ({"kl_direction": "reverse"}, ONE_UPDATE),
    ],
    "dpo": [
        *[({"loss_type": t}, ONE_UPDATE) for t in typing.get_args(LossType)],
        ({"loss_type": ["sigmoid", "simpo"], "loss_weights": [1.0, 0.5]}, ONE_UPDATE),
        ({"reference": {"precompute": True}}, ONE_UPDATE),
        ({"label_smoothing": 0.1}, ONE_UPDATE),
    ],
    "orpo": [({}, ONE_UPDATE)],
    "kto": [({}, ONE_UPDATE), ({"kl": "none"}, ONE_UPDATE)],
    "opd": [
        *[({"loss": loss}, ONE_UPDATE) for loss in DIVERGENCES],
        # alpha and beta beside each other way of closing a support
        *[({"loss": loss, "renormalize": True}, ONE_UPDATE) for loss in ("skewed_kl", "jsd")],
        *[({"loss": loss, "support": "student_topk"}, ONE_UPDATE) for loss in ("skewed_kl", "jsd")],
        *[
            ({"loss": loss, "support": "full", "teacher": {"path": "teacher/"}}, ONE_UPDATE)
            for loss in ("skewed_kl", "jsd")
        ],
        ({"loss": "token_kl"}, ONE_UPDATE),
        ({"loss": "pg_reverse_kl"}, ONE_UPDATE),
        ({"loss": "pg_reverse_kl", "importance_ratio": False}, ONE_UPDATE),
        ({"loss": "pg_reverse_kl", "advantage": "online"}, ONE_UPDATE),
        ({}, ONLINE),
        ({"reward_weight": 0.5}, ONLINE),
        ({"loss": "pg_reverse_kl", "reward_weight": 0.5}, ONLINE),
    ],
    "grpo": [
        ({}, ONE_UPDATE),
        ({}, TWO_UPDATES),
        ({"beta": 0.1}, TWO_UPDATES),
        ({"dual_clip": 3.0}, TWO_UPDATES),
        ({"ratio_level": "sequence"}, TWO_UPDATES),
        ({"policy_loss": "cispo"}, TWO_UPDATES),
        ({"rollout_correction": {"level": "sequence"}}, TWO_UPDATES),
        ({"rollout_correction": {"level": "geometric", "mode": "mask"}}, TWO_UPDATES),
        ({"rollout_correction": {"mode": "mask"}}, TWO_UPDATES),
        ({"overlong": {"buffer": 4}}, TWO_UPDATES),
        ({"dynamic_sampling": {"enabled": True}}, TWO_UPDATES),
        ({"aggregation": "grpo", "scale_rewards": "batch"}, TWO_UPDATES),
    ],
}
REWARD_BASES = [
    {},
    {"function": REWARD_FUNCTION},
    {"function": REWARD_FUNCTION, "function_weight": 0.5},
]


# Keys the walker finds without effect on a base and that are not refused yet, with why:
# each is a known gap of the rule, and the walker must keep finding it until it is closed
# (then its line goes).
# Keys the walker finds ignored and that are not refused yet: (objective, key, rollout).
NOT_YET_REFUSED: dict[tuple[str, str, str], str] = {}


def load(objective: dict, rollout: dict, reward: dict | None = None) -> TrainConfig:
    """The config as ``pt-train run``/``check`` validate it."""
    data = {
        "run_name": "r",
        "model": {"init": {"tokenizer": "tok"}},
        "objective": objective,
        "training": {"max_steps": 1},
        "rollout": {"max_tokens": MAX_TOKENS, "temperature": 1.0, **rollout},
    }
    if reward is not None:
        data["reward"] = reward
    return validate(data, TrainConfig)


# --------------------------------------------------------------------------- the keys


def leaves(section: type[BaseModel], prefix: tuple = ()):
    """(path, field) of every leaf key of a section, nested sections walked into."""
    for key, field in section.model_fields.items():
        if not prefix and key == "name":
            continue
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            yield from leaves(field.annotation, (*prefix, key))
        else:
            yield (*prefix, key), field


def bounds(field) -> dict:
    found = {}
    for rule in field.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if isinstance(rule, getattr(annotated_types, name.capitalize())):
                found[name] = getattr(rule, name)
    return found


def within(value, limits: dict) -> bool:
    return (
        value >= limits.get("ge", -np.inf)
        and value > limits.get("gt", -np.inf)
        and value <= limits.get("le", np.inf)
        and value < limits.get("lt", np.inf)
    )


def candidates(path: tuple, field) -> list:
    """The valid values of a key other than its default, from its type and constraints:
    a bool flipped, every other Literal option, a number moved both ways and set to its
    inclusive bounds, an unset number set inside its bounds, a string changed."""
    if path == ("function",):
        return [REWARD_FUNCTION]  # a function the test can import
    default = field.get_default(call_default_factory=True)
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        assert len(args) == 1, f"{path}: a union of {args}"
        annotation = args[0]
    origin = typing.get_origin(annotation)
    if annotation is bool:
        return [not default]
    if origin is Literal:
        return [option for option in typing.get_args(annotation) if option != default]
    if origin is list:
        (item,) = typing.get_args(annotation)
        if typing.get_origin(item) is Literal:
            return [[option] for option in typing.get_args(item) if [option] != default]
        assert item is float, f"{path}: a list of {item}"
        return [[2.0]]  # one weight per loss type of a one-type base
    if annotation is str:
        return ["other"]
    assert annotation in (int, float), f"{path}: no values derived for {annotation}"
    limits = bounds(field)
    step = 1 if annotation is int else 0.15
    if default is None:
        low = limits.get("ge", limits.get("gt", 0))
        return [annotation(low + (1 if annotation is int else 0.5))]
    values = [default + step, default - step, limits.get("ge"), limits.get("le")]
    return [
        annotation(v)
        for v in dict.fromkeys(values)
        if v is not None and v != default and within(v, limits)
    ]


def set_key(base: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(base)
    section = out
    for key in path[:-1]:
        section = section.setdefault(key, {})
    section[path[-1]] = value
    return out


def get_key(cfg: BaseModel, path: tuple):
    for key in path:
        cfg = getattr(cfg, key)
    return cfg.model_dump() if isinstance(cfg, BaseModel) else cfg


# --------------------------------------------------------------------------- the inputs


def fixed(shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def lm_head(seed: int):
    """A fixed random LM head: [N, HIDDEN] -> [N, VOCAB] logits."""
    weight = fixed((VOCAB, HIDDEN), seed)
    return lambda hidden: hidden @ weight.T


def completions(lengths, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, n) for n in lengths]


@functools.cache
def token_batch():
    """Three demonstrations, trained on their answers (SFT, DFT, ASFT)."""
    rows = []
    for prompt, answer in zip(completions([3, 2, 4], 1), completions([5, 2, 7], 2), strict=True):
        ids = np.concatenate([prompt, answer])
        labels = np.concatenate([np.full(len(prompt), -100), answer])
        rows.append(Row(ids, labels, np.arange(len(ids))))
    producer = rows_producer(
        rows, pad_token_id=0, attn_implementation="sdpa", global_batch_size=3,
        micro_batch_size=3, seed=0, shuffle=False, rank=0, world_size=1,
    )  # fmt: skip
    return producer.micro_batches(0)[0]


@functools.cache
def pair_batch():
    """Three preference pairs whose chosen and rejected completions differ in length, as
    the pairs producer lays them out (chosen, rejected, chosen, ...)."""
    prompts = completions([3, 2, 4], 3)
    chosen = completions([5, 2, 6], 4)
    rejected = completions([2, 6, 3], 5)
    pairs = [Pair(p, c, c, r, r) for p, c, r in zip(prompts, chosen, rejected, strict=True)]
    producer = pairs_producer(
        pairs, pad_token_id=0, attn_implementation="sdpa", max_seq_length=64,
        global_batch_size=3, micro_batch_size=3, seed=0, shuffle=False, rank=0, world_size=1,
    )  # fmt: skip
    return producer.micro_batches(0)[0]


# Completion lengths of the synthetic rollouts: two groups of four samples, some within the
# last four tokens before max_tokens and some cut at it (the overlong shaping's range).
ROLLOUT_LENGTHS = [8, 3, 6, 2, 5, 8, 4, 7]
# log pi - log pi_old of each sequence, and moved at each token: ratios of tokens and of
# sequences far on both sides of 1 (beyond both clip bounds, and the dual clip where the
# advantage is negative) and near it
SEQUENCE_RATIO_LOGS = [1.0, -1.0, 0.6, 1.3, 0.1, -1.5, 1.5, 1.4]
TOKEN_RATIO_LOGS = [0.0, 0.5, -0.5, 1.0, -1.0]
# pi_old / mu of each sequence (its tokens' ratios near it): on both sides of every
# bound of the rollout correction (cap 2, mask [0.5, 2]) and of each of their moves; the
# sequences clipped above, below and by the dual clip are among those the mask keeps
CORRECTION_RATIOS = [1.1, 0.9, 0.3, 1.92, 0.42, 0.58, 2.08, 3.0]
CORRECTION_JITTER = [0.0, 0.01, -0.01]
# log pi - log ref at each trained token
REFERENCE_LOGS = [0.8, -0.3, 0.5, 1.1, -0.6, 0.2, 0.05]
ADVANTAGES = [1.0, -0.5, 0.8, -1.2, 0.4, -0.9, 1.5, -1.1]


def policy_token_logps(batch, temperature: float) -> torch.Tensor:
    out = head_outputs(
        fixed((batch.num_trained, HIDDEN), 10, 2.0),
        lm_head(11),
        HeadRequest(targets=batch.targets, temperature=temperature),
        VOCAB,
    )
    return out.token_logps.detach().double()


def rollout_samples(old_logps: torch.Tensor | None = None) -> list[RolloutSample]:
    """Eight rollouts (two prompts, four samples each) scored by a teacher: its log-prob of
    every sampled token, its top-12, and its log-probs of the student's top-12; given the
    old policy's log-probs, those and the generator's (the old policy's over
    CORRECTION_RATIOS)."""
    prompts = completions([3] * 4 + [2] * 4, 6)
    prompts = [prompts[0]] * 4 + [prompts[4]] * 4  # two groups of one prompt each
    samples, start = [], 0
    for i, (prompt, completion) in enumerate(
        zip(prompts, completions(ROLLOUT_LENGTHS, 7), strict=True)
    ):
        n = len(completion)
        rng = np.random.default_rng(100 + i)
        topk_logps = np.sort(np.log(rng.dirichlet(np.ones(TOPK_WIDTH + 4))[:TOPK_WIDTH]))[::-1]
        student_logps = np.sort(np.log(rng.dirichlet(np.ones(TOPK_WIDTH + 4))[:TOPK_WIDTH]))[::-1]
        tokens = {
            "teacher_token_logps": rng.normal(-2.0, 1.0, n),
            "teacher_topk_ids": np.stack([rng.permutation(VOCAB)[:TOPK_WIDTH] for _ in range(n)]),
            "teacher_topk_logps": np.tile(topk_logps, (n, 1)),
            "student_topk_ids": np.stack([rng.permutation(VOCAB)[:TOPK_WIDTH] for _ in range(n)]),
            "teacher_student_topk_logps": np.tile(student_logps, (n, 1)),
        }
        if old_logps is not None:
            old = old_logps[start : start + n].numpy()
            correction = np.log(CORRECTION_RATIOS[i]) + np.resize(CORRECTION_JITTER, n)
            tokens["old_logps"] = old
            tokens["rollout_logps"] = old - correction
        samples.append(RolloutSample(prompt, completion, tokens, {"advantages": ADVANTAGES[i]}))
        start += n
    return samples


@functools.cache
def rollouts(temperature: float, old_logps: bool):
    """The micro-batch of rollouts, with the old policy's log-probs where the run computes
    them (``old_logps``); else the generator's log-probs are the policy's own, moved
    by the rollout correction's differences only."""
    batch = rollout_batch(rollout_samples(), pad_token_id=0)
    policy = policy_token_logps(batch, temperature)
    shift = torch.tensor(SEQUENCE_RATIO_LOGS, dtype=torch.float64)[batch.token_sequence]
    shift += torch.tensor(np.resize(TOKEN_RATIO_LOGS, len(policy)), dtype=torch.float64)
    old = policy - shift if old_logps else policy
    batch = rollout_batch(rollout_samples(old), pad_token_id=0)
    if not old_logps:
        del batch.data["old_logps"]
    return batch


def round_rows() -> list[dict]:
    """A round of the online loop: three groups of four samples with graded rewards,
    lengths up to max_tokens; one group's rewards are all equal."""
    answers = ["4", "4", "9"]
    texts = [
        ["so \\boxed{4}", "\\boxed{5}", "The answer is 4.", "no idea"],
        ["\\boxed{4}", "\\boxed{4}", "\\boxed{4}", "\\boxed{4}"],
        ["\\boxed{9}", "9", "\\boxed{8}", "it is 7"],
    ]
    lengths = [[8, 3, 6, 2], [5, 8, 4, 7], [8, 7, 1, 6]]
    rows = []
    for g in range(3):
        for k in range(4):
            rows.append({
                "id": f"p{g}", "group": f"0:p{g}", "completion": texts[g][k],
                "completion_token_ids": list(range(1, lengths[g][k] + 1)),
                "answer": answers[g], "other": "9",
                "reward": float(texts[g][k].endswith(f"{{{answers[g]}}}")),
            })  # fmt: skip
    return rows


# --------------------------------------------------------------------------- the fingerprint


def as_value(x):
    """Tensors, arrays and nested containers as plain, comparable values."""
    if isinstance(x, torch.Tensor | np.ndarray):
        return np.asarray(x.detach() if isinstance(x, torch.Tensor) else x).tolist()
    if isinstance(x, dict):
        return {k: as_value(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [as_value(v) for v in x]
    if isinstance(x, BaseModel):
        return x.model_dump()
    return x


def trainer_needs(needs) -> dict:
    """What the trainer and the online loop read of the Needs: the frozen model's config
    only where a frozen model runs (frozen != "none")."""
    fields = {f.name: getattr(needs, f.name) for f in dataclasses.fields(needs)}
    if needs.frozen == "none":
        fields["frozen_model"] = None
    return as_value({k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
                     for k, v in fields.items()})  # fmt: skip


def behaviour(cfg: TrainConfig, rewards: bool = False) -> dict:
    """Everything the run does with the objective (and, with ``rewards``, the reward
    component) on the synthetic inputs."""
    objective = build_objective(cfg.objective)
    objective.configure(cfg)
    needs = objective.needs
    if needs.data == "rollouts":
        batch = rollouts(cfg.sampling_temperature, needs.old_logps)
    else:
        batch = token_batch() if needs.data == "tokens" else pair_batch()
    head = objective.head(batch)
    dense = objective.dense() if needs.frozen == "dense" else None
    request = HeadRequest(
        targets=batch.targets,
        temperature=cfg.sampling_temperature,
        dense=dense,
        dense_hidden=fixed((batch.num_trained, HIDDEN), 20, 2.0) if dense else None,
        dense_head=lm_head(21) if dense else None,
        **head,
    )
    out = head_outputs(fixed((batch.num_trained, HIDDEN), 10, 2.0), lm_head(11), request, VOCAB)
    ref = None
    if needs.frozen == "logps":
        # the policy's log-probs moved both ways, on the whole above the reference's (as
        # after some training), so that a KL estimate of the batch is positive
        shift = torch.tensor(np.resize(REFERENCE_LOGS, batch.num_trained), dtype=torch.float32)
        ref = HeadOutput(logps=out.logps.detach() - shift[:, None])
    loss = objective.loss(out, batch, ref)
    found = {
        "needs": trainer_needs(needs),
        "count": objective.count(batch),
        "head": as_value({k: v for k, v in head.items()}),
        "loss": (float(loss.sum), loss.count),
        "metrics": {k: (float(s), float(c)) for k, (s, c) in loss.metrics.items()},
    }
    if needs.reward:
        rows = round_rows()
        if rewards:
            component = Rewards(cfg.reward)
            component(rows)
            # workers and timeout size the grading pool (these answers are graded without
            # starting its workers): what the component built it with
            pool = component._pool
            found["grading"] = (pool.size, pool.timeout) if pool is not None else None
            component.close()
        objective.prepare_round(rows)
        found["rows"] = rows
    return found


# --------------------------------------------------------------------------- the walk


def by_the_math(objective):
    """An objective section with the values that are another's by the math written as that
    other: robust DPO with no label smoothing is the sigmoid loss
    (``-(1 - 0) log s(b h) / (1 - 0)``, Chowdhury et al. 2024)."""
    if objective.name == "dpo" and objective.label_smoothing == 0:
        types = ["sigmoid" if t == "robust" else t for t in objective.loss_type]
        return objective.model_copy(update={"loss_type": types})
    return objective


def refused(error: ConfigError, path: tuple, base: dict) -> bool:
    """The error says the key has no effect, or names it or a key of the base it meets."""
    named = {path[-1], *(leaf for leaf, _ in nested_items(base))}
    return "no effect" in str(error) or any(key in str(error) for key in named - {"name"})


def nested_items(section: dict):
    for key, value in section.items():
        if isinstance(value, dict):
            yield from nested_items(value)
        else:
            yield key, value


def walk(configs: list[tuple[dict, dict]], section, prefix: str, make, rewards: bool):
    """Walk every leaf of ``section`` on every base; return the keys (with base and value)
    that changed nothing and were not refused, and how many were walked per key."""
    ignored, walked = [], {}
    for base, rollout in configs:
        base_cfg = make(base, rollout)
        expected = behaviour(base_cfg, rewards)
        for path, field in leaves(section):
            for value in candidates(path, field):
                if value == get_key(getattr(base_cfg, prefix), path):
                    continue
                key = f"{prefix}.{'.'.join(path)}"
                walked[key] = walked.get(key, 0) + 1
                try:
                    cfg = make(set_key(base, path, value), rollout)
                    found = behaviour(cfg, rewards)
                except ConfigError as error:
                    if not refused(error, path, base):
                        raise
                    continue
                aliased = by_the_math(cfg.objective) == by_the_math(base_cfg.objective)
                if found == expected and not aliased:
                    ignored.append((key, value, base, rollout))
    return ignored, walked


def unexplained(name: str, ignored: list) -> list[str]:
    """The ignored keys not in NOT_YET_REFUSED; fails where a known gap is no longer found."""
    found = {(name, key, str(rollout)) for key, _, _, rollout in ignored}
    known = {k for k in NOT_YET_REFUSED if k[0] == name}
    assert known <= found, f"closed, remove from NOT_YET_REFUSED: {sorted(known - found)}"
    return [
        f"{key}={value!r} on {base} rollout {rollout}"
        for key, value, base, rollout in ignored
        if (name, key, str(rollout)) not in known
    ]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The inputs are a few dozen tokens: one thread computes them fastest."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reward_function(tmp_path_factory):
    """``key_walker_rewards:completion_length``: a custom reward, a tenth of the
    completion's characters."""
    folder = tmp_path_factory.mktemp("rewards")
    (folder / f"{REWARD_MODULE}.py").write_text(
        "def completion_length(rows):\n    return [len(r['completion']) / 10 for r in rows]\n"
    )
    sys.path.insert(0, str(folder))
    yield
    sys.path.remove(str(folder))
    sys.modules.pop(REWARD_MODULE, None)


@pytest.mark.parametrize("name", list(BASES))
def test_every_objective_key_changes_the_run_or_is_refused(name, reward_function):
    section = REGISTRY[name][0]
    configs = [({"name": name, **objective}, rollout) for objective, rollout in BASES[name]]
    ignored, walked = walk(configs, section, "objective", load, rewards=False)
    unwalked = {f"objective.{'.'.join(p)}" for p, _ in leaves(section)} - set(walked)
    assert not unwalked, f"keys the walker set to no other value: {sorted(unwalked)}"
    ignored = unexplained(name, ignored)
    assert not ignored, "keys that changed nothing and were not refused:\n" + "\n".join(ignored)


def test_every_reward_key_changes_the_rewards_or_is_refused(reward_function):
    configs = [(reward, ONE_UPDATE) for reward in REWARD_BASES]

    def make(reward, rollout):
        return load({"name": "grpo"}, rollout, reward)

    ignored, walked = walk(configs, RewardConfig, "reward", make, rewards=True)
    unwalked = {f"reward.{'.'.join(p)}" for p, _ in leaves(RewardConfig)} - set(walked)
    assert not unwalked, f"keys the walker set to no other value: {sorted(unwalked)}"
    ignored = unexplained("reward", ignored)
    assert not ignored, "keys that changed nothing and were not refused:\n" + "\n".join(ignored)
