"""The thread that runs a served engine: requests come from the server's handlers, one
job at a time, and are batched into the engine.

- :class:`SteppingRunner` (a :class:`VLLMEngine` the server owns): continuous batching,
  as ``vllm serve`` does: a request joins the running batch between two engine steps and
  leaves it when it ends, and every step reports each request's new tokens.
- :class:`BatchingRunner` (any engine, one a trainer shares included): the jobs that
  wait when the engine is free are one batch (one ``generate`` per set of sampling
  parameters, one ``score`` per top-k), under a lock the engine's other user takes too.

A job reports to its :class:`Sink` from this thread: each token as it is sampled (where
it streams), then its results, or the error that ended it.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import queue
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Protocol

from pt_core.log import get_logger
from pt_rollout.engines.base import Completion, Engine, Request, SamplingParams, TokenScores

log = get_logger(__name__)


class Sink(Protocol):
    """Where a job's results go (called from the runner's thread)."""

    def token(self, index: int, token_id: int) -> None: ...
    def done(self, results: list) -> None: ...
    def failed(self, error: BaseException) -> None: ...


@dataclass
class Job:
    """Generations of ``requests`` with ``params``, or (``params`` None) scorings of
    ``completions`` given ``requests``' prompts with ``top_k``."""

    requests: list[Request]
    params: SamplingParams | None
    sink: Sink
    stream: bool = False
    completions: list[list[int]] = field(default_factory=list)
    top_k: int = 0
    id: int = 0
    cancelled: bool = False


class Runner:
    """What the server's handlers see of the engine's thread."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="pt-engine", daemon=True)
        self._thread.start()

    def generate(self, requests: list[Request], params: SamplingParams, sink: Sink, *,
                 stream: bool = False) -> Job:  # fmt: skip
        return self._submit(Job(list(requests), params, sink, stream))

    def score(self, prompts: list[list[int]], completions: list[list[int]], top_k: int,
              sink: Sink) -> Job:  # fmt: skip
        job = Job([Request(p) for p in prompts], None, sink, completions=completions, top_k=top_k)
        return self._submit(job)

    def cancel(self, job: Job) -> None:
        """The client went away: the job's results are not wanted."""
        job.cancelled = True

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _submit(self, job: Job) -> Job:
        job.id = next(self._ids)
        self._queue.put(job)
        return job

    def _take(self, block: bool) -> tuple[list[Job], bool]:
        """The jobs waiting (at least one where ``block``), and whether the runner was
        told to stop."""
        jobs: list[Job | None] = []
        with contextlib.suppress(queue.Empty):
            jobs.append(self._queue.get(block=block))
            while True:
                jobs.append(self._queue.get_nowait())
        return [j for j in jobs if j is not None], None in jobs

    def _run(self) -> None:
        raise NotImplementedError


def _report(job: Job, call, *args) -> None:
    if not job.cancelled:
        call(*args)


class BatchingRunner(Runner):
    """Batches the jobs that wait while the engine works; ``lock``: held around each
    engine call, so that another user of the engine (a trainer's loop) can take turns."""

    def __init__(self, engine: Engine, lock: Any = None):
        self.lock = lock if lock is not None else threading.Lock()
        self._streams = "on_token" in inspect.signature(engine.generate).parameters
        super().__init__(engine)

    def _run(self) -> None:
        while True:
            jobs, stop = self._take(block=True)
            jobs = [j for j in jobs if not j.cancelled]
            generations: dict[SamplingParams, list[Job]] = defaultdict(list)
            scorings: dict[int, list[Job]] = defaultdict(list)
            for job in jobs:
                if job.params is None:
                    scorings[job.top_k].append(job)
                else:
                    generations[job.params].append(job)
            for top_k, group in scorings.items():
                self._batch(group, lambda rs, top_k=top_k, group=group: self.engine.score(
                    [r.prompt_token_ids for r in rs],
                    [c for job in group for c in job.completions], top_k=top_k))  # fmt: skip
            for params, group in generations.items():
                self._batch(group, lambda rs, params=params, group=group: self._generate(
                    rs, params, group))  # fmt: skip
            if stop:
                return

    def _generate(self, requests: list[Request], params: SamplingParams, group: list[Job]):
        if not self._streams or not any(job.stream for job in group):
            return self.engine.generate(requests, params)
        owners = [(job, i) for job in group for i in range(len(job.requests))]

        def on_token(index: int, token: int) -> None:
            job, i = owners[index]
            if job.stream:
                _report(job, job.sink.token, i, token)

        return self.engine.generate(requests, params, on_token=on_token)  # pyright: ignore[reportCallIssue]

    def _batch(self, group: list[Job], call) -> None:
        requests = [r for job in group for r in job.requests]
        try:
            with self.lock:
                results = call(requests)
        except Exception as exc:
            for job in group:
                _report(job, job.sink.failed, exc)
            return
        at = 0
        for job in group:
            _report(job, job.sink.done, results[at : at + len(job.requests)])
            at += len(job.requests)


class SteppingRunner(Runner):
    """Continuous batching on a :class:`VLLMEngine` (its :meth:`start`, :meth:`step` and
    :meth:`abort`): new jobs join between two steps."""

    engine: Any  # a VLLMEngine (whose module imports vLLM)

    def __init__(self, engine: Any):
        self._owners: dict[str, tuple[Job, int]] = {}
        self._results: dict[int, list] = {}
        self._sent: dict[str, int] = {}
        self._running: dict[int, Job] = {}
        super().__init__(engine)

    def _run(self) -> None:
        engine = self.engine
        stop = False
        while not stop or engine.running:
            jobs, stopping = self._take(block=not engine.running and not stop)
            stop = stop or stopping
            for job in jobs:
                self._start(job)
            for job in [j for j in self._running.values() if j.cancelled]:
                self._end(job)
            if not engine.running:
                continue
            try:
                reports = engine.step()
            except Exception as exc:  # the engine broke: every running job with it
                for job in list(self._running.values()):
                    _report(job, job.sink.failed, exc)
                    self._end(job)
                continue
            for request_id, what, finished in reports:
                self._progress(request_id, what, finished)

    def _start(self, job: Job) -> None:
        if job.cancelled:
            return
        self._results[job.id] = [None] * len(job.requests)
        self._running[job.id] = job
        try:
            for i, request in enumerate(job.requests):
                request_id = f"pt-{job.id}-{i}"
                self._owners[request_id] = (job, i)
                if job.params is None:
                    self.engine.start_scoring(
                        request_id, request.prompt_token_ids, job.completions[i], job.top_k
                    )
                else:
                    self._sent[request_id] = 0
                    self.engine.start(request_id, request, job.params)
        except Exception as exc:
            _report(job, job.sink.failed, exc)
            self._end(job)

    def _progress(self, request_id: str, what: Completion | TokenScores, finished: bool):
        owner = self._owners.get(request_id)
        if owner is None:
            return
        job, i = owner
        if job.stream and isinstance(what, Completion):
            new = what.token_ids[self._sent[request_id] :]
            self._sent[request_id] = len(what.token_ids)
            for token in new:
                _report(job, job.sink.token, i, token)
        if not finished:
            return
        results = self._results[job.id]
        results[i] = what
        del self._owners[request_id]
        self._sent.pop(request_id, None)
        if all(r is not None for r in results):
            _report(job, job.sink.done, results)
            self._end(job)

    def _end(self, job: Job) -> None:
        ids = [f"pt-{job.id}-{i}" for i in range(len(job.requests))]
        self.engine.abort([i for i in ids if i in self._owners])
        for request_id in ids:
            self._owners.pop(request_id, None)
            self._sent.pop(request_id, None)
        self._results.pop(job.id, None)
        self._running.pop(job.id, None)


def runner_for(engine: Engine, *, lock: Any = None) -> Runner:
    """Continuous batching where the server owns a vLLM engine, else batching under
    ``lock``."""
    if lock is None and hasattr(engine, "start") and hasattr(engine, "step"):
        return SteppingRunner(engine)
    return BatchingRunner(engine, lock)
