"""The generator process: engines loaded from a :class:`GeneratorSpec`, answering one
client's messages in order (:mod:`pt_rollout.serve.protocol`).

It listens on a Unix socket for the trainer that started it (:func:`serve_socket`), or on
a TCP address for one trainer at a time (:class:`pt_rollout.serve.listen.TrainerListener`).
With in-flight updates (vLLM), a ``load_weights`` that arrives while a generation runs is
loaded between two of its steps and answered at once; the generation goes on with the new
weights, and each completion carries ``token_versions``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, cast

from pt_core.log import get_logger
from pt_rollout.serve.protocol import READY, TRANSFER_OPS, shape_of
from pt_rollout.serve.spec import GeneratorSpec

if TYPE_CHECKING:
    from pt_rollout.engines.vllm import VLLMEngine

log = get_logger(__name__)


class ClientGone(Exception):
    """The client closed its end while it was answered."""


class GeneratorServer:
    """The engines of one process and the state of the client it serves: the weight
    version its completions carry, messages read during a generation that are not yet
    due, and the client's weight-transfer group."""

    def __init__(self, spec: GeneratorSpec, *, version: int = 0):
        from transformers import AutoConfig

        self.spec = spec
        self.generator, self.teacher = spec.load()
        self.version = version
        self.model_config = shape_of(AutoConfig.from_pretrained(spec.model).to_dict())
        self._later: collections.deque = collections.deque()
        self._push_started = 0.0
        self.transfer_open = False  # a client's weight-transfer group is joined

    # ------------------------------------------------------------------ one client

    def session(self, conn) -> None:
        """Answer one client until it closes (or goes; :class:`ClientGone` if it went while
        it was answered)."""
        self._later.clear()
        while True:
            try:
                message = self._later.popleft() if self._later else conn.recv()
            except (EOFError, OSError):
                return
            op = message.get("op")
            if op == "close":
                return
            if op == "load_weights":
                self._load(conn, message)
                continue
            try:
                reply = self.answer(message, conn)
            except ClientGone:  # it went during a generation: no one wants the answer
                return
            except Exception as exc:  # the client raises it with the message
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self._send(conn, {"key": message.get("key"), "op": op, **reply})

    def answer(self, message: dict, conn=None) -> dict:
        """The reply to one message other than ``load_weights`` and ``close``."""
        op = message.get("op")
        if op in TRANSFER_OPS:
            return self._transfer(message)
        if op == "generate":
            return self._generate(message, conn)
        if op == "score":
            start = time.perf_counter()
            items = message["items"]
            scores = self._score(
                [p for p, _, _ in items], [c for _, c, _ in items], message["score"],
                [a for _, _, a in items],
            )  # fmt: skip
            return {"version": self.version, "scores": scores,
                    "score_s": time.perf_counter() - start}  # fmt: skip
        if op == "info":
            return self.info()
        return {"error": f"unknown op {op!r}"}

    def info(self) -> dict:
        return {
            **self.spec.info(),
            "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "model_config": self.model_config,
            "version": self.version,
        }

    def end_session(self) -> None:
        """After a client left: its weight-transfer group closed, so the next opens one."""
        if not self.transfer_open:
            return
        try:
            self.generator.close_weight_transfer()  # pyright: ignore[reportAttributeAccessIssue]
        except Exception as exc:  # a push it left half done
            log.warning(
                "the weight-transfer group of the trainer that left could not be closed "
                "(%s: %s); the next trainer's push may fail", type(exc).__name__, exc,
            )  # fmt: skip
        self.transfer_open = False

    # ------------------------------------------------------------------ the ops

    def _generate(self, message: dict, conn) -> dict:
        from pt_rollout.engines import Request, SamplingParams

        start = time.perf_counter()
        params = SamplingParams(**message["params"])
        requests = [Request(list(ids), seed) for ids, seed in message["requests"]]
        started_with = self.version
        if self.spec.in_flight:  # the vLLM engine's (the spec's check)
            engine = cast("VLLMEngine", self.generator)
            completions = engine.generate(
                requests, params, between_steps=self._between_steps(conn), version=self.version
            )
        else:
            completions = self.generator.generate(requests, params)
        reply = {
            "version": started_with,
            "completions": [c.__dict__ for c in completions],
            "generate_s": time.perf_counter() - start,
        }
        score = message.get("score")
        if score:
            start = time.perf_counter()
            reply["scores"] = self._score(
                [r.prompt_token_ids for r in requests], [c.token_ids for c in completions],
                score, [c.topk_ids or [] for c in completions],
            )  # fmt: skip
            reply["score_s"] = time.perf_counter() - start
        return reply

    def _score(self, prompts: list, completions: list, score: dict, at_ids: list) -> list[dict]:
        """The teacher's scores of ``completions``, as ``score`` asks: its top-k, its
        log-probs at ``at_ids`` (the student's top-k), at a temperature."""
        if self.teacher is None:
            raise ValueError(
                "scores were asked of a generator process started without a teacher (--teacher)"
            )
        scores = self.teacher.score(
            prompts,
            completions,
            top_k=score.get("top_k", 0),
            at_ids=at_ids if score.get("at_student_topk") else None,
            temperature=score.get("temperature", 1.0),
        )
        return [s.__dict__ for s in scores]

    def _transfer(self, message: dict) -> dict:
        """One call of vLLM's weight-transfer handshake; the reply's fields."""
        if not self.spec.weight_transfer:
            raise ValueError(
                f"{message['op']}: this generator process was started without --weight-transfer"
            )
        engine = self.generator
        op = message["op"]
        if op == "init_weight_transfer":
            engine.init_weight_transfer(message["init_info"])  # pyright: ignore[reportAttributeAccessIssue]
            self.transfer_open = True
            return {}
        if op == "start_weight_update":
            self._push_started = time.perf_counter()
            engine.start_weight_update()  # pyright: ignore[reportAttributeAccessIssue]
            return {}
        if op == "update_weights":
            engine.update_weights(message["update_info"])  # pyright: ignore[reportAttributeAccessIssue]
            return {}
        engine.finish_weight_update()  # pyright: ignore[reportAttributeAccessIssue]
        self.version = message["version"]
        return {"version": self.version, "seconds": time.perf_counter() - self._push_started}

    def _load(self, conn, message: dict) -> None:
        start = time.perf_counter()
        received = None  # the files a client on another node sent, written here
        try:
            if message.get("files") is not None:
                base = "/dev/shm" if os.path.isdir("/dev/shm") else None
                received = tempfile.mkdtemp(prefix="pt-serve-weights-", dir=base)
                for name, data in message["files"].items():
                    Path(received, Path(name).name).write_bytes(data)
            self.generator.load_weights(received or message["path"])
        except Exception as exc:  # the client raises it with the message
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            self.version = message["version"]
            reply = {"version": self.version, "seconds": time.perf_counter() - start}
        finally:
            if received is not None:
                shutil.rmtree(received, ignore_errors=True)
        self._send(conn, {"key": message.get("key"), "op": "load_weights", **reply})

    def _between_steps(self, conn):
        """In-flight updates: the weight loads that arrived during a generation, done
        between two of its steps; other messages wait their turn."""

        def step() -> int | None:
            loaded = None
            while True:
                try:
                    if not conn.poll():
                        break
                    message = conn.recv()
                except (EOFError, OSError):  # the client is gone: no one wants this generation
                    raise ClientGone from None
                if message.get("op") == "load_weights":
                    self._load(conn, message)
                    loaded = self.version
                else:
                    self._later.append(message)
            return loaded

        return step

    @staticmethod
    def _send(conn, message: dict) -> None:
        try:
            conn.send(message)
        except OSError:  # the client went while this answered it
            raise ClientGone from None


def serve_socket(server: GeneratorServer, path: str, authkey: bytes) -> None:
    """Serve the one trainer that started this process, on the Unix socket ``path``."""
    from multiprocessing.connection import Listener

    with Listener(path, family="AF_UNIX", authkey=authkey) as listener:
        print(READY, flush=True)
        with listener.accept() as conn, contextlib.suppress(ClientGone):
            server.session(conn)
