"""The one small interface both engines implement: generate completions, score completions.

Everything above this layer (reading prompts, resuming, writing rows) is engine-agnostic;
everything below it is the engine's business (batching, KV cache, sampling kernels).
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pt_core.sampling import SEEDING


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion per request.

    ``temperature == 0`` is greedy decoding. ``stop`` strings end a completion when its
    decoded text contains one (the text is cut before it); ``stop_token_ids`` and the
    model's EOS end it at that token, which is kept in the token ids.

    ``logprobs`` records each sampled token's log-prob: under the model's raw distribution
    (``logprobs_mode="raw"``), or under the distribution it was sampled from
    (``"processed"``: after temperature and top-p, renormalised), which is what an
    importance ratio needs. ``logprobs_top_k`` also records the k most likely tokens of the
    raw distribution at every step, and their log-probs.

    ``top_k`` (0: all tokens) then ``top_p`` truncate the distribution at temperature,
    which is renormalised over what is kept (vLLM's order).

    ``seeding`` (:mod:`pt_core.sampling`): ``per_sample``, every request samples from its
    own generator seeded with its seed, so a completion does not depend on its batch
    (exact resume); ``engine``, the engine samples a batch at once from one generator
    seeded once (faster on GPUs, where per-request generators make vLLM sample request by
    request), and completions depend on batching.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 1024
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    logprobs_mode: str = "raw"
    logprobs_top_k: int = 0
    seeding: str = "per_sample"

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: all tokens), got {self.top_k}")
        if self.seeding not in SEEDING:
            raise ValueError(f"seeding must be per_sample or engine, got {self.seeding!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode must be raw or processed, got {self.logprobs_mode!r}")
        if self.logprobs_top_k < 0:
            raise ValueError(f"logprobs_top_k must be >= 0, got {self.logprobs_top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def per_sample(self) -> bool:
        return self.seeding == "per_sample"


@dataclass
class Completion:
    """One generated completion: its token ids, why it ended, and (optionally) the log-prob
    of each sampled token (see :class:`SamplingParams` for which distribution) and the raw
    distribution's top-k at every step."""

    token_ids: list[int]
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    logprobs: list[float] | None = None
    topk_ids: list[list[int]] | None = None
    topk_logprobs: list[list[float]] | None = None
    # the weight version each token was sampled with, where weights changed while it was
    # generated (an engine's in-flight updates); None: every token had the request's weights
    token_versions: list[int] | None = None


@dataclass
class TokenScores:
    """A model's view of a completion given its prompt: row ``j`` is the distribution that
    predicts completion token ``j`` (i.e. it was computed from prompt + completion[:j])."""

    token_logprobs: list[float]
    topk_ids: list[list[int]] | None = None
    topk_logprobs: list[list[float]] | None = None
    at_ids_logprobs: list[list[float]] | None = None  # log-probs of given ids per position


@dataclass(frozen=True)
class Request:
    """One completion to generate: the prompt's token ids and the seed of its sampler.

    The seed is per request, so a given (prompt, sample) draws the same completion whatever
    batch it lands in, and a resumed run reproduces an uninterrupted one.
    """

    prompt_token_ids: list[int]
    seed: int = 0


def ranked_topk(entries: Iterable[tuple[int | None, int, float]], k: int):
    """The ``k`` most likely tokens, as ``(ids, log-probs)`` most likely first, of a
    position's ``(rank, token id, log-prob)`` entries (vLLM's form: ranks 1..k plus the
    actual token, whatever its rank, which may be None where it is not known)."""
    ranked = sorted(
        (
            (rank, token, logprob)
            for rank, token, logprob in entries
            if rank is not None and rank <= k
        ),
        key=lambda item: item[0],
    )[:k]
    return [token for _, token, _ in ranked], [float(logprob) for _, _, logprob in ranked]


class Engine(ABC):
    """A loaded model that can generate and score. Engines are used as context managers."""

    name: str = "?"

    @abstractmethod
    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[Completion]:
        """One completion per request, in request order."""

    @abstractmethod
    def score(
        self,
        prompt_token_ids: Sequence[list[int]],
        completion_token_ids: Sequence[list[int]],
        *,
        top_k: int = 0,
        at_ids: Sequence[list[list[int]]] | None = None,
        temperature: float = 1.0,
    ) -> list[TokenScores]:
        """The log-prob of every completion token given the prompt and the completion's
        prefix, with ``top_k > 0`` the k most likely tokens at each completion position,
        and with ``at_ids`` (per request, per completion position, a list of token ids)
        the log-probs of those tokens there; all under ``softmax(logits / temperature)``."""

    @property
    @abstractmethod
    def max_model_len(self) -> int:
        """The longest prompt + completion the engine accepts."""

    def load_weights(self, path: str) -> None:
        """Replace the model's weights with those of the checkpoint directory ``path``
        (same architecture), keeping the engine running."""
        raise NotImplementedError(f"the {self.name} engine cannot load new weights")

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release the model's memory."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sample_seed(seed: int, row_id, sample: int) -> int:
    """The sampler seed of one (id, sample): stable across runs, batches and engines."""
    text = f"{seed}\0{json.dumps(row_id, sort_keys=True, default=str)}\0{sample}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "big") >> 1
