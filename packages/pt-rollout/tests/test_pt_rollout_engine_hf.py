"""The HF engine against plain transformers: scoring alignment, greedy decoding, sampling."""

from __future__ import annotations

import itertools

import pytest
import torch

from pt_rollout.engines import Request, SamplingParams
from pt_rollout.engines.hf import HFEngine

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFEngine(str(tiny_model_dir), max_batch_size=8)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()


def plain_logprobs(model, prompt, completion):
    """log p(completion[j] | prompt + completion[:j]) and the full distributions, from one
    unpadded forward pass of the whole sequence."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    rows = logp[len(prompt) - 1 : len(prompt) + len(completion) - 1]  # row j predicts token j
    return rows.gather(-1, torch.tensor(completion)[:, None])[:, 0], rows


PROMPTS = [[0, 2, 50, 51, 52], [0, 2, 60], [0, 2, 70, 71, 72, 73, 74, 75, 76], [0, 9]]
COMPLETIONS = [[100, 101, 102], [110, 111, 112, 113, 114, 115], [120], [130, 131, 3]]


def test_score_matches_a_plain_forward_pass_at_every_position(engine, model):
    # Different prompt and completion lengths in one batch exercise the left padding and
    # the kept-logits offset; the reference sees each sequence alone, unpadded.
    scores = engine.score(PROMPTS, COMPLETIONS, top_k=5)
    for prompt, completion, got in zip(PROMPTS, COMPLETIONS, scores, strict=True):
        token_lp, rows = plain_logprobs(model, prompt, completion)
        assert len(got.token_logprobs) == len(completion)
        assert torch.allclose(torch.tensor(got.token_logprobs), token_lp, atol=1e-3)
        top_values, top_ids = rows.topk(5, dim=-1)
        assert got.topk_ids == top_ids.tolist()
        assert torch.allclose(torch.tensor(got.topk_logprobs), top_values, atol=1e-3)


def test_greedy_matches_transformers_generate(engine, model):
    # transformers' own greedy loop on one unpadded prompt is the reference; the engine
    # runs the prompts together, left-padded, and must pick the same tokens.
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(3,))
    got = engine.generate([Request(p) for p in PROMPTS], params)
    for prompt, completion in zip(PROMPTS, got, strict=True):
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=3
            )[0, len(prompt) :].tolist()
        assert completion.token_ids == ref
        assert completion.finish_reason == ("stop" if ref[-1] == 3 else "length")


def test_sampling_is_reproducible_per_request_seed_whatever_the_batch(engine):
    params = SamplingParams(temperature=1.0, max_tokens=10)
    batch = engine.generate([Request(p, seed=7) for p in PROMPTS], params)
    alone = engine.generate([Request(PROMPTS[2], seed=7)], params)[0]
    again = engine.generate([Request(p, seed=7) for p in PROMPTS], params)
    other = engine.generate([Request(PROMPTS[2], seed=8)], params)[0]
    assert [c.token_ids for c in batch] == [c.token_ids for c in again]
    assert batch[2].token_ids == alone.token_ids  # batch company does not change a sample
    assert other.token_ids != alone.token_ids  # the seed does


def test_seeded_sampling_inverts_the_cdf_at_each_requests_own_uniform(engine):
    """A seeded request's token at step t is the one whose interval of the cumulative
    distribution sampled from holds u_t, the t-th float64 uniform of a generator seeded
    with the request's seed, whatever the other rows of the batch (rows leave it here)."""
    from pt_rollout.engines.hf import SeededUniforms

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=g) * 3
    params = SamplingParams(temperature=0.7, top_p=0.9)
    seeds = [11, 12, 13, 14, 15]
    probs = torch.softmax(logits / 0.7, -1)
    sorted_probs, sorted_ids = probs.sort(-1, descending=True)
    kept = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= 0.9, 0.0)
    nucleus = torch.zeros_like(probs).scatter(-1, sorted_ids, kept)
    nucleus = nucleus / nucleus.sum(-1, keepdim=True)
    draws = {s: torch.rand(20, generator=torch.Generator().manual_seed(s), dtype=torch.float64)
             for s in seeds}  # fmt: skip
    uniforms = SeededUniforms(seeds, 20, "cpu")
    active = list(range(5))
    for step in range(20):
        if step == 8:
            active = [0, 2, 3]  # rows 1 and 4 finished
        chosen, logps = engine._sample(logits[active], params, uniforms, active)
        want = []
        for i in active:
            target = float(draws[seeds[i]][step]) * float(nucleus[i].double().sum())
            cdf = itertools.accumulate(nucleus[i].double().tolist())
            want.append(next(t for t, c in enumerate(cdf) if c > target))
        assert chosen.tolist() == want
        assert all(float(nucleus[i, t]) > 0 for i, t in zip(active, want, strict=True))
        torch.testing.assert_close(logps, nucleus[active, want].log())


def test_inverse_cdf_draws_each_token_with_its_probability():
    from pt_rollout.engines.hf import inverse_cdf

    p = torch.tensor([0.0, 0.5, 0.0, 0.2, 0.3, 0.0])
    u = torch.rand(200_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tokens = inverse_cdf(p.expand(len(u), -1), u)
    counts = torch.bincount(tokens, minlength=6).double()
    expected = p.double() * len(u)
    assert counts[p == 0].sum() == 0  # a token of probability 0 is never drawn
    sigma = (expected * (1 - p.double())).sqrt()
    assert ((counts - expected).abs() <= 4 * sigma + 1e-9).all(), counts.tolist()
    # at the ends of [0, 1): the first and the last token of non-zero probability
    edges = inverse_cdf(p.expand(2, -1), torch.tensor([0.0, 1.0 - 2.0**-53], dtype=torch.float64))
    assert edges.tolist() == [1, 4]
    with pytest.raises(ValueError, match="inf, nan"):
        inverse_cdf(torch.tensor([[0.5, float("nan")]]), torch.tensor([0.5], dtype=torch.float64))


def test_seeded_first_tokens_follow_the_models_distribution(tiny_model_dir, model):
    """Over many seeds, the first token of a completion is drawn with the model's
    probability of it (after temperature): a chi-square test on the frequencies."""
    engine = HFEngine(str(tiny_model_dir), max_batch_size=1024)
    prompt = PROMPTS[0]
    n = 20_000
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].double() / 0.1, -1)
    got = engine.generate(
        [Request(prompt, seed=s) for s in range(n)], SamplingParams(0.1, max_tokens=1)
    )
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in got]), minlength=len(probs))
    # the tokens expected at least 5 times each; the rest pooled into one cell
    expected = probs * n
    cells = expected >= 5
    observed = torch.cat([counts[cells].double(), counts[~cells].double().sum()[None]])
    wanted = torch.cat([expected[cells], expected[~cells].sum()[None]])
    chi2 = float(((observed - wanted) ** 2 / wanted.clamp(min=1e-12)).sum())
    dof = int(cells.sum()) - (0 if float(wanted[-1]) > 0 else 1)
    # the 0.999 quantile of chi-square with dof degrees of freedom (Wilson-Hilferty)
    z = 3.09
    bound = dof * (1 - 2 / (9 * dof) + z * (2 / (9 * dof)) ** 0.5) ** 3
    assert dof >= 5 and chi2 < bound, (chi2, bound, dof)


def test_logprobs_of_sampled_tokens_are_the_models(engine):
    # What generation reports for each sampled token must equal what scoring computes for
    # the same tokens: both are the raw model distribution, before temperature.
    params = SamplingParams(temperature=1.3, max_tokens=8, logprobs=True)
    completions = engine.generate([Request(p, seed=1) for p in PROMPTS], params)
    scores = engine.score(PROMPTS, [c.token_ids for c in completions])
    for c, s in zip(completions, scores, strict=True):
        assert c.logprobs == pytest.approx(s.token_logprobs, abs=1e-4)


def test_tiny_top_p_keeps_only_the_most_likely_token(engine):
    # With top_p near 0 the nucleus is the single most likely token: sampling is greedy.
    greedy = engine.generate([Request(p) for p in PROMPTS], SamplingParams(0, max_tokens=8))
    nucleus = engine.generate(
        [Request(p, seed=3) for p in PROMPTS], SamplingParams(1.0, top_p=1e-6, max_tokens=8)
    )
    assert [c.token_ids for c in nucleus] == [c.token_ids for c in greedy]


def test_top_k_one_is_greedy(engine):
    # Only the most likely token survives top_k 1, whatever the temperature.
    greedy = engine.generate([Request(p) for p in PROMPTS], SamplingParams(0, max_tokens=8))
    top1 = engine.generate(
        [Request(p, seed=3) for p in PROMPTS], SamplingParams(1.5, top_k=1, max_tokens=8)
    )
    assert [c.token_ids for c in top1] == [c.token_ids for c in greedy]


def test_processed_logprobs_under_top_k_are_renormalised_over_the_k_tokens(engine, model):
    """top_k 3 at temperature 0.8: every sampled token is among the 3 most likely, and its
    processed log-prob is log softmax over those 3 of logits / 0.8, from a plain forward."""
    params = SamplingParams(
        temperature=0.8, top_k=3, max_tokens=6, logprobs=True, logprobs_mode="processed"
    )
    completions = engine.generate([Request(p, seed=4) for p in PROMPTS], params)
    for prompt, c in zip(PROMPTS, completions, strict=True):
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        rows = logits[len(prompt) - 1 : len(prompt) + len(c.token_ids) - 1] / 0.8
        kept, kept_ids = rows.topk(3, dim=-1)
        sampled = torch.tensor(c.token_ids)
        assert bool((kept_ids == sampled[:, None]).any(-1).all())
        position = (kept_ids == sampled[:, None]).float().argmax(-1)
        want = torch.log_softmax(kept, dim=-1).gather(-1, position[:, None])[:, 0]
        assert c.logprobs == pytest.approx(want.tolist(), abs=1e-4)


def test_stop_string_ends_the_completion(engine):
    free = engine.generate([Request(PROMPTS[0])], SamplingParams(0, max_tokens=16))[0]
    text = engine.tokenizer.decode(free.token_ids, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), "the tiny model's completion should have printable text to stop on"
    stopped = engine.generate(
        [Request(PROMPTS[0])], SamplingParams(0, max_tokens=16, stop=(stop,))
    )[0]
    # Greedy decoding is the same up to the token that completed the stop string.
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert stop in engine.tokenizer.decode(stopped.token_ids, skip_special_tokens=True)
    assert stop not in engine.tokenizer.decode(stopped.token_ids[:-1], skip_special_tokens=True)


def test_processed_logprobs_are_those_of_the_distribution_sampled_from(engine, model):
    """logprobs_mode=processed: log softmax(logits / T) of the sampled token (top-p 1), the
    behaviour policy an importance ratio divides by; computed here from a plain forward."""
    params = SamplingParams(temperature=0.7, max_tokens=6, logprobs=True, logprobs_mode="processed")
    completions = engine.generate([Request(p, seed=5) for p in PROMPTS], params)
    for prompt, c in zip(PROMPTS, completions, strict=True):
        ids = torch.tensor([prompt + c.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        rows = torch.log_softmax(logits / 0.7, dim=-1)[
            len(prompt) - 1 : len(prompt) + len(c.token_ids) - 1
        ]
        want = rows.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        assert c.logprobs == pytest.approx(want.tolist(), abs=1e-4)


def test_top_k_of_every_step_and_the_teachers_log_probs_of_them(engine, model):
    """logprobs_top_k records the raw top-k at each step; scoring at those ids (as a teacher
    does for distillation over the student's top-k) gives the plain forward's log-probs."""
    params = SamplingParams(temperature=1.0, max_tokens=5, logprobs_top_k=3)
    completions = engine.generate([Request(p, seed=2) for p in PROMPTS], params)
    scores = engine.score(
        PROMPTS, [c.token_ids for c in completions], at_ids=[c.topk_ids for c in completions]
    )
    for prompt, c, s in zip(PROMPTS, completions, scores, strict=True):
        _, rows = plain_logprobs(model, prompt, c.token_ids)
        values, ids = rows.topk(3, dim=-1)
        assert c.topk_ids == ids.tolist()
        torch.testing.assert_close(torch.tensor(c.topk_logprobs), values, atol=1e-4, rtol=0)
        at = rows.gather(-1, torch.tensor(c.topk_ids))
        torch.testing.assert_close(torch.tensor(s.at_ids_logprobs), at, atol=1e-4, rtol=0)


def test_engine_seeding_samples_a_batch_from_one_seeded_generator(tiny_model_dir):
    """seeding engine: reproducible for the same engine seed and batch, and a valid sample."""
    params = SamplingParams(temperature=1.0, max_tokens=6, seeding="engine")
    a = HFEngine(str(tiny_model_dir), seed=11).generate([Request(p) for p in PROMPTS], params)
    b = HFEngine(str(tiny_model_dir), seed=11).generate([Request(p) for p in PROMPTS], params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(len(c.token_ids) >= 1 for c in a)
