"""The loss math, the packing mask and the data order, checked in-process against
reference computations written out here."""

from __future__ import annotations

import math

import pytest
import torch

from pt_train.data import Row, StepSampler, block_causal_mask, collate
from pt_train.losses import dft_loss, sft_loss, shift_targets, token_nll


def test_sft_and_dft_match_hand_computed_values():
    # One position with logits [0, ln 3] over a 2-token vocabulary: p(token 1) = 3/4.
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, 1.0]]])
    targets = torch.tensor([[1, -100]])  # the second position carries no loss
    nll = -math.log(0.75)
    assert sft_loss(logits, targets).item() == pytest.approx(nll, abs=1e-6)
    # DFT weights the token's cross-entropy by its (stopped-gradient) probability.
    assert dft_loss(logits, targets).item() == pytest.approx(0.75 * nll, abs=1e-6)


def test_dft_gradient_is_probability_times_sft_gradient():
    # d/dz of -sg(p) log p = sg(p) * d/dz(-log p): the gradient of SFT scaled by p.
    torch.manual_seed(0)
    logits = torch.randn(1, 5, 7, requires_grad=True)
    targets = torch.tensor([[3, 1, -100, 6, 0]])
    (g_sft,) = torch.autograd.grad(sft_loss(logits, targets), logits)
    (g_dft,) = torch.autograd.grad(dft_loss(logits, targets), logits)
    p = torch.exp(-token_nll(logits, targets)).detach()
    torch.testing.assert_close(g_dft, g_sft * p[..., None], atol=1e-6, rtol=1e-6)


def test_shift_targets_never_crosses_a_packed_boundary():
    labels = torch.tensor([[-100, 11, 12, -100, 21, 22]])
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 2]])  # two sequences of 3
    # position 2 (last of sequence 1) would predict token 3, the first of sequence 2: ignored
    assert shift_targets(labels, position_ids).tolist() == [[11, 12, -100, 21, 22]]


def test_block_causal_mask_keeps_sequences_apart():
    mask = block_causal_mask(torch.tensor([[0, 1, 0, 1, 2]]), as_bool=True)[0, 0].int()
    expected = [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
    ]
    assert mask.tolist() == expected


def _row(ids, labels, positions=None):
    import numpy as np

    positions = list(range(len(ids))) if positions is None else positions
    return Row(np.array(ids), np.array(labels), np.array(positions))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_batch_gives_the_same_per_token_loss_as_unpacked(tiny_tokenizer, attn):
    """Two sequences packed into one row must see exactly what they see alone."""
    from pt_train.model import build_llama

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.set_attn_implementation(attn)
    model.eval()
    g = torch.Generator().manual_seed(1)
    a = torch.randint(10, len(tiny_tokenizer), (9,), generator=g).tolist()
    b = torch.randint(10, len(tiny_tokenizer), (13,), generator=g).tolist()
    la = [-100] * 3 + a[3:]
    lb = [-100] * 4 + b[4:]

    def per_token_nll(rows):
        batch = collate(rows, tiny_tokenizer.pad_token_id, attn)
        mask = batch["attention_mask"]
        with torch.no_grad():
            logits = model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                attention_mask=mask,
            ).logits
        targets = shift_targets(batch["labels"], batch["position_ids"])
        return token_nll(logits[:, :-1], targets), targets

    packed, packed_targets = per_token_nll([_row(a + b, la + lb, list(range(9)) + list(range(13)))])
    # unpacked: a batch of two rows, the shorter one padded
    alone, alone_targets = per_token_nll([_row(a, la), _row(b, lb)])
    got = torch.cat([packed[0, :8], packed[0, 9:21]])  # position 8 predicts across the boundary
    want = torch.cat([alone[0, :8], alone[1, :12]])
    assert torch.equal(
        torch.cat([packed_targets[0, :8], packed_targets[0, 9:21]]),
        torch.cat([alone_targets[0, :8], alone_targets[1, :12]]),
    )
    assert packed_targets[0, 8] == -100
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert int((want > 0).sum()) == 8 - 2 + 12 - 3  # the trained positions


def test_sampler_is_a_pure_function_of_the_step():
    s1 = StepSampler(10, 4, seed=3, shuffle=True)
    s2 = StepSampler(10, 4, seed=3, shuffle=True)
    steps = [s1.global_batch(i) for i in range(5)]  # 20 positions = 2 epochs
    assert [s2.global_batch(i) for i in reversed(range(5))] == list(reversed(steps))
    flat = [i for b in steps for i in b]
    # every epoch is a permutation of all rows
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:]  # and the epochs are shuffled differently


def test_ranks_and_micro_batches_partition_the_global_batch():
    s = StepSampler(32, 8, seed=0, shuffle=True)
    parts = [s.micro_batches(2, rank, 2, 2) for rank in range(2)]
    assert all(len(p) == 2 and all(len(mb) == 2 for mb in p) for p in parts)
    assert sorted(i for p in parts for mb in p for i in mb) == sorted(s.global_batch(2))
