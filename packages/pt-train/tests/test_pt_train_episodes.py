"""GRPO on episodes: the policy's turns are trained, an environment's tokens are context
only, in the loss, the ratios and the gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pt_train.logprobs import HeadRequest, install_token_head
from pt_train.objectives.grpo import GRPO, GRPOConfig
from pt_train.producers.rollouts import rollout_batch, sample_from_row

TEMPERATURE = 0.8


def two_turn_rows() -> list[dict]:
    """Two episodes of one prompt (a group): a turn of the policy, 4 tokens of an
    environment's answer, a second turn; rewards 1 and 0, so advantages +0.7071 and
    -0.7071 (group-normalised with the unbiased std, GRPO's)."""
    prompt = [5, 17, 29, 41]
    first = {"turn1": [7, 8, 3], "env": [60, 61, 62, 63], "turn2": [9, 3]}
    second = {"turn1": [11, 12, 13, 3], "env": [60, 64, 62, 63], "turn2": [14, 3]}
    rows = []
    for parts, advantage in ((first, 0.7071067811865476), (second, -0.7071067811865476)):
        completion = parts["turn1"] + parts["env"] + parts["turn2"]
        mask = [1] * len(parts["turn1"]) + [0] * len(parts["env"]) + [1] * len(parts["turn2"])
        # the sampler's log-probs: read by the rollout correction, which is off here
        logprobs = [0.0 if m else None for m in mask]
        rows.append({"prompt_token_ids": prompt, "completion_token_ids": completion,
                     "completion_mask": mask, "completion_logprobs": logprobs,
                     "advantage": advantage})  # fmt: skip
    return rows


@pytest.fixture
def model(tiny_tokenizer):
    from pt_train.model import build_llama

    torch.manual_seed(0)
    return build_llama(tiny_tokenizer, hidden_size=64, num_layers=2, num_heads=1, seed=3).float()


def test_grpo_on_a_two_turn_episode_is_the_hand_computation_and_ignores_the_environment(model):
    """The loss and every parameter's gradient through pt's path (rows with a completion
    mask -> a batch -> the token head at the sampling temperature -> GRPO's loss) equal
    GRPO's formula worked out here on the model's full logits over the policy's tokens
    alone: ``-(1/B) sum_i A_i (1/|o_i|) sum_{t in o_i} r_t`` with ``r_t = exp(log pi -
    sg(log pi))`` (1 on-policy; the gradient is REINFORCE's). The final hidden state at
    each position that predicts an environment's token gets no gradient."""
    rows = two_turn_rows()
    columns = ["advantage", "completion_logprobs"]
    samples = [sample_from_row(r, f"row {i}", columns) for i, r in enumerate(rows)]
    batch = rollout_batch(samples, pad_token_id=0)
    objective = GRPO(
        GRPOConfig(name="grpo", aggregation="grpo", rollout_correction={"level": "none"})
    )
    objective.max_tokens = 8
    install_token_head(model)
    finals: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda m, i, o: finals.append(o))
    out = model(**batch.model_inputs("cpu", torch.float32),
                head=HeadRequest(targets=batch.targets, temperature=TEMPERATURE, entropy=True))  # fmt: skip
    hook.remove()
    finals[0].retain_grad()
    loss = objective.loss(out, batch, None)
    value = loss.sum / objective.count(batch)
    value.backward()
    pt_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # the hand computation, on logits of every position
    model.zero_grad()
    total = torch.zeros(())
    for row in rows:
        ids = torch.tensor([row["prompt_token_ids"] + row["completion_token_ids"]])
        logits = model(input_ids=ids).logits[0] / TEMPERATURE
        logps = torch.log_softmax(logits.float(), -1)
        p = len(row["prompt_token_ids"])
        policy = [j for j, m in enumerate(row["completion_mask"]) if m]
        token_logps = torch.stack(
            [logps[p + j - 1, row["completion_token_ids"][j]] for j in policy]
        )
        ratio = torch.exp(token_logps - token_logps.detach())
        total = total - row["advantage"] * ratio.mean()
    hand = total / len(rows)
    hand.backward()
    assert value.item() == pytest.approx(hand.item(), abs=1e-7)  # 0: on-policy, advantages sum to 0
    for name, grad in pt_grads.items():
        torch.testing.assert_close(grad, dict(model.named_parameters())[name].grad, atol=1e-6,
                                   rtol=1e-4, msg=name)  # fmt: skip
    assert any(g.abs().max() > 1e-4 for g in pt_grads.values())  # REINFORCE moves the weights
    # the environment's tokens: the positions that predict them get no gradient
    grad = finals[0].grad  # [rows, length, hidden]
    assert grad is not None
    for r, row in enumerate(rows):
        p = len(row["prompt_token_ids"])
        for j, m in enumerate(row["completion_mask"]):
            at = grad[r, p + j - 1].abs().max().item()
            assert (at > 0) == bool(m), (r, j, at)


def test_a_mask_that_is_not_one_per_token_is_refused():
    from pt_core.errors import InputError

    row = two_turn_rows()[0]
    with pytest.raises(InputError, match="'completion_mask' must hold a 0 or 1 for each"):
        sample_from_row({**row, "completion_mask": row["completion_mask"][:-1]}, "row 1")
    with pytest.raises(InputError, match="at least one 1"):
        sample_from_row({**row, "completion_mask": [0] * len(row["completion_mask"])}, "row 1")


def test_token_columns_of_an_episode_are_kept_at_the_policys_tokens():
    """An episode's per-token columns hold a value per completion token (None at the
    environment's): the batch keeps the policy's, in the order of its trained tokens."""
    row = {**two_turn_rows()[0], "completion_logprobs": [-1.0, -2.0, -3.0, None, None, None,
                                                         None, -4.0, -5.0]}  # fmt: skip
    sample = sample_from_row(row, "row 1", ["completion_logprobs"])
    np.testing.assert_array_equal(sample.tokens["rollout_logps"], [-1, -2, -3, -4, -5])
    batch = rollout_batch([sample], pad_token_id=0)
    assert batch.num_trained == 5


def episode_config(objective: str = "grpo", reward: dict | None = None, **environment):
    from pt_train.config import TrainConfig

    return TrainConfig.model_validate({
        "run_name": "r", "model": {"init": {"tokenizer": "tok"}},
        "objective": {"name": objective}
        | ({"teacher": {"path": "t"}} if objective == "opd" else {}),
        "rollout": {"prompts": "prompts.jsonl"},
        "environment": {"name": "tools", "tools": ["python"], **environment},
        "training": {"global_batch_size": 4, "max_steps": 1},
        **({"reward": reward} if reward is not None else {}),
    })  # fmt: skip


def test_the_reward_section_is_added_to_an_environments_only_where_grade_says_so():
    """With an environment the reward is the environment's: a reward section beside it
    changes nothing unless environment.grade is true, so it is refused; grade on an
    objective without rewards is refused too."""
    with pytest.raises(ValueError, match="reward.answer_key has no effect: with an environment"):
        episode_config(reward={"answer_key": "solution"})
    assert episode_config(reward={"answer_key": "solution"}, grade=True).environment.grade
    assert episode_config(grade=True).reward.answer_key == "answer"  # the default grader
    with pytest.raises(ValueError, match="environment.grade has no effect: objective opd"):
        episode_config("opd", grade=True)
