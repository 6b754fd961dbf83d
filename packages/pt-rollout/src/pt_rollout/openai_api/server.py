"""pt as an OpenAI-compatible server: a checkpoint (or an engine already running) served
as ``/v1/models``, ``/v1/completions`` and ``/v1/chat/completions``, streaming too.

    pt-rollout serve-openai --model ckpt/ --engine vllm          # http://127.0.0.1:8000/v1

    server = OpenAIServer(engine, tokenizer, model_name="policy", stop_ids=..., chat_stop_ids=...)
    url = server.start("127.0.0.1", 0)                          # in a thread; server.stop()

Chat requests are rendered with the checkpoint's chat template (or ``--chat-template``)
and end at its end-of-turn token and the EOS; text prompts end at the EOS ids; a
request's ``stop`` strings and ``stop_token_ids`` are added. Every request field either
does what it says (:mod:`.protocol` lists them, vLLM's ``top_k``, ``stop_token_ids``,
``return_token_ids``, ``prompt_logprobs`` included) or is refused with HTTP 400 naming it.
With an API key, every ``/v1`` route wants ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pt_core.errors import ConfigError, PtError
from pt_core.log import get_logger
from pt_rollout.columns import completion_text
from pt_rollout.engines.base import Completion, Engine, Request, SamplingParams
from pt_rollout.generate import load_local_engine
from pt_rollout.openai_api.protocol import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    BadRequest,
    chat_choice,
    check_fields,
    completion_choice,
    prompt_logprobs_of,
    read_sampling,
)
from pt_rollout.openai_api.runner import Job, Runner, runner_for

log = get_logger(__name__)

READY = "PT-OPENAI-READY"
DEFAULT_LISTEN = "127.0.0.1:8000"
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` to listen on (port 0: any free one)."""
    host, sep, port = str(text).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"--listen {text!r} is not HOST:PORT",
            hint=f"e.g. --listen {DEFAULT_LISTEN} (loopback), or 0.0.0.0:8000 with an API key",
        )
    return host, int(port)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket at host:port, bound now, so that a port in use is one error before
    the model loads."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"--listen {host}:{port}: {exc.strerror or exc}",
            hint="pick a free port (port 0: any), or stop what holds this one",
        ) from None
    sock.listen(2048)
    return sock


class _Sink:
    """A job's results, handed from the engine's thread to the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, stream: bool):
        self.loop = loop
        self.result: asyncio.Future = loop.create_future()
        self.tokens: asyncio.Queue | None = asyncio.Queue() if stream else None

    def token(self, index: int, token_id: int) -> None:
        if self.tokens is not None:
            self.loop.call_soon_threadsafe(self.tokens.put_nowait, (index, token_id))

    def done(self, results: list) -> None:
        self.loop.call_soon_threadsafe(self._settle, results, None)

    def failed(self, error: BaseException) -> None:
        self.loop.call_soon_threadsafe(self._settle, None, error)

    def _settle(self, results, error) -> None:
        if not self.result.done():
            if error is None:
                self.result.set_result(results)
            else:
                self.result.set_exception(error)
        if self.tokens is not None:
            self.tokens.put_nowait(None)


class TextStream:
    """A completion's text as its tokens come: each piece once it is whole (not the start
    of a character's bytes, nor text that may yet be a stop string), and the rest, cut
    before a stop string, at the end: what :func:`completion_text` gives for all of it."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cuts = [text.find(s) for s in self.stop if s in text]
        safe = min(cuts) if cuts else len(text.rstrip("\ufffd")) - self.hold
        return self._send(text, safe)

    def finish(self, token_ids: list[int]) -> str:
        return self._send(completion_text(self.tokenizer, token_ids, list(self.stop)), None)

    def _send(self, text: str, upto: int | None) -> str:
        upto = len(text) if upto is None else upto
        if upto <= self.sent:
            return ""
        piece, self.sent = text[self.sent : upto], upto
        return piece


@dataclass
class _Prepared:
    """A request, read: the prompts' ids, how to sample, what to answer with."""

    prompts: list[list[int]]
    params: list[SamplingParams]  # per prompt (max_tokens capped by the model's length)
    n: int
    seed: int | None
    stream: bool
    logprobs: bool
    token_ids: bool  # return_token_ids
    as_ids: bool  # return_tokens_as_token_ids
    prompt_logprobs: int | None
    usage_in_stream: bool


@dataclass
class _Submitted:
    """A request's jobs in the engine's thread, and where their results come."""

    total: int
    sinks: list[tuple[list[int], _Sink]] = field(default_factory=list)
    score_sink: _Sink | None = None
    jobs: list[Job] = field(default_factory=list)


class OpenAIServer:
    """``engine`` (and the ``tokenizer`` of its model) served under ``model_name``.
    ``stop_ids``: what ends a completion of a text prompt; ``chat_stop_ids``: of a chat
    (the template's end of turn too). ``lock``: the engine is shared (a trainer's): each
    engine call holds it, and requests are batched rather than stepped."""

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        *,
        model_name: str,
        stop_ids: tuple[int, ...],
        chat_stop_ids: tuple[int, ...],
        api_key: str | None = None,
        max_logprobs: int = 20,
        logprobs_mode: str = "raw",
        lock: Any = None,
        root: str | None = None,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.stop_ids = tuple(stop_ids)
        self.chat_stop_ids = tuple(chat_stop_ids)
        self.api_key = api_key
        self.max_logprobs = max_logprobs
        self.logprobs_mode = logprobs_mode
        self.root = root or model_name
        self.created = int(time.time())
        self._runner: Runner = runner_for(engine, lock=lock)
        self._token_texts: dict[int, str] = {}
        self._uvicorn: Any = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ running it

    def app(self):
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(
            routes=[
                Route("/health", self._health, methods=["GET"]),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
            ]
        )

    def serve(self, sock: socket.socket, *, announce: bool = True) -> None:
        """Answer on ``sock`` until Ctrl-C (or :meth:`stop`); ``announce``: print
        ``PT-OPENAI-READY <base URL>`` on stdout once requests are taken."""
        import uvicorn

        url = base_url(sock)

        @contextlib.asynccontextmanager
        async def lifespan(app):
            if announce:
                print(f"{READY} {url}", flush=True)
            log.info("serving %s at %s", self.model_name, url)
            yield

        app = self.app()
        app.router.lifespan_context = lifespan
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                                timeout_keep_alive=60)  # fmt: skip
        self._uvicorn = uvicorn.Server(config)
        if threading.current_thread() is threading.main_thread():
            # uvicorn stops on SIGTERM and then raises it again with the handler it found:
            # Python's default would end the process here, before the engine is closed (a
            # vLLM engine core in a process of its own would be left running)
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._uvicorn.run(sockets=[sock])
        finally:
            self._runner.close()

    def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve in a thread of this process (an engine a trainer holds); returns the base
        URL. :meth:`stop` ends it."""
        sock = bind(host, port)
        url = base_url(sock)

        def run() -> None:
            self.serve(sock, announce=False)

        self._thread = threading.Thread(target=run, name="pt-openai-server", daemon=True)
        self._thread.start()
        while self._uvicorn is None or not self._uvicorn.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server at {url} stopped while starting")
            time.sleep(0.01)
        return url

    def stop(self) -> None:
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ------------------------------------------------------------------ routes

    async def _health(self, request):
        from starlette.responses import Response

        return Response(status_code=200)

    async def _models(self, request):
        try:
            self._authorize(request)
        except BadRequest as exc:
            return _json(exc.body(), status=exc.status)
        card = {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "pt", "root": self.root,
                "max_model_len": self.engine.max_model_len}  # fmt: skip
        return _json({"object": "list", "data": [card]})

    async def _completions(self, request):
        return await self._answer(request, chat=False)

    async def _chat(self, request):
        return await self._answer(request, chat=True)

    async def _answer(self, request, *, chat: bool):
        try:
            self._authorize(request)
            body = await _body(request)
            prepared = self._prepare(body, chat=chat)
        except BadRequest as exc:
            return _json(exc.body(), status=exc.status)
        if prepared.stream:
            from starlette.responses import StreamingResponse

            return StreamingResponse(
                self._stream(request, prepared, chat=chat), media_type="text/event-stream"
            )
        try:
            completions, prompt_scores = await self._collect(self._submit(prepared))
        except BadRequest as exc:
            return _json(exc.body(), status=exc.status)
        choices = []
        for index, completion in enumerate(completions):
            p = index // prepared.n
            choices.append(self._choice(index, completion, prepared, p, chat, prompt_scores))
        return _json(self._envelope(prepared, completions, chat=chat, choices=choices))

    # ------------------------------------------------------------------ reading a request

    def _authorize(self, request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            raise BadRequest(
                "this server wants an API key: Authorization: Bearer <key>", status=401
            )

    def _prepare(self, body: dict, *, chat: bool) -> _Prepared:
        check_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS)
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise BadRequest(
                f"the model {model!r} is not served here; this server serves {self.model_name!r}",
                param="model",
                status=404,
            )
        if chat:
            prompts = [self._chat_prompt(body.get("messages"))]
            logprobs = bool(body.get("logprobs"))
            top = body.get("top_logprobs")
            if top is not None and not logprobs:
                raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
            top_k = (top or 0) if logprobs else -1
            asked = body.get("max_completion_tokens", body.get("max_tokens"))
            stop_ids = self.chat_stop_ids
        else:
            prompts = self._prompts(body.get("prompt"))
            top_k = -1 if body.get("logprobs") is None else body["logprobs"]
            asked = body.get("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
            stop_ids = self.stop_ids
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k > self.max_logprobs:
            raise BadRequest(
                f"log-probs: at most {self.max_logprobs} a position (--max-logprobs), got {top_k}",
                param="top_logprobs" if chat else "logprobs",
            )
        longest = self.engine.max_model_len
        for ids in prompts:
            if len(ids) >= longest:
                raise BadRequest(
                    f"the prompt is {len(ids)} tokens; this model takes {longest} in all, "
                    "which leaves no room to generate",
                    param="messages" if chat else "prompt",
                )
        params, n, seed = read_sampling(
            {**body, "max_tokens": None},
            max_tokens=1,
            stop_token_ids=stop_ids,
            logprobs_top_k=top_k,
            logprobs_mode=self.logprobs_mode,
        )
        if asked is not None and (
            isinstance(asked, bool) or not isinstance(asked, int) or asked < 1
        ):
            raise BadRequest(f"max_tokens must be a whole number >= 1, got {asked!r}",
                             param="max_tokens")  # fmt: skip
        per_prompt = [
            _replace(params, max_tokens=min(asked or longest, longest - len(ids)))
            for ids in prompts
        ]
        stream = bool(body.get("stream"))
        if stream and top_k >= 0:
            raise BadRequest("log-probs are not streamed here; ask without stream", param="stream")
        prompt_logprobs = None if chat else body.get("prompt_logprobs")
        if prompt_logprobs is not None:
            if isinstance(prompt_logprobs, bool) or not isinstance(prompt_logprobs, int):
                raise BadRequest("prompt_logprobs must be a whole number", param="prompt_logprobs")
            if not 0 <= prompt_logprobs <= self.max_logprobs:
                raise BadRequest(
                    f"prompt_logprobs: at most {self.max_logprobs} a position (--max-logprobs), "
                    f"got {prompt_logprobs}",
                    param="prompt_logprobs",
                )
            if stream:
                raise BadRequest("prompt_logprobs are not streamed; ask without stream",
                                 param="stream")  # fmt: skip
        options = body.get("stream_options") or {}
        return _Prepared(
            prompts=prompts,
            params=per_prompt,
            n=n,
            seed=seed,
            stream=stream,
            logprobs=top_k >= 0,
            token_ids=bool(body.get("return_token_ids")),
            as_ids=bool(body.get("return_tokens_as_token_ids")),
            prompt_logprobs=prompt_logprobs,
            usage_in_stream=bool(options.get("include_usage")),
        )

    def _prompts(self, prompt) -> list[list[int]]:
        """``prompt`` as token-id lists: a string, a list of strings, a list of ids, or a
        list of id lists."""
        one_of_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)
        if isinstance(prompt, str) or one_of_ids:
            prompt = [prompt]
        if not isinstance(prompt, list) or not prompt:
            raise BadRequest("prompt must be a string, a list of strings or token ids",
                             param="prompt")  # fmt: skip
        prompts = []
        vocab = len(self.tokenizer)
        for item in prompt:
            if isinstance(item, str):
                ids = list(self.tokenizer(item).input_ids)
            elif isinstance(item, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in item
            ):
                ids = list(item)
                if any(not 0 <= t < vocab for t in ids):
                    raise BadRequest(f"a prompt token id is outside the vocabulary (0..{vocab - 1})",
                                     param="prompt")  # fmt: skip
            else:
                raise BadRequest("prompt must be a string, a list of strings or token ids",
                                 param="prompt")  # fmt: skip
            if not ids:
                raise BadRequest("a prompt is empty", param="prompt")
            prompts.append(ids)
        return prompts

    def _chat_prompt(self, messages) -> list[int]:
        from pt_rollout.prompts import prompt_token_ids

        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list", param="messages")
        plain = []
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a role", param="messages")
            content = message.get("content")
            if isinstance(content, list):  # content parts: text ones only
                if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                    raise BadRequest(f"messages[{i}]: only text content parts are served here",
                                     param="messages")  # fmt: skip
                content = "".join(str(p.get("text", "")) for p in content)
            if not isinstance(content, str):
                raise BadRequest(f"messages[{i}].content must be text", param="messages")
            plain.append({"role": message["role"], "content": content})
        try:
            return prompt_token_ids(self.tokenizer, plain)
        except PtError as exc:
            raise BadRequest(f"the chat template: {exc.message}", param="messages") from None
        except Exception as exc:  # the template's own raise_exception (an unknown role, say)
            raise BadRequest(f"the chat template cannot render these messages: {exc}",
                             param="messages") from None  # fmt: skip

    # ------------------------------------------------------------------ running a request

    def _requests(self, prepared: _Prepared) -> list[tuple[Request, SamplingParams]]:
        return [
            (Request(ids, (prepared.seed or 0) + j), prepared.params[p])
            for p, ids in enumerate(prepared.prompts)
            for j in range(prepared.n)
        ]

    def _submit(self, prepared: _Prepared, *, stream: bool = False) -> _Submitted:
        """Hand the request's generations (one job per set of sampling parameters: the
        prompts' max_tokens may differ) and scorings to the engine's thread."""
        loop = asyncio.get_running_loop()
        pairs = self._requests(prepared)
        groups: dict[SamplingParams, list[int]] = {}
        for index, (_, params) in enumerate(pairs):
            groups.setdefault(params, []).append(index)
        submitted = _Submitted(total=len(pairs))
        for params, indices in groups.items():
            sink = _Sink(loop, stream=stream)
            requests = [pairs[i][0] for i in indices]
            submitted.jobs.append(self._runner.generate(requests, params, sink, stream=stream))
            submitted.sinks.append((indices, sink))
        if prepared.prompt_logprobs is not None:
            submitted.score_sink = _Sink(loop, stream=False)
            submitted.jobs.append(self._runner.score(
                [ids[:1] for ids in prepared.prompts], [ids[1:] for ids in prepared.prompts],
                prepared.prompt_logprobs, submitted.score_sink))  # fmt: skip
        return submitted

    async def _collect(self, submitted: _Submitted):
        """The completions of every (prompt, sample), in choice order, and the prompts'
        scores where ``prompt_logprobs`` asked for them."""
        try:
            completions: list[Completion | None] = [None] * submitted.total
            for indices, sink in submitted.sinks:
                for i, completion in zip(indices, await sink.result, strict=True):
                    completions[i] = completion
            scores = None
            if submitted.score_sink is not None:
                scores = await submitted.score_sink.result
        except asyncio.CancelledError:
            for job in submitted.jobs:
                self._runner.cancel(job)
            raise
        except ValueError as exc:  # what the engine refuses of a request
            raise BadRequest(str(exc)) from None
        return completions, scores

    def _choice(self, index, completion, prepared, p, chat, prompt_scores) -> dict:
        text = completion_text(self.tokenizer, completion.token_ids, list(prepared.params[p].stop))
        ids = prepared.prompts[p] if prepared.token_ids else None
        token_text = self._id_text if prepared.as_ids else self._token_text
        if chat:
            return chat_choice(index, text, completion, token_text=token_text,
                               logprobs=prepared.logprobs, prompt_ids=ids)  # fmt: skip
        prompt_logprobs = None
        if prompt_scores is not None:
            prompt_logprobs = prompt_logprobs_of(
                prepared.prompts[p], prompt_scores[p], self._token_text
            )
        return completion_choice(index, text, completion, token_text=token_text,
                                 logprobs=prepared.logprobs, prompt_ids=ids,
                                 prompt_logprobs=prompt_logprobs)  # fmt: skip

    def _envelope(self, prepared: _Prepared, completions, *, chat: bool, choices=None) -> dict:
        generated = sum(len(c.token_ids) for c in completions if c is not None)
        prompt_tokens = sum(len(ids) for ids in prepared.prompts)
        envelope: dict[str, Any] = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
        }
        if choices is not None:
            envelope["choices"] = choices
        envelope["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                             "total_tokens": prompt_tokens + generated}  # fmt: skip
        return envelope

    async def _stream(self, request, prepared: _Prepared, *, chat: bool):
        """Server-sent events: the text of every choice as it is sampled, then each
        choice's end (its finish reason), the usage where asked, and ``[DONE]``."""
        total = len(prepared.prompts) * prepared.n
        texts = [
            TextStream(self.tokenizer, prepared.params[index // prepared.n].stop)
            for index in range(total)
        ]
        tokens: asyncio.Queue = asyncio.Queue()
        submitted = self._submit(prepared, stream=True)
        head = self._envelope(prepared, [], chat=chat)
        head.pop("usage")
        head["object"] = "chat.completion.chunk" if chat else "text_completion"

        def event(index: int, piece: str, token_ids: list[int], finish=None) -> str:
            if chat:
                delta = {"content": piece} if piece or finish is None else {}
                choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None,
                                          "finish_reason": finish}  # fmt: skip
            else:
                choice = {"index": index, "text": piece, "logprobs": None, "finish_reason": finish}
            if prepared.token_ids:
                choice["token_ids"] = token_ids
            return _sse({**head, "choices": [choice]})

        run = asyncio.ensure_future(self._collect(submitted))
        forwards: list[asyncio.Future] = []
        try:
            if chat:
                for index in range(total):
                    first = {"index": index, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}  # fmt: skip
                    if prepared.token_ids:
                        first["prompt_token_ids"] = prepared.prompts[index // prepared.n]
                    yield _sse({**head, "choices": [first]})
            # forward each job's tokens, in the order they come
            forwards += [asyncio.ensure_future(_forward(sink, indices, tokens))
                         for indices, sink in submitted.sinks]  # fmt: skip
            open_jobs = len(forwards)
            while open_jobs:
                item = await tokens.get()
                if item is None:
                    open_jobs -= 1
                    continue
                index, token = item
                piece = texts[index].push(token)
                if piece or prepared.token_ids:
                    yield event(index, piece, [token])
            try:
                completions, _ = await run
            except BadRequest as exc:
                yield _sse(exc.body())
                yield "data: [DONE]\n\n"
                return
            for index, completion in enumerate(completions):
                assert completion is not None
                rest = texts[index].finish(completion.token_ids)
                yield event(index, rest, [], finish=completion.finish_reason)
            if prepared.usage_in_stream:
                yield _sse({**head, "choices": [],
                            "usage": self._envelope(prepared, completions, chat=chat)["usage"]})  # fmt: skip
            yield "data: [DONE]\n\n"
        finally:
            for task in [run, *forwards]:
                if not task.done():
                    task.cancel()

    def _token_text(self, token_id: int) -> str:
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self.tokenizer.decode([token_id])
        return text

    @staticmethod
    def _id_text(token_id: int) -> str:
        return f"token_id:{token_id}"


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


async def _forward(sink: _Sink, indices: list[int], out: asyncio.Queue) -> None:
    """A job's tokens, under the choice indices of the request, into ``out``; None at its
    end."""
    assert sink.tokens is not None
    while True:
        item = await sink.tokens.get()
        if item is None:
            out.put_nowait(None)
            return
        i, token = item
        out.put_nowait((indices[i], token))


def _replace(params: SamplingParams, **changes) -> SamplingParams:
    import dataclasses

    return dataclasses.replace(params, **changes)


async def _body(request) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError:
        raise BadRequest("the request body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    return body


def _json(obj: dict, status: int = 200):
    from starlette.responses import Response

    # log-probs may be -inf: Python's JSON spelling (-Infinity), which Python clients read
    return Response(json.dumps(obj), status_code=status, media_type="application/json")


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


# --------------------------------------------------------------------------- the command


@dataclass
class ServeOptions:
    """``pt-rollout serve-openai``'s settings."""

    listen: str = DEFAULT_LISTEN
    served_model_name: str | None = None
    api_key_env: str | None = None
    engine: str = "auto"
    chat_template: str | None = None
    max_logprobs: int = 20
    logprobs_mode: str = "raw"
    decoder: str = "auto"
    dtype: str = "auto"
    seed: int = 0
    tensor_parallel: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None


def serve_checkpoint(model: str, options: ServeOptions) -> None:
    """Load ``model`` in an engine and serve it until Ctrl-C."""
    from transformers import AutoTokenizer

    from pt_rollout.engines import resolve_engine
    from pt_rollout.prompts import stop_token_ids, use_chat_template

    host, port = parse_listen(options.listen)
    api_key = None
    if options.api_key_env is not None:
        api_key = os.environ.get(options.api_key_env)
        if not api_key:
            raise ConfigError(
                f"--api-key-env {options.api_key_env}: the variable is unset or empty",
                hint=f"export {options.api_key_env}=<a key clients will send>",
            )
    elif not is_loopback(host):
        raise ConfigError(
            f"--listen {options.listen} takes connections from other machines, and no API key "
            "is set: anyone who reaches the port could use the model",
            hint="export PT_API_KEY=<a secret> and add --api-key-env PT_API_KEY (clients send "
            "it as their API key), or listen on 127.0.0.1",
        )
    if options.logprobs_mode not in ("raw", "processed"):
        raise ConfigError(f"--logprobs-mode {options.logprobs_mode!r}", hint="use raw or processed")
    if options.max_logprobs < 0:
        raise ConfigError(f"--max-logprobs must be >= 0, got {options.max_logprobs}")
    sock = bind(host, port)
    if resolve_engine(options.engine) == "vllm":
        # vLLM's engine core in a process of its own, as vllm serve runs it: it schedules
        # and computes the next step while this process answers the last one's requests
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    tokenizer = use_chat_template(AutoTokenizer.from_pretrained(model), options.chat_template)
    engine = load_local_engine(model, options, max_logprobs=options.max_logprobs)
    if options.max_model_len is not None and engine.name != "vllm":
        engine.close()
        raise ConfigError(
            "--max-model-len is the vLLM engine's; the HF engine takes the model's own length",
            hint="drop --max-model-len, or add --engine vllm",
        )
    has_template = getattr(tokenizer, "chat_template", None) is not None
    server = OpenAIServer(
        engine,
        tokenizer,
        model_name=options.served_model_name or model,
        stop_ids=stop_token_ids(model, tokenizer, template=False),
        chat_stop_ids=stop_token_ids(model, tokenizer, template=has_template),
        api_key=api_key,
        max_logprobs=options.max_logprobs,
        logprobs_mode=options.logprobs_mode,
        root=model,
    )
    try:
        server.serve(sock)
    finally:
        engine.close()
        sys.stdout.flush()
