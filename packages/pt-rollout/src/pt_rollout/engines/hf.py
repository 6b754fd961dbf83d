"""The Hugging Face transformers engine: always available, the reference for the vLLM one.

Generation batches requests of similar prompt length (sorted, left-padded), runs one prefill
and then one token per step through the KV cache, and drops finished rows from the cache so
short completions stop costing compute. Llama-family models decode through :mod:`.lean`
(the same weights and formulas without the module stack), others through their forward.
Each request samples from its own seeded generator, so a completion does not depend on
which batch it landed in. Scoring is one forward pass per batch that keeps only the logits
of completion positions.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from pt_core.log import get_logger
from pt_rollout.engines.base import Completion, Engine, Request, SamplingParams, TokenScores

log = get_logger(__name__)


DECODERS = ("auto", "lean", "hf")


class HFEngine(Engine):
    name = "hf"

    def __init__(
        self,
        model,
        *,
        dtype: str = "auto",
        device: str = "auto",
        max_batch_size: int = 64,
        max_batch_tokens: int = 65536,
        logits_budget_mb: int = 1024,
        tokenizer=None,
        seed: int = 0,
        decoder: str = "auto",
    ):
        """``model``: a checkpoint directory (or hub name), or a loaded causal LM to generate
        with as it is (e.g. the model being trained: its weights are live, nothing is copied);
        then ``tokenizer`` is needed too. ``decoder``: ``lean`` decodes with :mod:`.lean`
        where it takes the model (the same logits to rounding, fewer operations per token),
        ``hf`` with the model's forward, ``auto`` lean on a CPU only (where per-operation
        overhead is the step's cost)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from pt_rollout.engines.lean import lean_decoder

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        # transformers' own objects: a causal LM and its tokenizer
        self.model: Any
        self.tokenizer: Any
        if isinstance(model, str | bytes) or hasattr(model, "__fspath__"):
            path = os.fsdecode(model)
            torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
            self.model.to(self.device).eval()
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        else:
            self.model = model
            self.tokenizer = tokenizer
        # Batches sampled with seeding "engine" (not per sample) sample from this one.
        self._batch_generator = torch.Generator(device=self.device).manual_seed(seed)
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.tokenizer.eos_token_id or 0
        config = self.model.config
        # A 4-D bool mask goes to sdpa as it is (no mask built per decoding step); models
        # with sliding-window or other non-global layers get the 2-D mask they build from.
        self._bool_mask = (
            getattr(config, "_attn_implementation", None) == "sdpa"
            and not getattr(config, "sliding_window", None)
            and all(t == "full_attention" for t in getattr(config, "layer_types", None) or [])
        )
        # transformers renamed past_key_values to cache (5.2x); accept both.
        # (the class's forward: a trainer may wrap the instance's)
        forward_args = inspect.signature(type(self.model).forward).parameters
        self._cache_arg = "cache" if "cache" in forward_args else "past_key_values"
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
        lean = decoder == "lean" or (decoder == "auto" and self.device.type == "cpu")
        self._lean = lean_decoder(self.model) if lean else None
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.logits_budget_bytes = logits_budget_mb * 2**20
        log.info(
            "hf engine: %s on %s (%s), %s decoder",
            model if isinstance(model, str) else type(model).__name__,
            self.device,
            self.model.dtype,
            "lean" if self._lean else "transformers",
        )

    @property
    def max_model_len(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2**31))

    # ------------------------------------------------------------------ generation

    def generate(
        self,
        requests: Sequence[Request],
        params: SamplingParams,
        *,
        on_token: Callable[[int, int], None] | None = None,
    ) -> list[Completion]:
        """Completions of ``requests``; a model being trained (given as a module) is put in
        eval mode for them (no dropout) and back in the mode it was in after.
        ``on_token(request index, token id)`` is called with each token as it is sampled
        (a server streams them)."""
        results: list[Completion | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_token_ids))
        was_training = self.model.training
        self.model.eval()
        try:
            for batch in self._batches(
                order, lambda i: len(requests[i].prompt_token_ids) + params.max_tokens
            ):
                in_batch = None
                if on_token is not None:
                    in_batch = lambda row, token, batch=batch: on_token(batch[row], token)  # noqa: E731
                completions = self._generate_batch([requests[i] for i in batch], params, in_batch)
                for i, completion in zip(batch, completions, strict=True):
                    results[i] = completion
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    def _batches(self, order: list[int], cost) -> list[list[int]]:
        """Consecutive runs of ``order`` (sorted by length) that fit the batch budgets."""
        batches, batch, longest = [], [], 0
        for i in order:
            longest_if_added = max(longest, cost(i))
            if batch and (
                len(batch) >= self.max_batch_size
                or longest_if_added * (len(batch) + 1) > self.max_batch_tokens
            ):
                batches.append(batch)
                batch, longest_if_added = [], cost(i)
            batch.append(i)
            longest = longest_if_added
        if batch:
            batches.append(batch)
        return batches

    def _generate_batch(
        self, requests: list[Request], params: SamplingParams, on_token=None
    ) -> list[Completion]:
        import torch

        dev = self.device
        lengths = [len(r.prompt_token_ids) for r in requests]
        for n in lengths:
            if n == 0:
                raise ValueError("cannot generate from an empty prompt")
            if n >= self.max_model_len:
                raise ValueError(
                    f"prompt of {n} tokens leaves no room to generate "
                    f"(model length {self.max_model_len})"
                )
        width = max(lengths)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for row, r in enumerate(requests):
            input_ids[row, width - lengths[row] :] = torch.tensor(r.prompt_token_ids)
            mask[row, width - lengths[row] :] = 1
        input_ids, mask = input_ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        next_position = mask.sum(-1, keepdim=True)  # [A, 1]
        budgets = [min(params.max_tokens, self.max_model_len - n) for n in lengths]
        decoder = self._lean or _HFDecoder(self)
        decoder.start(mask, width + max(budgets))
        uniforms = None
        if not params.greedy and params.per_sample:
            uniforms = SeededUniforms([r.seed for r in requests], max(budgets), dev)
        stop_ids = set(params.stop_token_ids)
        stop_window = max((len(s) for s in params.stop), default=0) + 8

        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        top_ids: list[list[list[int]]] = [[] for _ in requests]
        top_logprobs: list[list[list[float]]] = [[] for _ in requests]
        finish = [""] * len(requests)  # "stop" or "length" once a row ends
        active = list(range(len(requests)))  # request index of each row still in the cache

        with torch.inference_mode():
            logits = decoder.forward(input_ids, positions)  # [A, V]
            while True:
                chosen, sampled_logprobs = self._sample(logits, params, uniforms, active)  # [A]
                chosen_logprobs = topk = None
                raw: Any = None  # [A, V] log-probs, when some are returned
                if params.logprobs_top_k or (params.logprobs and params.logprobs_mode == "raw"):
                    raw = torch.log_softmax(logits, -1)
                if params.logprobs:
                    chosen_logprobs = (
                        sampled_logprobs
                        if params.logprobs_mode == "processed"
                        else raw.gather(-1, chosen[:, None])[:, 0]
                    ).tolist()
                if params.logprobs_top_k:
                    values, ids = raw.topk(min(params.logprobs_top_k, raw.shape[-1]), -1)
                    topk = (ids.tolist(), values.tolist())
                chosen_list = chosen.tolist()
                keep = []
                for row, i in enumerate(active):
                    token = chosen_list[row]
                    tokens[i].append(token)
                    if on_token is not None:
                        on_token(i, token)
                    if chosen_logprobs is not None:
                        logprobs[i].append(float(chosen_logprobs[row]))
                    if topk is not None:
                        top_ids[i].append(topk[0][row])
                        top_logprobs[i].append(topk[1][row])
                    if token in stop_ids or (
                        params.stop and self._hits_stop(tokens[i], params.stop, stop_window)
                    ):
                        finish[i] = "stop"
                    elif len(tokens[i]) >= budgets[i]:
                        finish[i] = "length"
                    else:
                        keep.append(row)
                if not keep:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, device=dev)
                    decoder.select(index)
                    next_position, chosen = next_position[index], chosen[index]
                    active = [active[row] for row in keep]
                logits = decoder.forward(chosen[:, None], next_position)
                next_position = next_position + 1
        return [
            Completion(
                tokens[i],
                finish[i],
                logprobs[i] if params.logprobs else None,
                top_ids[i] if params.logprobs_top_k else None,
                top_logprobs[i] if params.logprobs_top_k else None,
            )
            for i in range(len(requests))
        ]

    def _sample(
        self, logits, params: SamplingParams, uniforms: SeededUniforms | None, active: list[int]
    ):
        """[A] sampled tokens and their log-probs under the distribution sampled from
        (temperature, then top-k and top-p, renormalised), from each request's own generator
        (``uniforms``) or, for unseeded requests, from the engine's one."""
        import torch

        if params.greedy:
            chosen = logits.argmax(-1)
            return chosen, torch.zeros(chosen.shape, device=logits.device)
        scaled = logits / params.temperature
        if 0 < params.top_k < scaled.shape[-1]:
            # Keep the k most likely tokens (ties at the k-th value kept, as vLLM does).
            kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            # Keep the smallest set of most likely tokens whose mass reaches top_p.
            sorted_probs, sorted_ids = probs.sort(dim=-1, descending=True)
            mass_before = sorted_probs.cumsum(-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(mass_before >= params.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, sorted_ids, sorted_probs)
            probs = probs / probs.sum(-1, keepdim=True)
        if uniforms is None:
            chosen = torch.multinomial(probs, 1, generator=self._batch_generator)[:, 0]
        else:
            chosen = inverse_cdf(probs, uniforms.next(active))
        return chosen, probs.gather(-1, chosen[:, None])[:, 0].log()

    def _hits_stop(self, token_ids: list[int], stop: tuple[str, ...], window: int) -> bool:
        tail = self.tokenizer.decode(token_ids[-window:], skip_special_tokens=True)
        return any(s in tail for s in stop)

    # ------------------------------------------------------------------ scoring

    def score(
        self,
        prompt_token_ids: Sequence[list[int]],
        completion_token_ids: Sequence[list[int]],
        *,
        top_k: int = 0,
        at_ids: Sequence[list[list[int]]] | None = None,
        temperature: float = 1.0,
    ) -> list[TokenScores]:
        assert len(prompt_token_ids) == len(completion_token_ids)
        if temperature <= 0:
            raise ValueError(f"scoring at temperature {temperature}: it must be > 0")
        for p in prompt_token_ids:
            if not p:
                raise ValueError("cannot score a completion of an empty prompt")
        total = [
            len(p) + len(c) for p, c in zip(prompt_token_ids, completion_token_ids, strict=True)
        ]
        vocab = int(self.model.config.vocab_size)
        bytes_per_row_token = vocab * 4 * (3 if top_k else 2)  # logits, log-softmax, top-k work
        results: list[TokenScores | None] = [None] * len(total)
        order = sorted(range(len(total)), key=lambda i: total[i])
        batches, batch = [], []
        for i in order:
            grown = [*batch, i]
            longest = max(total[j] for j in grown)
            kept = max(len(completion_token_ids[j]) for j in grown) + 1
            if batch and (
                len(grown) > self.max_batch_size
                or longest * len(grown) > self.max_batch_tokens
                or kept * len(grown) * bytes_per_row_token > self.logits_budget_bytes
            ):
                batches.append(batch)
                grown = [i]
            batch = grown
        if batch:
            batches.append(batch)
        for batch in batches:
            scores = self._score_batch(
                [prompt_token_ids[i] for i in batch],
                [completion_token_ids[i] for i in batch],
                top_k,
                [at_ids[i] for i in batch] if at_ids is not None else None,
                temperature,
            )
            for i, s in zip(batch, scores, strict=True):
                results[i] = s
        return results  # type: ignore[return-value]

    def _score_batch(
        self, prompts, completions, top_k: int, at_ids=None, temperature: float = 1.0
    ) -> list[TokenScores]:
        import torch

        sequences = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
        width = max(len(s) for s in sequences)
        longest_completion = max(len(c) for c in completions)
        if width > self.max_model_len:
            raise ValueError(
                f"sequence of {width} tokens exceeds the model length {self.max_model_len}"
            )
        input_ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, s in enumerate(sequences):
            input_ids[row, width - len(s) :] = torch.tensor(s)
            mask[row, width - len(s) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = longest_completion + 1
        with torch.inference_mode():
            logits = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=positions,
                logits_to_keep=keep,
            ).logits  # [B, keep, V]: positions width-keep .. width-1
            results = []
            for row, completion in enumerate(completions):
                n = len(completion)
                if n == 0:
                    results.append(TokenScores([], [] if top_k else None, [] if top_k else None))
                    continue
                # Completion token j sits at position width-n+j and is predicted by the
                # logits at position width-n+j-1, i.e. kept index keep-1-n+j.
                scaled = logits[row, keep - 1 - n : keep - 1].float()
                if temperature != 1.0:
                    scaled = scaled / temperature
                logp = torch.log_softmax(scaled, dim=-1)
                target = torch.tensor(completion, device=logp.device)[:, None]
                scores = TokenScores(logp.gather(-1, target)[:, 0].tolist())
                if top_k:
                    values, ids = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
                    scores.topk_ids, scores.topk_logprobs = ids.tolist(), values.tolist()
                if at_ids is not None:
                    wanted = torch.tensor(at_ids[row], dtype=torch.long, device=logp.device)
                    scores.at_ids_logprobs = logp.gather(-1, wanted).tolist()
                results.append(scores)
        return results

    # ------------------------------------------------------------------ weights

    def load_weights(self, path: str) -> None:
        """Load the safetensors weights of checkpoint directory ``path`` into the model."""
        from pathlib import Path

        from safetensors.torch import load_file

        state = {}
        for shard in sorted(Path(path).glob("*.safetensors")):
            state.update(load_file(str(shard), device=str(self.device)))
        if not state:
            raise ValueError(f"{path} holds no .safetensors weights")
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        # A tied LM head is saved once; any other missing or unknown name is a mismatch.
        if getattr(self.model.config, "tie_word_embeddings", False):
            missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if missing or unexpected:
            raise ValueError(
                f"{path}: weights do not fit the model (missing {missing[:3]}, "
                f"unexpected {unexpected[:3]})"
            )


class _HFDecoder:
    """The model's own forward over its own cache, for models :func:`lean_decoder` does
    not take: the same interface as :class:`LeanDecoder`."""

    def __init__(self, engine: HFEngine):
        self.model = engine.model
        self.bool_mask = engine._bool_mask
        self.cache_arg = engine._cache_arg
        self.cache: Any = None  # the model's KV cache, from its first forward on

    def start(self, prompt_mask, slots: int) -> None:
        import torch

        rows, width = prompt_mask.shape
        # the keys of every step to come: the prompts' (0 on padding), then the new tokens'
        self.mask = torch.ones((rows, slots), dtype=prompt_mask.dtype, device=prompt_mask.device)
        self.mask[:, :width] = prompt_mask
        if self.bool_mask:
            self.mask = self.mask.bool()
        self.keys = 0
        self.cache = None

    def select(self, index) -> None:
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]

    def forward(self, input_ids, position_ids):
        self.keys += input_ids.shape[1]
        if self.cache is None:
            # the prefill: the model builds its causal mask from the 2-D one
            step_mask, extra = self.mask[:, : self.keys].long(), {}
        else:
            # a step's query sees every key of its row but the left padding: as a
            # [A, 1, 1, keys] bool mask that sdpa takes as it is, else as the 2-D mask the
            # model turns into one each step
            step_mask = (
                self.mask[:, None, None, : self.keys] if self.bool_mask
                else self.mask[:, : self.keys]
            )  # fmt: skip
            extra = {self.cache_arg: self.cache}
        out = self.model(
            input_ids=input_ids,
            attention_mask=step_mask,
            position_ids=position_ids,
            use_cache=True,
            **extra,
        )
        self.cache = out[self.cache_arg]
        return out.logits[:, -1, :].float()


class SeededUniforms:
    """One uniform draw in [0, 1) per request and sampling step, from a generator seeded
    with the request's seed: all the steps' draws of a request at once (float64)."""

    def __init__(self, seeds: list[int], steps: int, device):
        import torch

        self.draws = torch.stack(
            [
                torch.rand(
                    steps, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
                )
                for seed in seeds
            ]
        ).to(device)  # [requests, steps]
        self.step = 0

    def next(self, active: list[int]):
        """[A] draws of this step for the requests ``active`` (row order)."""
        import torch

        column = self.draws[:, self.step]
        self.step += 1
        return column[torch.tensor(active, device=column.device)]


def inverse_cdf(probs, u):
    """[A] tokens drawn from each row of ``probs`` ([A, V], rows that may not sum to
    exactly 1) by the inverse of its cumulative distribution at ``u`` ([A] in [0, 1)):
    token i when its interval of the cumulative sum, in float64, holds ``u`` times the
    row's total, so that it is drawn with probability p_i and a token of probability 0
    never is."""
    import torch

    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:]
    if not bool(torch.isfinite(total).all()):
        raise ValueError("probability tensor contains either inf, nan or element < 0")
    # u * total can round up to the total itself: kept below it, the search ends at the
    # last token of non-zero probability
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]
