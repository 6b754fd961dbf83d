"""The OpenAI-compatible wire as pt speaks it, both ways: how a request body spells pt's
:class:`SamplingParams`, and what a choice of the answer holds.

pt's client (:mod:`.client`) writes requests with :func:`completion_request` and
:func:`scoring_request` and reads the choices with :func:`completion_of` and
:func:`scores_of`; pt's server (:mod:`.server`) reads requests with :func:`read_sampling`
and writes choices with :func:`completion_choice` and :func:`chat_choice`. Besides
OpenAI's fields both sides speak vLLM's (``top_k``, ``stop_token_ids``,
``return_token_ids``, ``return_tokens_as_token_ids``, ``prompt_logprobs``), so that pt's
client works with ``vllm serve`` and pt's server with clients written for vLLM:

- ``return_token_ids``: the choice carries ``prompt_token_ids`` and ``token_ids``, the
  ids the model read and sampled (pt's rows keep ids, not text);
- ``prompt_logprobs: K``: the choice carries, for every prompt token t, the distribution
  that predicts it from the tokens before it: ``{"<id>": {"logprob", "rank",
  "decoded_token"}}`` with the actual token (whatever its rank) and ranks 1..K (entry 0,
  which nothing predicts, is null); this is how a served teacher scores a completion;
- ``return_tokens_as_token_ids``: log-prob tokens are spelled ``token_id:<id>``, so the
  ids of a top-k are known whatever their text.
"""

from __future__ import annotations

from typing import Any

from pt_rollout.engines.base import Completion, SamplingParams, TokenScores, ranked_topk

# Fields a server may be sent that ask for nothing when they hold one of these values;
# pt's server refuses any other value of them (it cannot do what they ask).
INERT: dict[str, tuple] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "repetition_penalty": (None, 1, 1.0),
    "min_p": (None, 0, 0.0),
    "min_tokens": (None, 0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "suffix": (None, ""),
    "echo": (None, False),
    "ignore_eos": (None, False),
    "include_stop_str_in_output": (None, False),
    "skip_special_tokens": (None, True),
    "spaces_between_special_tokens": (None, True),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "add_generation_prompt": (None, True),
    "continue_final_message": (None, False),
    "chat_template_kwargs": (None, {}),
    "truncate_prompt_tokens": (None,),
    "stream_options": (None, {}, {"include_usage": False}, {"include_usage": True}),
}
# Fields that describe the caller, not the completion.
METADATA = ("user", "metadata", "store", "service_tier", "request_id")
SAMPLING_FIELDS = ("model", "max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop",
                   "stop_token_ids", "logprobs", "stream", "return_token_ids")  # fmt: skip
COMPLETION_FIELDS = {*SAMPLING_FIELDS, "prompt", "prompt_logprobs", "return_tokens_as_token_ids"}
CHAT_FIELDS = {*SAMPLING_FIELDS, "messages", "max_completion_tokens", "top_logprobs",
               "return_tokens_as_token_ids"}  # fmt: skip


class BadRequest(Exception):
    """A request the server cannot answer as asked: HTTP ``status`` with OpenAI's error
    body, naming the field (``param``)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status

    def body(self) -> dict:
        kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError"}
        return {
            "error": {
                "message": self.message,
                "type": kind.get(self.status, "InternalServerError"),
                "param": self.param,
                "code": self.status,
            }
        }


# --------------------------------------------------------------------------- the client's side


def completion_request(
    model: str, prompt_ids: list[int], params: SamplingParams, *, seed: int | None, max_tokens: int
) -> dict:
    """The body of one ``/v1/completions`` request that samples one completion of
    ``prompt_ids`` as ``params`` says (``seed``: its own sampler's seed, or None for the
    server's generator)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": 1,
        "return_token_ids": True,
    }
    if params.top_k:
        body["top_k"] = params.top_k
    if seed is not None:
        body["seed"] = seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.stop_token_ids:
        body["stop_token_ids"] = list(params.stop_token_ids)
    if params.logprobs or params.logprobs_top_k:
        body["logprobs"] = params.logprobs_top_k
        body["return_tokens_as_token_ids"] = True
    return body


def scoring_request(model: str, token_ids: list[int], top_k: int) -> dict:
    """The body of a prefill-only request that returns the log-prob of every token of
    ``token_ids`` given those before it, and the ``top_k`` most likely tokens there."""
    return {
        "model": model,
        "prompt": list(token_ids),
        "max_tokens": 1,
        "temperature": 0.0,
        "prompt_logprobs": top_k,
        "return_token_ids": True,
    }


class WireError(ValueError):
    """An answer that holds less than it should (a server that cut it short)."""


class Unsupported(WireError):
    """An answer without what pt asked for: the server cannot do it; ``fix`` says where
    it is done."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


SERVERS_THAT_DO = "vllm serve, pt-rollout serve-openai"


def completion_of(choice: dict, params: SamplingParams) -> Completion:
    """A :class:`Completion` from one choice of a ``/v1/completions`` answer to
    :func:`completion_request`."""
    token_ids = choice.get("token_ids")
    if token_ids is None:
        raise Unsupported(
            "the answer holds no token ids (vLLM's return_token_ids): pt keeps the ids a "
            "model sampled, and this server does not say them",
            fix=f"serve the model with a server that says them ({SERVERS_THAT_DO})",
        )
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length"):
        raise WireError(f"the completion ended with finish_reason {finish!r}, not stop or length")
    logprobs = topk_ids = topk_logprobs = None
    if params.logprobs or params.logprobs_top_k:
        block = choice.get("logprobs") or {}
        values = block.get("token_logprobs")
        if values is None or len(values) != len(token_ids):
            raise WireError(
                f"the answer has log-probs of {0 if values is None else len(values)} of its "
                f"{len(token_ids)} tokens"
            )
        if params.logprobs:
            logprobs = [float(v) for v in values]
        if params.logprobs_top_k:
            topk_ids, topk_logprobs = [], []
            for position in block.get("top_logprobs") or []:
                # keyed "token_id:<id>" (return_tokens_as_token_ids); the sampled token is
                # there too, ranked by its log-prob like the others
                ranked = sorted(
                    ((logprob, token_id_of(text)) for text, logprob in position.items()),
                    key=lambda item: -item[0],
                )[: params.logprobs_top_k]
                topk_ids.append([token for _, token in ranked])
                topk_logprobs.append([float(logprob) for logprob, _ in ranked])
            if len(topk_ids) != len(token_ids):
                raise WireError(
                    f"the answer has top log-probs of {len(topk_ids)} of its {len(token_ids)} tokens"
                )
    return Completion(list(token_ids), finish, logprobs, topk_ids, topk_logprobs)


def token_id_of(text: str) -> int:
    if not text.startswith("token_id:"):
        raise WireError(f"a log-prob's token is {text!r}, not token_id:<id>")
    return int(text.removeprefix("token_id:"))


def scores_of(choice: dict, prompt_len: int, completion: list[int], top_k: int) -> TokenScores:
    """The :class:`TokenScores` of ``completion`` from one choice of the answer to
    :func:`scoring_request` over prompt + completion."""
    entries = choice.get("prompt_logprobs")
    if entries is None:
        raise Unsupported(
            "the answer holds no prompt log-probs (vLLM's prompt_logprobs): this server "
            "cannot score given tokens",
            fix=f"serve the teacher with a server that gives them ({SERVERS_THAT_DO}), or "
            "score in-process with --teacher DIR",
        )
    if len(entries) != prompt_len + len(completion):
        raise WireError(
            f"the answer scores {len(entries)} of the {prompt_len + len(completion)} tokens "
            "sent: the server cut the sequence"
        )
    token_logprobs, topk_ids, topk_logprobs = [], [], []
    for j, token in enumerate(completion):
        entry = entries[prompt_len + j] or {}
        actual = entry.get(str(token))
        if actual is None:
            raise WireError(f"the prompt log-probs of token {prompt_len + j} lack its id {token}")
        token_logprobs.append(float(actual["logprob"]))
        if top_k:
            ids, values = ranked_topk(
                ((e.get("rank"), int(t), e["logprob"]) for t, e in entry.items()), top_k
            )
            topk_ids.append(ids)
            topk_logprobs.append(values)
    if not top_k:
        return TokenScores(token_logprobs)
    return TokenScores(token_logprobs, topk_ids, topk_logprobs)


# --------------------------------------------------------------------------- the server's side


def check_fields(body: dict, known: set[str]) -> None:
    """Refuse fields the server does not know, and inert ones asked to do something."""
    for name, value in body.items():
        if name in known or name in METADATA:
            continue
        if name in INERT:
            if value not in INERT[name]:
                raise BadRequest(f"{name}={value!r} is not supported by this server", param=name)
            continue
        raise BadRequest(f"unknown field {name!r}", param=name)


def _number(body: dict, name: str, default, kind, low=None, high=None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{name} must be a number, got {value!r}", param=name)
    if kind is int and value != int(value):
        raise BadRequest(f"{name} must be a whole number, got {value!r}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"at least {low}" if high is None else f"in [{low}, {high}]"
        raise BadRequest(f"{name} must be {bounds}, got {value!r}", param=name)
    return kind(value)


def stop_strings(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a string or a list of strings", param="stop")
    return tuple(s for s in stop if s)


def read_sampling(
    body: dict,
    *,
    max_tokens: int,
    stop_token_ids: tuple[int, ...],
    logprobs_top_k: int,
    logprobs_mode: str,
) -> tuple[SamplingParams, int, int | None]:
    """``(SamplingParams, n, seed)`` of a request: ``max_tokens`` is the number the request
    gets when it names none (capped by the caller at the model's length), ``stop_token_ids``
    the model's own stop tokens (the request's are added), ``logprobs_top_k`` what the
    request's log-probs field asked for (-1: none), ``logprobs_mode`` the server's."""
    extra_stop = body.get("stop_token_ids") or []
    if not isinstance(extra_stop, list) or not all(isinstance(t, int) for t in extra_stop):
        raise BadRequest("stop_token_ids must be a list of token ids", param="stop_token_ids")
    top_k = _number(body, "top_k", 0, int, low=-1)
    try:
        params = SamplingParams(
            temperature=_number(body, "temperature", 1.0, float, low=0),
            top_p=_number(body, "top_p", 1.0, float, low=0, high=1),
            top_k=max(top_k, 0),
            max_tokens=max_tokens,
            stop=stop_strings(body),
            stop_token_ids=tuple(sorted({*stop_token_ids, *extra_stop})),
            logprobs=logprobs_top_k >= 0,
            logprobs_mode=logprobs_mode,
            logprobs_top_k=max(logprobs_top_k, 0),
            seeding="per_sample" if body.get("seed") is not None else "engine",
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest(f"seed must be an integer, got {seed!r}", param="seed")
    return params, _number(body, "n", 1, int, low=1, high=128), seed


def logprob_entries(completion: Completion, token_text) -> list[tuple[str, float, list]]:
    """(token, log-prob, [(token, log-prob) of the top-k]) for each sampled token."""
    values = completion.logprobs or [0.0] * len(completion.token_ids)
    tops = completion.topk_ids or [[] for _ in completion.token_ids]
    top_values = completion.topk_logprobs or [[] for _ in completion.token_ids]
    return [
        (token_text(token), value, [(token_text(t), v) for t, v in zip(ids, vs, strict=True)])
        for token, value, ids, vs in zip(
            completion.token_ids, values, tops, top_values, strict=True
        )
    ]


def completion_choice(
    index: int,
    text: str,
    completion: Completion,
    *,
    token_text,
    logprobs: bool,
    prompt_ids: list[int] | None = None,
    prompt_logprobs: list | None = None,
) -> dict:
    """A choice of a ``/v1/completions`` answer; ``prompt_ids`` given: with the ids
    (``return_token_ids``)."""
    choice: dict[str, Any] = {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": completion.finish_reason,
    }
    if logprobs:
        entries = logprob_entries(completion, token_text)
        offsets, at = [], 0
        for token, _, _ in entries:
            offsets.append(at)
            at += len(token)
        choice["logprobs"] = {
            "tokens": [token for token, _, _ in entries],
            "token_logprobs": [value for _, value, _ in entries],
            "top_logprobs": [dict([(token, value), *top]) for token, value, top in entries],
            "text_offset": offsets,
        }
    if prompt_ids is not None:
        choice["prompt_token_ids"] = list(prompt_ids)
        choice["token_ids"] = list(completion.token_ids)
    if prompt_logprobs is not None:
        choice["prompt_logprobs"] = prompt_logprobs
    return choice


def chat_choice(
    index: int,
    text: str,
    completion: Completion,
    *,
    token_text,
    logprobs: bool,
    prompt_ids: list[int] | None = None,
) -> dict:
    choice: dict[str, Any] = {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": {"content": chat_logprobs(completion, token_text)} if logprobs else None,
        "finish_reason": completion.finish_reason,
    }
    if prompt_ids is not None:
        choice["prompt_token_ids"] = list(prompt_ids)
        choice["token_ids"] = list(completion.token_ids)
    return choice


def chat_logprobs(completion: Completion, token_text) -> list[dict]:
    def item(token: str, value: float) -> dict:
        return {"token": token, "logprob": value, "bytes": list(token.encode("utf-8"))}

    return [
        {**item(token, value), "top_logprobs": [item(t, v) for t, v in top]}
        for token, value, top in logprob_entries(completion, token_text)
    ]


def prompt_logprobs_of(prompt_ids: list[int], scores: TokenScores, token_text) -> list[dict | None]:
    """vLLM's ``prompt_logprobs`` of ``prompt_ids`` from the engine's scores of
    ``prompt_ids[1:]`` given ``prompt_ids[:1]``: null, then for each later token its own
    log-prob and the top-k, ranked (the actual token's rank is null where it is not among
    them: the engines do not count the tokens above it)."""
    entries: list[dict | None] = [None]
    tops = scores.topk_ids or [[] for _ in scores.token_logprobs]
    top_values = scores.topk_logprobs or [[] for _ in scores.token_logprobs]
    for token, value, ids, values in zip(
        prompt_ids[1:], scores.token_logprobs, tops, top_values, strict=True
    ):
        entry = {
            str(t): {"logprob": v, "rank": rank, "decoded_token": token_text(t)}
            for rank, (t, v) in enumerate(zip(ids, values, strict=True), start=1)
        }
        if str(token) not in entry:
            entry[str(token)] = {"logprob": value, "rank": None, "decoded_token": token_text(token)}
        entries.append(entry)
    return entries
