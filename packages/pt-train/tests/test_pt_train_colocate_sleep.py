"""The colocated engine's sleep mode (``rollout.sleep_level``): what the online loop asks of
the engine around each generation, in order.

vLLM's sleep mode runs on a GPU only (its CPU worker ignores the calls), so the engine here
is a recorder with the four calls the loop makes of :class:`pt_rollout.engines.vllm.VLLMEngine`
(``push_weights``, ``generate``, ``sleep``, ``wake_up``), driven through the colocated
generator's own protocol (``push``, ``submit``, ``wait``). The refusals on a machine
without a GPU are in test_pt_train_colocate.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from pt_rollout.engines import Completion, Request
from pt_train.config import ColocateRollout
from pt_train.producers.online.generators import GeneratorContext
from pt_train.producers.online.generators.colocated import ColocatedGenerator
from pt_train.producers.online.push import CurrentWeights


class Recorder:
    """The calls made of the engine, and what it holds: the version of the weights pushed
    into it, gone after a level-2 sleep, back from host memory after a level-1 one."""

    def __init__(self, level: int):
        self.level = level
        self.calls: list[str] = []
        self.weights: int | None = 0  # built from the starting weights (version 0)
        self.offloaded: int | None = None
        self.awake = {"weights": True, "kv_cache": True}

    def push_weights(self, pairs) -> None:
        assert self.awake["weights"] and not self.awake["kv_cache"] or all(self.awake.values())
        ((_, tensor),) = list(pairs)
        self.weights = int(tensor.item())
        self.calls.append(f"push v{self.weights}")

    def generate(self, requests, params):
        assert all(self.awake.values()), "generated while asleep"
        assert self.weights is not None, "generated with no weights"
        self.calls.append(f"generate v{self.weights}")
        return [Completion(token_ids=[1], finish_reason="length", logprobs=[0.0]) for _ in requests]

    def sleep(self) -> None:
        self.calls.append(f"sleep {self.level}")
        self.offloaded = self.weights if self.level == 1 else None
        self.weights = None
        self.awake = {"weights": False, "kv_cache": False}

    def wake_up(self, tags) -> bool:
        (tag,) = tags
        self.calls.append(f"wake {tag}")
        self.awake[tag] = True
        if tag == "weights":
            self.weights = self.offloaded
        return all(self.awake.values())


class Policy:
    """A policy whose weights are one tensor holding the number of updates behind them."""

    def __init__(self):
        self.version = 0

    def weights(self):
        return iter([("version", torch.tensor(float(self.version)))])


def generator(level: int) -> tuple[ColocatedGenerator, Recorder, Policy]:
    """The colocated generator once its engine was built from the starting weights."""
    rollout = ColocateRollout(prompts="prompts.jsonl", generator="colocate", sleep_level=level)
    needs = SimpleNamespace(teacher=None, logprobs_mode="processed", student_top_k=0)
    policy = Policy()
    context = GeneratorContext(
        SimpleNamespace(rollout=rollout), needs, None, CurrentWeights(policy, None),  # pyright: ignore[reportArgumentType]
        {"max_tokens": 4, "stop_token_ids": (2,)},
    )  # fmt: skip
    engine = Recorder(level)
    return ColocatedGenerator(context, engine=engine, engine_version=0), engine, policy


def rounds(made: ColocatedGenerator, policy: Policy, versions: list[int]) -> None:
    """One generation per entry, after the trainer reached that many updates (an entry
    repeated: a second generation of the same round, as dynamic sampling asks for)."""
    for version in versions:
        policy.version = version
        made.push(version)
        assert made.wait(made.submit([Request([5, 6], 0)])).version == version


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (0, ["generate v0", "push v1", "generate v1", "generate v1", "push v2", "generate v2"]),
        (
            1,
            [
                "generate v0", "sleep 1",
                "wake weights", "push v1", "wake kv_cache", "generate v1", "sleep 1",
                # the same weights again: level 1 brought them back from host memory
                "wake weights", "wake kv_cache", "generate v1", "sleep 1",
                "wake weights", "push v2", "wake kv_cache", "generate v2", "sleep 1",
            ],
        ),
        (
            2,
            [
                "generate v0", "sleep 2",
                "wake weights", "push v1", "wake kv_cache", "generate v1", "sleep 2",
                # level 2 freed the weights: the same version is pushed again
                "wake weights", "push v1", "wake kv_cache", "generate v1", "sleep 2",
                "wake weights", "push v2", "wake kv_cache", "generate v2", "sleep 2",
            ],
        ),
    ],
)  # fmt: skip
def test_the_engine_sleeps_between_generations_and_wakes_its_weights_for_the_push(level, expected):
    made, engine, policy = generator(level)
    rounds(made, policy, [0, 1, 1, 2])
    assert engine.calls == expected
    assert made.asleep == bool(level)
    assert ("sleep_s" in made.round_metrics()) == bool(level)
