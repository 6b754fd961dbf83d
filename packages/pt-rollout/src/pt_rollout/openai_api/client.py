"""pt as a client of an OpenAI-compatible server: an :class:`Engine` whose model runs
elsewhere (``vllm serve``, ``pt-rollout serve-openai``, a cluster's shared teacher).

    endpoint = EndpointOptions("http://node7:8000/v1", concurrency=32)
    with EndpointEngine(endpoint, "Qwen/Qwen2.5-7B-Instruct", tokenizer) as teacher:
        teacher.check_tokenizer(ids)                       # the server reads ids as we do
        scores = teacher.score([prompt_ids], [completion_ids], top_k=8)

It has the engines' interface (:meth:`generate`, :meth:`score`), so ``pt-rollout
generate`` and ``score`` write the same rows through it, resumable the same way. Prompts
go as token ids, made here by the local tokenizer; every request asks for the ids the
server sampled (``return_token_ids``), and scoring asks for the server's prompt log-probs
(:mod:`.protocol`). Requests run ``concurrency`` at a time; a connection that fails, an
answer cut short, a timeout, 408, 429 and 5xx are retried ``retries`` times with
exponential backoff, then end the run (exit 3); what the server refuses (400, 401, 404)
ends it at once (exit 2), each with one line that names the endpoint and the fix.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from pt_core.errors import ConfigError, InputError, RunFailure
from pt_core.log import get_logger
from pt_rollout.engines.base import Completion, Engine, Request, SamplingParams, TokenScores
from pt_rollout.openai_api.protocol import (
    SERVERS_THAT_DO,
    Unsupported,
    WireError,
    completion_of,
    completion_request,
    scores_of,
    scoring_request,
)

log = get_logger(__name__)

DEFAULT_KEY_ENV = "OPENAI_API_KEY"
RETRIED = (408, 409, 429)  # and every 5xx


@dataclass(frozen=True)
class EndpointOptions:
    """Where an OpenAI-compatible server is and how to talk to it: ``url`` is its base URL
    as the ``openai`` client takes it (``http://host:8000/v1``; a bare ``http://host:8000``
    is read as its ``/v1``), the API key is read from the variable ``api_key_env`` (none
    sent where it is unset), ``concurrency`` requests at a time, each given ``timeout``
    seconds and tried ``retries`` more times when it fails in a way that may pass."""

    url: str
    api_key_env: str = DEFAULT_KEY_ENV
    concurrency: int = 16
    timeout: float = 600.0
    retries: int = 3

    def __post_init__(self):
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"--endpoint {self.url!r} is not an http(s) URL",
                hint="pass the server's base URL, e.g. --endpoint http://127.0.0.1:8000/v1",
            )
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.timeout <= 0:
            raise ConfigError(f"--timeout must be > 0 seconds, got {self.timeout}")
        if self.retries < 0:
            raise ConfigError(f"--retries must be >= 0, got {self.retries}")

    @property
    def base_url(self) -> str:
        url = self.url.rstrip("/")
        return url if urlsplit(url).path else url + "/v1"

    @property
    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) or None


class EndpointEngine(Engine):
    """An :class:`Engine` over an OpenAI-compatible server that serves ``model``;
    ``tokenizer`` is the local one the token ids are made and read with. Built, it has
    checked that the server answers, takes the key and serves ``model``."""

    name = "endpoint"

    def __init__(self, options: EndpointOptions, model: str, tokenizer):
        import httpx

        self.options = options
        self.model = model
        self.tokenizer = tokenizer
        self.where = f"--endpoint {options.base_url}"
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self._loop = asyncio.new_event_loop()
        self._client = httpx.AsyncClient(
            base_url=options.base_url,
            headers=headers,
            timeout=httpx.Timeout(options.timeout, connect=min(options.timeout, 10.0)),
            limits=httpx.Limits(
                max_connections=options.concurrency, max_keepalive_connections=options.concurrency
            ),
        )
        self._max_model_len = self._served_model_length()
        log.info("endpoint %s: model %s", options.base_url, model)

    # ------------------------------------------------------------------ the engine interface

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def generate(self, requests: Sequence[Request], params: SamplingParams) -> list[Completion]:
        if params.logprobs and params.logprobs_mode != "raw":
            raise ValueError(
                "a server returns the log-probs of the distribution it was started with "
                "(vllm serve --logprobs-mode, pt-rollout serve-openai --logprobs-mode); pt "
                f"cannot ask for {params.logprobs_mode} ones"
            )
        bodies = [
            completion_request(
                self.model,
                r.prompt_token_ids,
                params,
                seed=None if params.greedy or not params.per_sample else r.seed,
                max_tokens=min(params.max_tokens, self.max_model_len - len(r.prompt_token_ids)),
            )
            for r in requests
        ]
        answers = self._run(bodies)
        return [self._read(completion_of, answer, params) for answer in answers]

    def score(
        self,
        prompt_token_ids: Sequence[list[int]],
        completion_token_ids: Sequence[list[int]],
        *,
        top_k: int = 0,
        at_ids=None,
    ) -> list[TokenScores]:
        if at_ids is not None:
            raise ValueError(
                "a server returns the top-k of each position only, not the log-probs of "
                "given tokens; score those in-process with the HF engine (--engine hf)"
            )
        for p in prompt_token_ids:
            if not p:
                raise ValueError("cannot score a completion of an empty prompt")
        bodies = [
            scoring_request(self.model, list(p) + list(c), top_k)
            for p, c in zip(prompt_token_ids, completion_token_ids, strict=True)
        ]
        answers = self._run(bodies)
        return [
            self._read(scores_of, answer, len(p), list(c), top_k)
            for answer, p, c in zip(answers, prompt_token_ids, completion_token_ids, strict=True)
        ]

    def check_tokenizer(self, token_ids: list[int]) -> None:
        """Refuse a server whose tokenizer reads text otherwise than the local one: the text
        of ``token_ids`` (the first row's, say) is sent as text, and the ids the server
        makes of it must be those the local tokenizer makes."""
        text = self.tokenizer.decode(token_ids)
        ours = list(self.tokenizer(text).input_ids)
        body = {"model": self.model, "prompt": text, "max_tokens": 1, "temperature": 0.0,
                "return_token_ids": True}  # fmt: skip
        choice = self._run([body])[0]["choices"][0]
        theirs = choice.get("prompt_token_ids")
        if theirs is None:
            raise InputError(
                f"{self.where} does not say the token ids it reads and samples "
                "(vLLM's return_token_ids): pt keeps token ids, and cannot check the "
                "server's tokenizer against the local one",
                hint=f"serve the model with a server that says them ({SERVERS_THAT_DO})",
            )
        if list(theirs) != ours:
            at = next(
                (i for i, (a, b) in enumerate(zip(theirs, ours, strict=False)) if a != b),
                min(len(theirs), len(ours)),
            )
            raise InputError(
                f"{self.where} tokenizes text otherwise than the local tokenizer: the "
                f"first row's text is {len(theirs)} tokens there, {len(ours)} here, and "
                f"they differ from token {at} on ({theirs[at : at + 3]} there, "
                f"{ours[at : at + 3]} here), so its scores and samples would be of other tokens",
                hint="pass the served model's own tokenizer with --tokenizer (the rows' ids "
                "must mean the same text to the server)",
            )

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()

    # ------------------------------------------------------------------ the wire

    def _read(self, parse, answer: dict, *args):
        choices = answer.get("choices") or []
        try:
            if len(choices) != 1:
                raise WireError(f"the answer has {len(choices)} choices, not 1")
            return parse(choices[0], *args)
        except Unsupported as exc:
            raise InputError(f"{self.where}: {exc}", hint=exc.fix) from None
        except WireError as exc:
            raise RunFailure(
                f"{self.where}: {exc}",
                hint="the server answered less than it was asked for; check its log (and "
                "its --max-model-len), then run the same command again to resume",
            ) from None

    def _served_model_length(self) -> int:
        """Check that the server answers and serves ``model``; its context length (vLLM's
        ``max_model_len`` in ``/v1/models``), or no limit where it does not say one."""
        listing = self._run([None], path="/models", first=True)[0]
        served = {m.get("id"): m for m in listing.get("data") or [] if isinstance(m, dict)}
        if self.model not in served:
            names = ", ".join(map(str, served)) or "none"
            raise ConfigError(
                f"{self.where} does not serve the model {self.model!r}; it serves: {names}",
                hint="name one of those (the model field of every request)",
            )
        length = served[self.model].get("max_model_len")
        return int(length) if isinstance(length, int) else 2**31

    def _run(self, bodies: list, *, path: str = "/completions", first: bool = False) -> list:
        """The JSON answers to ``bodies`` posted to ``path`` (a GET where a body is None),
        ``concurrency`` at a time, in order. ``first``: the first contact, where a server
        that cannot be reached is a wrong ``--endpoint`` (exit 2) rather than one that went
        away (exit 3)."""

        async def all_of() -> list:
            limit = asyncio.Semaphore(self.options.concurrency)

            async def one(body):
                async with limit:
                    return await self._request(path, body, first)

            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(body)) for body in bodies]
            return [task.result() for task in tasks]

        try:
            return self._loop.run_until_complete(all_of())
        except BaseExceptionGroup as group:
            raise group.exceptions[0] from None

    async def _request(self, path: str, body: dict | None, first: bool) -> dict:
        import httpx

        tries = self.options.retries + 1
        for attempt in range(tries):
            try:
                if body is None:
                    response = await self._client.get(path)
                else:
                    response = await self._client.post(path, json=body)
            except httpx.TimeoutException:
                reason = f"no answer within --timeout {self.options.timeout:g} s"
            except httpx.TransportError as exc:
                reason = _transport_failure(exc)
                if first and isinstance(exc, httpx.ConnectError):
                    raise ConfigError(
                        f"{self.where}: {reason}",
                        hint="start the server first (vllm serve MODEL, pt-rollout serve-openai "
                        "--model DIR), or correct the address",
                    ) from None
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except ValueError:
                        reason = "an answer that is not JSON"
                elif response.status_code in RETRIED or response.status_code >= 500:
                    reason = f"HTTP {response.status_code}: {_server_message(response)}"
                else:
                    raise self._refused(response)
            if attempt + 1 < tries:
                delay = min(0.5 * 2**attempt, 8.0) * (0.5 + random.random())
                log.warning(
                    "%s: %s; trying again in %.1f s (%d of %d)",
                    self.options.base_url,
                    reason,
                    delay,
                    attempt + 2,
                    tries,
                )
                await asyncio.sleep(delay)
        raise RunFailure(
            f"{self.where}: {reason} ({tries} tries)",  # pyright: ignore[reportPossiblyUnboundVariable]
            hint="check the server and its log, then run the same command again: it resumes "
            "after the rows written (--retries and --timeout give a slow server more room)",
        )

    def _refused(self, response) -> Exception:
        message = _server_message(response)
        if response.status_code in (401, 403):
            sent = (
                f"the key in ${self.options.api_key_env}"
                if self.options.api_key
                else f"no key (${self.options.api_key_env} is unset)"
            )
            return ConfigError(
                f"{self.where} refused {sent}: HTTP {response.status_code}: {message}",
                hint=f"export {self.options.api_key_env}=<the server's key> (--api-key-env "
                "names another variable)",
            )
        if response.status_code == 404:
            return ConfigError(
                f"{self.where}: HTTP 404 for {response.request.url.path}: {message}",
                hint="pass the server's base URL (the one the openai client takes, ending in "
                "/v1) and a model it serves",
            )
        return InputError(
            f"{self.where} refused a request: HTTP {response.status_code}: {message}",
            hint="change what the server refuses (a prompt too long for it, more log-probs "
            "than its --max-logprobs), or start it with room for it",
        )


def _server_message(response) -> str:
    """The message of an error answer (OpenAI's ``{"error": {"message"}}``, or its text)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:300]
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])[:300]
    return str(body)[:300]


def _transport_failure(exc) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect: {exc}" if str(exc) else "cannot connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the answer was cut short ({exc})"
    return f"{type(exc).__name__}: {exc}"
