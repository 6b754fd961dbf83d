"""The HF engine against plain transformers: scoring alignment, greedy decoding, sampling."""

from __future__ import annotations

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


def test_seeded_sampling_draws_what_torch_multinomial_draws_with_each_seed(engine):
    """A seeded request's token at each step is torch.multinomial's single draw from the
    distribution sampled from, with a generator seeded by the request's seed (drawn once a
    step), whatever the other rows of the batch, and whether the engine draws the noise
    one step at a time or several (here 1, 3 and 20 steps a block)."""
    from pt_rollout.engines.hf import SeededNoise

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 300, generator=g) * 3
    params = SamplingParams(temperature=0.7, top_p=0.9)
    seeds = [11, 12, 13, 14, 15]
    probs = torch.softmax(logits / 0.7, -1)
    sorted_probs, sorted_ids = probs.sort(-1, descending=True)
    kept = sorted_probs.masked_fill(sorted_probs.cumsum(-1) - sorted_probs >= 0.9, 0.0)
    nucleus = torch.zeros_like(probs).scatter(-1, sorted_ids, kept)
    nucleus = nucleus / nucleus.sum(-1, keepdim=True)
    for steps_a_block in (1, 3, 20):
        mine = [torch.Generator().manual_seed(s) for s in seeds]
        theirs = [torch.Generator().manual_seed(s) for s in seeds]
        noise = SeededNoise(mine, 300, 20, "cpu", budget=steps_a_block * 5 * 300)
        assert noise.k == steps_a_block
        for _ in range(20):  # 20 steps: each generator moves on by one draw a step
            chosen, logps = engine._sample(logits, params, noise, list(range(5)))
            want = [int(torch.multinomial(nucleus[i], 1, generator=theirs[i])) for i in range(5)]
            assert chosen.tolist() == want
            torch.testing.assert_close(logps, nucleus[range(5), want].log())


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
    """seeded=False: reproducible for the same engine seed and batch, and a valid sample."""
    params = SamplingParams(temperature=1.0, max_tokens=6, seeded=False)
    a = HFEngine(str(tiny_model_dir), seed=11).generate([Request(p) for p in PROMPTS], params)
    b = HFEngine(str(tiny_model_dir), seed=11).generate([Request(p) for p in PROMPTS], params)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert all(len(c.token_ids) >= 1 for c in a)
