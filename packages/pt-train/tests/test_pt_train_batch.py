"""Batches, the packing mask, the token head and the data order, checked in-process against
reference computations written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pt_train.batch import Row, block_causal_mask, collate, pack_in_order, shift_targets
from pt_train.data import StepSampler
from pt_train.logprobs import (
    GROUP_COST_TOKENS,
    HeadRequest,
    head_outputs,
    install_token_head,
    length_groups,
)
from pt_train.objectives.dft import dft_loss
from pt_train.objectives.sft import sft_loss


def test_sft_and_dft_match_hand_computed_values():
    # One trained position whose target has probability 3/4.
    token_logps = torch.tensor([math.log(0.75)])
    nll = -math.log(0.75)
    total, count, _ = sft_loss(token_logps)
    assert (total.item(), count) == (pytest.approx(nll, abs=1e-6), 1.0)
    # DFT weights the token's cross-entropy by its (stopped-gradient) probability.
    assert dft_loss(token_logps)[0].item() == pytest.approx(0.75 * nll, abs=1e-6)


def test_dft_gradient_is_probability_times_sft_gradient():
    # d/dz of -sg(p) log p = sg(p) * d/dz(-log p): the gradient of SFT scaled by p, here
    # through the chunked head (3 positions per chunk) to the logits of a linear LM head.
    torch.manual_seed(0)
    hidden = torch.randn(5, 4)
    weight = torch.randn(7, 4, requires_grad=True)
    targets = torch.tensor([[3, 1, -100, 6, 0, 2]])
    request = HeadRequest(targets=targets, chunk_mb=1)
    head = lambda h: h @ weight.T  # noqa: E731

    def grads(loss_fn):
        h = hidden.clone().requires_grad_(True)
        out = head_outputs(h, head, request, vocab=7)
        (g,) = torch.autograd.grad(loss_fn(out.token_logps)[0], weight)
        return g, out.token_logps.detach()

    g_sft, logps = grads(sft_loss)
    g_dft, _ = grads(dft_loss)
    # per-token gradients: recompute them one position at a time and weight them by p
    per_token = []
    for i in range(5):
        w = weight.detach().clone().requires_grad_(True)
        logit = hidden[i] @ w.T
        (g,) = torch.autograd.grad(-F.log_softmax(logit, -1)[targets[targets != -100][i]], w)
        per_token.append(g)
    torch.testing.assert_close(g_sft, sum(per_token), atol=1e-5, rtol=1e-5)
    weighted = sum(math.exp(lp) * g for lp, g in zip(logps.tolist(), per_token, strict=True))
    torch.testing.assert_close(g_dft, weighted, atol=1e-5, rtol=1e-5)


def test_chunked_head_equals_the_full_log_softmax_and_its_gradient(tiny_tokenizer):
    """The head's log-probs and gradients, one chunk or many, are those of the model's own
    full logits; positions with IGNORE targets are left out."""
    from pt_train.model import build_llama

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    install_token_head(model)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, len(tiny_tokenizer), (2, 11), generator=g)
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, 7:] = -100
    positions = torch.arange(11).expand(2, 11)
    targets = shift_targets(labels, positions)
    logits = model(input_ids=ids, position_ids=positions).logits[:, :-1].double()
    full = F.log_softmax(logits, -1).gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    want = full[targets != -100]
    (want_grad,) = torch.autograd.grad(want.sum(), model.lm_head.weight)
    vocab = model.lm_head.weight.shape[0]
    three_rows = 3 * 4 * vocab / 2**20  # MiB of fp32 logits in 3 positions
    for chunk_mb in (three_rows, 256):  # 5 chunks of 3 positions; one chunk
        out = model(
            input_ids=ids, position_ids=positions, head=HeadRequest(targets, chunk_mb=chunk_mb)
        )
        torch.testing.assert_close(out.token_logps.double(), want, atol=1e-5, rtol=0)
        (grad,) = torch.autograd.grad(out.token_logps.sum(), model.lm_head.weight)
        torch.testing.assert_close(grad, want_grad.float(), atol=1e-5, rtol=1e-4)
    assert want.numel() == 13  # row 0 trains labels 4..10 (7), row 1 labels 1..6 (6)


def test_length_groups_cut_rows_where_padding_costs_more_than_a_call():
    """Rows sorted by length are cut where the padding saved exceeds a call's cost."""
    # 4 rows of 10 and 4 of 200: one call pads 4 x 190 = 760 positions, more than one
    # call costs; two calls compute 4 x 10 + 4 x 200 positions.
    assert length_groups([200, 10, 200, 10, 10, 200, 10, 200], 200) == [[1, 3, 4, 6], [0, 2, 5, 7]]
    # lengths within a call's cost of each other: one call, every row as it is
    near = [100, 100 - GROUP_COST_TOKENS // 4, 100, 100]
    assert length_groups(near, 100) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rows_run_in_length_groups_give_the_padded_batch_result(tiny_tokenizer, attn):
    """Cutting a right-padded row's padding changes nothing its real tokens see: the log-probs
    and the gradient with row_lengths (rows run in groups) are those of the padded batch."""
    from pt_train.model import build_llama

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.set_attn_implementation(attn)
    install_token_head(model)
    g = torch.Generator().manual_seed(2)
    lengths = [7, 150, 9, 140, 8]  # short and long rows: two groups
    rows = []
    for n in lengths:
        ids = torch.randint(10, len(tiny_tokenizer), (n,), generator=g).tolist()
        rows.append(_row(ids, [-100] * 3 + ids[3:]))
    batch = collate(rows, tiny_tokenizer.pad_token_id, attn)
    assert batch.row_lengths == lengths
    assert len(length_groups(lengths, max(lengths))) == 2
    results = []
    for row_lengths in (None, batch.row_lengths):
        model.zero_grad()
        out = model(
            **batch.model_inputs("cpu", torch.float32),
            head=HeadRequest(batch.targets, row_lengths=row_lengths),
        )
        out.token_logps.sum().backward()
        results.append((out.token_logps.detach(), model.model.layers[0].mlp.up_proj.weight.grad))
    (want, want_grad), (got, got_grad) = results
    assert got.shape == want.shape == (sum(n - 3 for n in lengths),)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-4)


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
        with torch.no_grad():
            logits = model(**batch.model_inputs("cpu", torch.float32)).logits[:, :-1]
        nll = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1), reduction="none"
        )
        return nll.view(batch.targets.shape), batch.targets

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


def test_collate_numbers_sequences_and_maps_trained_tokens_to_them():
    # row 0 packs two sequences (3 + 2 tokens), row 1 holds one of 4 and padding
    rows = [
        _row([11, 12, 13, 21, 22], [-100, 12, 13, -100, 22], [0, 1, 2, 0, 1]),
        _row([31, 32, 33, 34], [-100, -100, 33, 34]),
    ]
    batch = collate(rows, pad_token_id=0)
    assert batch.num_sequences == 3  # the padding of row 1 is not a sequence
    assert batch.tokens == 9
    # trained targets in row-major order: 12, 13 (seq 0), 22 (seq 1), 33, 34 (seq 2)
    assert batch.targets[batch.targets != -100].tolist() == [12, 13, 22, 33, 34]
    assert batch.token_sequence.tolist() == [0, 0, 1, 2, 2]


def test_pack_in_order_keeps_the_order_of_sequences():
    rows = [_row([1] * n, [1] * n) for n in (3, 4, 5, 2, 9)]
    packed = pack_in_order(rows, max_length=8)
    # 3+4 fit in 8, 5+2 fit, 9 is longer than 8 and gets its own row
    assert [len(r) for r in packed] == [7, 7, 9]
    assert collate(packed, 0).num_sequences == 5
    assert np.array_equal(packed[0].position_ids, [0, 1, 2, 0, 1, 2, 3])


def test_block_causal_mask_shows_a_shared_prefix_to_every_sequence():
    # prefix of 2 tokens, then two segments continuing at position 2
    positions = torch.tensor([[0, 1, 2, 3, 2, 3, 4]])
    mask = block_causal_mask(positions, as_bool=True, shared_prefix=torch.tensor([2]))
    expected = [
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 1, 0],
        [1, 1, 0, 0, 1, 1, 1],
    ]
    assert mask[0, 0].int().tolist() == expected


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prompt_rows_give_each_samples_own_log_probs_and_gradient(tiny_tokenizer, attn):
    """Completions of one prompt laid out in one row that holds the prompt once: the
    trained targets, sequences and per-token data keep the samples' order, and the
    log-probs and the gradient are those of one row per sample."""
    from pt_train.model import build_llama
    from pt_train.producers.rollouts import RolloutSample, rollout_batch, shared_prompt_rows

    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.set_attn_implementation(attn)
    install_token_head(model)
    g = torch.Generator().manual_seed(3)

    def ids(n):
        return torch.randint(10, len(tiny_tokenizer), (n,), generator=g).numpy()

    p, q = ids(11), ids(1)  # a prompt of one token shares nothing
    completions = [ids(n) for n in (5, 9, 1, 7, 4, 6)]
    prompts = [p, p, p, ids(8), q, q]
    samples = [
        RolloutSample(pr, c, {"rollout_logps": -np.arange(len(c), dtype=np.float64) - k})
        for k, (pr, c) in enumerate(zip(prompts, completions, strict=True))
    ]
    rows = shared_prompt_rows(samples)
    assert [r.shared_prefix for r in rows] == [10, 0, 0]
    assert [len(r) for r in rows] == [10 + 6 + 10 + 2, 8 + 7, 0 + 5 + 7]
    # at most 26 tokens a row: the third completion of p gets a row of its own
    assert [len(r) for r in shared_prompt_rows(samples, 26)] == [10 + 6 + 10, 11 + 1, 8 + 7, 12]
    results = []
    for shared in (False, True):
        batch = rollout_batch(
            samples, tiny_tokenizer.pad_token_id, attn, shared_prompt_length=64 if shared else None
        )
        assert batch.input_ids.shape[0] == (3 if shared else 6)
        assert batch.num_sequences == 6
        model.zero_grad()
        out = model(**batch.model_inputs("cpu", torch.float32), head=HeadRequest(batch.targets))
        (out.token_logps * torch.arange(1, batch.num_trained + 1)).sum().backward()
        results.append(
            (
                batch.targets[batch.targets != -100],
                batch.token_sequence,
                batch.data["rollout_logps"],
                out.token_logps.detach(),
                model.model.layers[0].self_attn.q_proj.weight.grad.clone(),
            )
        )
    (t0, s0, d0, lp0, g0), (t1, s1, d1, lp1, g1) = results
    assert torch.equal(t0, t1) and t0.tolist() == np.concatenate(completions).tolist()
    assert torch.equal(s0, s1) and torch.equal(d0, d1)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(g1, g0, atol=1e-5, rtol=1e-4)


def test_collate_refuses_a_shared_prefix_without_a_dense_mask():
    row = Row(np.array([1, 2, 3, 2, 3]), np.array([-100, -100, 7, -100, 7]),
              np.array([0, 1, 2, 1, 2]), shared_prefix=1)  # fmt: skip
    with pytest.raises(ValueError, match="dense mask"):
        collate([row], 0, "flash_attention_2")
