"""Several generator processes behind one :class:`RemoteGenerator`-like interface.

A generation's requests are split into contiguous, balanced shards, one per live process,
and :meth:`GeneratorPool.wait` puts the shards' completions (and scores) back in request
order; with per-sample seeds they are what one process gives. Weights go to every live
process, so each has been sent the newest.
"""

from __future__ import annotations

import contextlib
import threading

from pt_core.errors import PtError, RunFailure
from pt_core.log import get_logger
from pt_rollout.serve.client import RemoteGenerator
from pt_rollout.serve.spec import GeneratorSpec

log = get_logger(__name__)


class GeneratorPool:
    """``servers`` generator processes behind :class:`RemoteGenerator`'s interface.

    A generation's requests are split into contiguous, balanced shards, one per live
    process, and :meth:`wait` puts the shards' completions (and scores) back in request
    order; with per-sample seeds they are what one process gives. ``load_weights`` goes
    to every live process, so each has been sent the newest weights.

    A process that ends (killed, out of memory) is dropped with a warning and the shards
    it owed are asked for again from a live one, which was sent every push and so has
    the weights they were asked for with. Where a push was queued after a shard was
    asked for (the overlapping schedules), that generation is asked for again whole, with
    the newest weights, and answers with their version. :attr:`deaths` counts the
    processes lost; when none is left, the call that finds it raises :class:`RunFailure`
    (the run cannot go on; resuming it is the fix).

    Process ``i`` gets engine seed ``spec.seed + i`` (which only sampling with
    ``seeding: engine`` uses), so one process is started exactly as
    :meth:`RemoteGenerator.start` starts it, and with ``devices``, GPU ``devices[i]`` (see
    :func:`~pt_rollout.serve.client.visible_device`) rather than all this process sees.

    With ``addresses`` (``host:port`` each) no process is started: the pool connects to
    the processes listening there (``pt-rollout serve --listen``, on other nodes), one per
    address, with the key in ``key_file``; they were started with their own model and
    settings (check them with :meth:`info`), so the caller pushes its weights before it
    asks for a generation.
    """

    def __init__(self, spec: GeneratorSpec | None = None, *, servers: int = 1,
                 version: int = 0, python: str | None = None, devices: list[int] | None = None,
                 addresses: list[str] | None = None, key_file: str | None = None,
                 weight_transfer: str | None = None):  # fmt: skip
        """``servers`` processes started with ``spec`` (in ``python``, at weight version
        ``version``), or, with ``addresses``, connections to the processes listening
        there (with the key in ``key_file``; ``weight_transfer``: how they take weights)."""
        if addresses is not None:
            servers = len(addresses)
        elif spec is None:
            raise PtError("a generator pool starts its processes from a spec")
        if servers < 1:
            raise PtError(f"a generator pool needs at least one process, not {servers}")
        if devices is not None and len(devices) != servers:
            raise PtError(f"{len(devices)} devices for {servers} generator processes")
        started: list[RemoteGenerator | None] = [None] * servers
        errors: list[BaseException] = []

        def start(index: int) -> None:
            try:
                if addresses is not None:
                    started[index] = RemoteGenerator.connect(
                        addresses[index], key_file, weight_transfer
                    )
                    return
                assert spec is not None  # checked above
                started[index] = RemoteGenerator.start(
                    spec.replace(seed=spec.seed + index), python=python, version=version,
                    device=None if devices is None else devices[index],
                )  # fmt: skip
            except BaseException as exc:  # raised below, in the caller's thread
                errors.append(exc)

        threads = [threading.Thread(target=start, args=(i,)) for i in range(servers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            for generator in started:
                if generator is not None:
                    generator.close()
            raise errors[0]
        self._generators: dict[int, RemoteGenerator] = {
            i: g for i, g in enumerate(started) if g is not None
        }  # every one started (no errors)
        self.servers = servers
        self.deaths = 0
        self._version = version  # of the newest weights sent to every live process
        self._jobs: dict[int, dict] = {}
        self._next_key = 0
        self._discard: list[tuple[int, int]] = []  # answers no longer wanted: (process, key)

    # ------------------------------------------------------------------ the interface

    def submit_generate(self, requests, params: dict, score: dict | None = None) -> int:
        """Queue a generation on every live process, a shard each; returns the key."""
        self._check()
        key = self._new_key()
        job = {"op": "generate", "requests": list(requests), "params": params,
               "score": score, "version": self._version, "shards": []}  # fmt: skip
        self._jobs[key] = job
        self._split(job)
        return key

    def submit_score(self, items: list, score: dict) -> int:
        """Queue the teacher's scores of given completions (``items``: ``(prompt ids,
        completion ids, ids to score at or None)`` each) on every live process, a shard each;
        returns the key."""
        self._check()
        key = self._new_key()
        job = {"op": "score", "requests": list(items), "score": score,
               "version": self._version, "shards": []}  # fmt: skip
        self._jobs[key] = job
        self._split(job)
        return key

    def submit_load_weights(self, path: str, version: int) -> int:
        """Queue the checkpoint ``path`` on every live process."""
        return self._to_every_process(
            lambda generator: generator.submit_load_weights(path, version), version
        )

    def submit_push(self, weights: list, version: int) -> int:
        """Push ``weights`` to every live process through vLLM's weight-transfer API
        (:meth:`RemoteGenerator.submit_push`: each in a thread of its own, so at once)."""
        return self._to_every_process(
            lambda generator: generator.submit_push(weights, version), version
        )

    @property
    def processes(self) -> dict[int, RemoteGenerator]:
        """The live processes, by their index."""
        return dict(self._generators)

    def shards(self, key: int) -> list[tuple[int, int, int]]:
        """How the generation ``key`` is split: ``(process, start, stop)`` of each shard,
        requests ``start`` to ``stop - 1``."""
        return [(s["process"], s["start"], s["stop"]) for s in self._jobs[key].get("shards", [])]

    def info(self) -> dict[int, dict]:
        """Each live process's :meth:`RemoteGenerator.info`, by its index."""
        return {index: generator.info() for index, generator in self._generators.items()}

    def _to_every_process(self, submit, version: int) -> int:
        self._check()
        key = self._new_key()
        job = {"op": "load_weights", "version": version, "keys": {}}
        self._jobs[key] = job
        ended = []
        for index in list(self._generators):
            try:
                job["keys"][index] = submit(self._generators[index])
            except OSError:  # its socket is closed: it ended
                ended.append(index)
        # Every live process has the push queued before a shard is re-sent to one.
        self._version = version
        for index in ended:
            self._drop(index)
        return key

    def done(self, key: int) -> bool:
        self._check()
        job = self._jobs[key]
        if job["op"] == "load_weights":
            return all(self._generators[i].done(k) for i, k in job["keys"].items())
        return all(
            shard["reply"] is not None or self._generators[shard["process"]].done(shard["key"])
            for shard in job["shards"]
        )

    def wait(self, key: int) -> dict:
        self._collect_discarded()
        job = self._jobs[key]
        if job["op"] == "load_weights":
            seconds = 0.0
            while job["keys"]:
                index, process_key = next(iter(job["keys"].items()))
                reply = self._wait_one(index, process_key)
                if reply is not None:
                    del job["keys"][index]
                    seconds = max(seconds, reply.get("seconds", 0.0))
            del self._jobs[key]
            return {"version": job["version"], "seconds": seconds}
        while True:
            pending = [shard for shard in job["shards"] if shard["reply"] is None]
            if not pending:
                break
            shard = pending[0]
            shard["reply"] = self._wait_one(shard["process"], shard["key"])
        del self._jobs[key]
        return self._joined(job)

    def close(self) -> None:
        threads = [threading.Thread(target=g.close) for g in self._generators.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self._generators = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ shards and deaths

    def _new_key(self) -> int:
        key = self._next_key
        self._next_key += 1
        return key

    def _split(self, job: dict) -> None:
        """Shard ``job``'s requests over the live processes, contiguous and balanced (the
        first ``n % live`` shards one request longer), and send them."""
        live = sorted(self._generators)
        if not live:
            raise RunFailure("every generator process has ended; their errors are above")
        n = len(job["requests"])
        sizes = [n // len(live) + (j < n % len(live)) for j in range(len(live))]
        start = 0
        for index, size in zip(live, sizes, strict=True):
            if size or (n == 0 and start == 0 and index == live[0]):
                job["shards"].append({"process": index, "start": start, "stop": start + size,
                                      "key": None, "reply": None})  # fmt: skip
            start += size
        for shard in list(job["shards"]):
            self._send(job, shard)

    def _send(self, job: dict, shard: dict) -> None:
        index = shard["process"]
        part = job["requests"][shard["start"] : shard["stop"]]
        try:
            if job["op"] == "score":
                shard["key"] = self._generators[index].submit_score(part, job["score"])
            else:
                shard["key"] = self._generators[index].submit_generate(
                    part, job["params"], job["score"]
                )
        except OSError:  # its socket is closed: it ended, and _drop re-sends this shard
            self._drop(index)

    def _wait_one(self, index: int, key: int) -> dict | None:
        """Process ``index``'s answer to ``key``, or None if the process ended (it is then
        dropped and what it owed asked for elsewhere)."""
        generator = self._generators[index]
        try:
            return generator.wait(key)
        except PtError:
            if generator.alive():  # an error the engine answered with, not a death
                raise
        self._drop(index)
        return None

    def _check(self) -> None:
        for index in [i for i, g in self._generators.items() if not g.alive()]:
            self._drop(index)

    def _drop(self, index: int) -> None:
        """Process ``index`` ended: keep what it answered, ask a live process for the rest.
        One that refused this trainer because it serves another did not end: that is said,
        and the run stops (the two runs would share its time)."""
        refused = self._generators[index].refusal()
        if refused is not None:
            raise refused
        generator = self._generators.pop(index)
        owed = []
        for job in self._jobs.values():
            if job["op"] == "load_weights":
                job["keys"].pop(index, None)
                continue
            for shard in job["shards"]:
                if shard["process"] != index or shard["reply"] is not None:
                    continue
                if shard["key"] is not None and generator.done(shard["key"]):
                    with contextlib.suppress(PtError):  # an error answer is asked for again
                        shard["reply"] = generator.wait(shard["key"])
                        continue
                owed.append((job, shard))
        self._discard = [(i, k) for i, k in self._discard if i != index]
        self.deaths += 1
        prompts = sum(shard["stop"] - shard["start"] for _, shard in owed)
        code = generator.exit_code()
        generator.close()
        if generator.address is None:
            ended = f"generator process {index} of {self.servers} ended (exit {code})"
            last = f"the last, {index}, with exit {code}"
            where, again = "above", ""
        else:
            ended = (
                f"generator {index} of {self.servers} at {generator.address} closed its connection"
            )
            last = f"the last, {index}, at {generator.address}"
            where = "in their own logs"
            again = "start pt-rollout serve again at rollout.servers' addresses; "
        if not self._generators:
            log.warning("%s; none is left", ended)
            raise RunFailure(
                f"every generator process has ended ({last}); their errors are {where}",
                hint=f"{again}the same pt-train command resumes the run from its last checkpoint",
            )
        running = len(self._generators)
        if prompts:
            log.warning(
                "%s: re-sending its %d prompt%s to the %d still running",
                ended, prompts, "s" if prompts > 1 else "", running,
            )  # fmt: skip
        else:
            log.warning("%s; it owed no prompts: %d still running", ended, running)
        for job, shard in owed:
            if not any(s is shard for s in job["shards"]):  # asked for again whole already
                continue
            if job["version"] == self._version:
                shard["process"] = self._least_loaded()
                shard["key"] = None
                self._send(job, shard)
                continue
            # Pushed after this shard was asked for: the live processes no longer have
            # its weights, so the generation is asked for again whole, with the newest.
            log.warning(
                "the generation was asked for with weight version %d and the processes "
                "now have %d: asking for all of it again with those",
                job["version"], self._version,
            )  # fmt: skip
            for other in job["shards"]:
                if other["reply"] is None and other["key"] is not None and other is not shard:
                    self._discard.append((other["process"], other["key"]))
            job["shards"] = []
            job["version"] = self._version
            self._split(job)

    def _least_loaded(self) -> int:
        """The live process owing the fewest prompts (the lowest index among equals)."""
        owed = dict.fromkeys(self._generators, 0)
        for job in self._jobs.values():
            for shard in job.get("shards", []):
                if shard["reply"] is None and shard["process"] in owed:
                    owed[shard["process"]] += shard["stop"] - shard["start"]
        return min(sorted(owed), key=owed.__getitem__)

    def _collect_discarded(self) -> None:
        """Take in (and drop) the answers to shards that were asked for again elsewhere."""
        keep = []
        for index, key in self._discard:
            generator = self._generators.get(index)
            if generator is None:
                continue
            if generator.done(key):
                with contextlib.suppress(PtError):
                    generator.wait(key)
            else:
                keep.append((index, key))
        self._discard = keep

    @staticmethod
    def _joined(job: dict) -> dict:
        """The shards' answers as one, in request order."""
        replies = [s["reply"] for s in sorted(job["shards"], key=lambda s: s["start"])]
        versions = {reply["version"] for reply in replies}
        if len(versions) != 1:
            raise PtError(
                f"the shards of one generation came from weight versions {sorted(versions)}; "
                "they must agree (a bug in the generator pool)"
            )
        if job["op"] == "score":
            return {
                "version": versions.pop(),
                "scores": [s for r in replies for s in r["scores"]],
                "score_s": max(r.get("score_s", 0.0) for r in replies),
            }
        reply = {
            "version": versions.pop(),
            "completions": [c for r in replies for c in r["completions"]],
            "generate_s": max(r.get("generate_s", 0.0) for r in replies),
        }
        if any("scores" in r for r in replies):
            reply["scores"] = [s for r in replies for s in r["scores"]]
            reply["score_s"] = max(r.get("score_s", 0.0) for r in replies)
        return reply
