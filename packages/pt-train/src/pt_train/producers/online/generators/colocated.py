"""``rollout.generator: colocate``: a vLLM engine in the trainer's process, built once from
the starting weights and given the current ones before each generation straight from the
live parameters (:class:`~pt_train.producers.online.push.InMemoryPush`: no file; under
ZeRO-3, on its one rank, gathered a group of modules at a time as vLLM takes them, the
engine built from placeholder weights). It generates with the server path's requests,
sampling and per-sample seeds, and scores with the teacher in this process.

With ``rollout.sleep_level`` (on a GPU) it sleeps in vLLM's sleep mode between
generations, and wakes its weights' memory for the push before the KV cache's, so the
push's transient tensors and the KV cache are never on the device together
(``sleep_s``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from pt_core.log import get_logger
from pt_train.producers.online.generators import Generation, GeneratorContext
from pt_train.producers.online.generators.inprocess import InProcessGenerator
from pt_train.producers.online.push import make_push

log = get_logger(__name__)


class ColocatedGenerator(InProcessGenerator):
    """``engine``: an engine already built from the weights of ``engine_version`` (by
    default one is built at the first generation)."""

    def __init__(
        self, context: GeneratorContext, *, engine=None, engine_version: int | None = None
    ):
        super().__init__(context)
        self.sleep_level = context.rollout.sleep_level
        self.engine = None
        self.pushes = None
        if engine is not None:
            self._use(engine, engine_version)
        self.wanted = 0  # the version the next generation must have
        self.asleep = False
        self.sleep_seconds = 0.0

    def push(self, version: int) -> None:
        """The weights are pushed just before the next generation, after the engine woke
        its weights' memory."""
        self.wanted = version

    def _generate(self, requests: list) -> Generation:
        from pt_rollout.engines import SamplingParams

        if self.engine is None:
            self._start()
        self._wake_and_push()
        start = time.perf_counter()
        completions = self.engine.generate(requests, SamplingParams(**self.context.sampling))  # pyright: ignore[reportOptionalMemberAccess]
        generate_s = time.perf_counter() - start
        if self.sleep_level:
            self._sleep()
        return self._scored(
            requests, completions, Generation(completions, self.wanted, generate_s=generate_s)
        )

    def round_metrics(self) -> dict:
        out = {"weight_push_s": round(self.pushes.push_seconds if self.pushes else 0.0, 3)}
        if self.sleep_level:
            out["sleep_s"] = round(self.sleep_seconds, 3)
        if self.pushes is not None:
            self.pushes.push_seconds = 0.0
        self.sleep_seconds = 0.0
        return out

    def close(self) -> None:
        if self.engine is not None and hasattr(self.engine, "close"):
            self.engine.close()
        self.engine = None

    # ------------------------------------------------------------------ the engine

    def _use(self, engine, version: int | None) -> None:
        self.engine = engine
        self.pushes = make_push("memory", engine, self.context.weights)
        self.pushes.version = version

    def _start(self) -> None:
        """A vLLM engine in this process, built from a directory in memory with the model's
        config and tokenizer (removed once it is built) and the current weights; under
        ZeRO-3, whose parameters are never whole at once, from vLLM's placeholder weights
        instead, which the push before the first generation replaces."""
        from pt_rollout.engines.vllm import VLLMEngine
        from pt_train.checkpoint import save_model_config

        context = self.context
        r = context.rollout
        weights = context.weights
        sharded = weights.policy.zero_stage == 3
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        start = Path(tempfile.mkdtemp(prefix="pt-colocate-", dir=base))
        try:
            context.tokenizer.save_pretrained(str(start))
            if sharded:
                save_model_config(weights.policy.module(), start)
            else:
                weights.save(start)
            engine = VLLMEngine(
                str(start),
                seed=r.seed,
                gpu_memory_utilization=r.gpu_memory_utilization,
                max_model_len=r.max_model_len,
                max_logprobs=context.max_logprobs,
                logprobs_mode=context.needs.logprobs_mode,
                in_process=True,
                load_format="dummy" if sharded else "auto",
                sleep_level=r.sleep_level,
            )
        finally:
            shutil.rmtree(start, ignore_errors=True)
        self._use(engine, None if sharded else self.wanted)
        log.info(
            "colocated vLLM engine in this process: weights pushed in memory from the live "
            "parameters before each round (no file)%s",
            ", gathered a layer at a time under ZeRO-3" if sharded else "",
        )

    def _wake_and_push(self) -> None:
        """Before a generation: an engine asleep takes back its weights' memory, the wanted
        weights are pushed (always after level 2, whose sleep freed them), then the KV
        cache's memory is taken back."""
        engine, pushes = self.engine, self.pushes
        assert engine is not None and pushes is not None  # started
        asleep = self.asleep
        if asleep:
            start = time.perf_counter()
            engine.wake_up(["weights"])
            self.sleep_seconds += time.perf_counter() - start
        pushes.send(self.wanted)
        if asleep:
            start = time.perf_counter()
            if not engine.wake_up(["kv_cache"]):
                raise RuntimeError("the colocated vLLM engine is not awake after waking up")
            self.asleep = False
            self.sleep_seconds += time.perf_counter() - start

    def _sleep(self) -> None:
        """After a generation: the engine frees its device memory for the trainer's steps;
        after level 2 it no longer has any weights."""
        assert self.engine is not None and self.pushes is not None  # started
        start = time.perf_counter()
        self.engine.sleep()
        self.asleep = True
        if self.sleep_level == 2:
            self.pushes.version = None
        self.sleep_seconds += time.perf_counter() - start
