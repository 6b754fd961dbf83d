"""A generator in its own process, for a trainer's online loop.

    python -m pt_rollout.serve --socket /tmp/x.sock --model ckpt/ [--teacher big/] ...

The process loads an engine (HF or vLLM; its Python can be another environment's, such
as ``.venv-vllm``), listens on a Unix socket for one client and answers its messages in
order:

- ``{"op": "generate", "key": k, "requests": [[prompt_ids, seed], ...], "params": {...},
  "score": {"top_k": K, "at_student_topk": bool} | None}`` -> the completions (and, with
  ``score``, the teacher's log-probs of them), with the weight ``version`` that made them;
- ``{"op": "load_weights", "path": dir, "version": v}`` -> the engine loads the
  checkpoint directory ``dir`` in place (no restart) and later completions carry ``v``;
- ``{"op": "close"}``.

Only plain Python values cross the socket (lists, dicts, numbers), so the two sides need
not share a torch version. Because messages are answered in order, a ``load_weights``
sent after a ``generate`` does not change that generation: the client decides which
weights each round is sampled with by the order it sends them in.

:class:`RemoteGenerator` is the client: it starts the process, sends without waiting,
and collects each answer by its key.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pt_core.errors import PtError
from pt_core.log import get_logger

log = get_logger(__name__)

READY = "PT-SERVE-READY"


# --------------------------------------------------------------------------- server


def serve(args) -> None:
    from multiprocessing.connection import Listener

    from pt_rollout.engines import Request, SamplingParams, load_engine

    generator = load_engine(
        args.engine,
        args.model,
        dtype=args.dtype,
        seed=args.seed,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=args.max_model_len,
        max_logprobs=args.max_logprobs,
        logprobs_mode=args.logprobs_mode,
        hf_decoder=args.decoder,
    )
    teacher = None
    if args.teacher:
        teacher = load_engine(
            args.teacher_engine or args.engine,
            args.teacher,
            dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization,
            max_model_len=args.max_model_len,
            max_logprobs=args.max_logprobs,
        )
    version = args.version
    authkey = bytes.fromhex(os.environ.pop("PT_SERVE_AUTHKEY"))
    with Listener(args.socket, family="AF_UNIX", authkey=authkey) as listener:
        print(READY, flush=True)
        with listener.accept() as conn:
            while True:
                try:
                    message = conn.recv()
                except EOFError:
                    return
                op = message.get("op")
                if op == "close":
                    return
                try:
                    if op == "load_weights":
                        start = time.perf_counter()
                        generator.load_weights(message["path"])
                        version = message["version"]
                        reply = {"version": version, "seconds": time.perf_counter() - start}
                    elif op == "generate":
                        start = time.perf_counter()
                        params = SamplingParams(**message["params"])
                        requests = [Request(list(ids), seed) for ids, seed in message["requests"]]
                        completions = generator.generate(requests, params)
                        reply = {
                            "version": version,
                            "completions": [c.__dict__ for c in completions],
                            "generate_s": time.perf_counter() - start,
                        }
                        if message.get("score"):
                            start = time.perf_counter()
                            score = message["score"]
                            scores = teacher.score(
                                [r.prompt_token_ids for r in requests],
                                [c.token_ids for c in completions],
                                top_k=score.get("top_k", 0),
                                at_ids=[c.topk_ids for c in completions]
                                if score.get("at_student_topk")
                                else None,
                            )
                            reply["scores"] = [s.__dict__ for s in scores]
                            reply["score_s"] = time.perf_counter() - start
                    else:
                        reply = {"error": f"unknown op {op!r}"}
                except Exception as exc:  # the client raises it with the message
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                conn.send({"key": message.get("key"), "op": op, **reply})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine", default="hf")
    parser.add_argument("--teacher", default=None)
    parser.add_argument("--teacher-engine", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", type=int, default=0)
    parser.add_argument("--gpu-memory-utilization", type=float, default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--logprobs-mode", default="raw")
    parser.add_argument("--decoder", default="auto")
    serve(parser.parse_args())


# --------------------------------------------------------------------------- client


class RemoteGenerator:
    """Start ``python -m pt_rollout.serve`` and talk to it; see the module docstring."""

    def __init__(
        self,
        model: str,
        *,
        python: str | None = None,
        engine: str = "hf",
        teacher: str | None = None,
        teacher_engine: str | None = None,
        dtype: str = "auto",
        seed: int = 0,
        version: int = 0,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        max_logprobs: int = 20,
        logprobs_mode: str = "raw",
        decoder: str = "auto",
        start_timeout: float = 900.0,
    ):
        from multiprocessing.connection import Client

        self._dir = Path(tempfile.mkdtemp(prefix="pt-serve-"))
        address = str(self._dir / "socket")
        authkey = secrets.token_bytes(16)
        cmd = [python or sys.executable, "-m", "pt_rollout.serve", "--socket", address,
               "--model", str(model), "--engine", engine, "--dtype", dtype, "--seed", str(seed),
               "--version", str(version), "--max-logprobs", str(max_logprobs),
               "--logprobs-mode", logprobs_mode, "--decoder", decoder]  # fmt: skip
        if teacher:
            cmd += ["--teacher", str(teacher)]
            if teacher_engine:
                cmd += ["--teacher-engine", teacher_engine]
        if gpu_memory_utilization is not None:
            cmd += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
        if max_model_len is not None:
            cmd += ["--max-model-len", str(max_model_len)]
        env = {**os.environ, "PT_SERVE_AUTHKEY": authkey.hex()}
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=sys.stderr.fileno(), env=env, text=True
        )
        deadline = time.monotonic() + start_timeout
        for line in self.proc.stdout:
            if line.strip() == READY:
                break
            if time.monotonic() > deadline:
                break
        if self.proc.poll() is not None or not Path(address).exists():
            self.close()
            raise PtError(
                f"the generator process ({engine} engine, {python or sys.executable}) did not "
                "start; its errors are above",
                hint="check rollout.engine and rollout.python (e.g. .venv-vllm/bin/python)",
            )
        self.conn = Client(address, family="AF_UNIX", authkey=authkey)
        self._replies: dict = {}
        self._cond = threading.Condition()
        self._next_key = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                reply = self.conn.recv()
            except (EOFError, OSError):
                with self._cond:
                    self._replies["_closed"] = True
                    self._cond.notify_all()
                return
            with self._cond:
                self._replies[reply["key"]] = reply
                self._cond.notify_all()

    def _send(self, message: dict) -> int:
        key = self._next_key
        self._next_key += 1
        self.conn.send({**message, "key": key})
        return key

    def submit_generate(self, requests, params: dict, score: dict | None = None) -> int:
        """Queue a generation; returns the key to :meth:`wait` on."""
        return self._send(
            {"op": "generate", "requests": [[list(r.prompt_token_ids), r.seed] for r in requests],
             "params": params, "score": score}
        )  # fmt: skip

    def submit_load_weights(self, path: str, version: int) -> int:
        return self._send({"op": "load_weights", "path": str(path), "version": version})

    def done(self, key: int) -> bool:
        with self._cond:
            return key in self._replies

    def wait(self, key: int) -> dict:
        with self._cond:
            while key not in self._replies:
                if self._replies.get("_closed") or self.proc.poll() is not None:
                    raise PtError(
                        f"the generator process ended (exit {self.proc.poll()}); its errors "
                        "are above"
                    )
                self._cond.wait(timeout=1.0)
            reply = self._replies.pop(key)
        if "error" in reply:
            raise PtError(f"the generator failed: {reply['error']}")
        return reply

    def close(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            with contextlib.suppress(OSError):  # the process may have ended already
                conn.send({"op": "close"})
            conn.close()
            self.conn = None
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        import shutil

        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    main()
