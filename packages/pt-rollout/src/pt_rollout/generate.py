"""`pt-rollout generate`: n completions per prompt, one row per (id, sample).

    generate("ckpt/inference/step-100", "prompts.jsonl", "rollouts.jsonl", n=8)

Output rows follow the rollouts schema (id, sample, prompt, completion, prompt_token_ids,
completion_token_ids, finish_reason, optional completion_logprobs) and carry the prompt
row's other columns. Each (id, sample) has its own sampler seed derived from ``seed``, so
the output does not depend on batching, engine restarts or resuming.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pt_core.errors import ConfigError, InputError
from pt_core.log import get_logger
from pt_rollout.columns import rollout_row
from pt_rollout.engines import SamplingParams, sample_seed
from pt_rollout.openai_api.client import EndpointOptions
from pt_rollout.output import ResumableOutput, row_key
from pt_rollout.prompts import PromptRow, prompt_token_ids, prompts_path, read_prompts
from pt_rollout.throughput import Throughput

log = get_logger(__name__)


@dataclass
class GenerateOptions:
    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 1024
    stop: list[str] = field(default_factory=list)
    seed: int = 0
    logprobs: bool = False
    logprobs_mode: str = "raw"
    logprobs_top_k: int = 0
    seeding: str = "per_sample"
    decoder: str = "auto"  # the HF engine's: auto (lean on a CPU) | lean | hf
    engine: str = "auto"
    template: bool = True
    chat_template: str | None = None  # a name, .jinja file or Jinja source; None: the model's
    system: str | None = None
    split: str | None = None
    prompt_key: str | None = None
    id_key: str = "id"
    limit: int | None = None
    batch_size: int = 256
    dtype: str = "auto"
    tensor_parallel: int = 1
    data_parallel: int = 1
    gpu_memory_utilization: float | None = None
    max_model_len: int | None = None
    # an OpenAI-compatible server to generate with (``model``: the name it serves), and the
    # local tokenizer prompts are made with (default: ``model``'s)
    endpoint: EndpointOptions | None = None
    tokenizer: str | None = None
    # episodes of an environment (pt_rollout.episodes): module:Class, file.py:Class or a
    # YAML file with the environment section; and its limits, over the section's
    env: str | None = None
    max_turns: int | None = None
    max_episode_tokens: int | None = None

    def __post_init__(self):
        if self.n < 1:
            raise ConfigError(f"--n must be >= 1, got {self.n}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {self.limit}")
        if self.chat_template is not None and not self.template:
            raise ConfigError(
                "--chat-template and --no-template contradict each other",
                hint="drop one: --no-template sends prompts as raw text, without any template",
            )
        if self.chat_template is not None and Path(self.chat_template).is_file():
            self.chat_template = str(Path(self.chat_template).resolve())  # workers may cd
        if self.decoder not in ("auto", "lean", "hf"):
            raise ConfigError(f"--decoder {self.decoder!r}", hint="use auto, lean or hf")
        if self.decoder != "auto" and self.engine == "vllm":
            raise ConfigError(
                f"--decoder {self.decoder} has no effect with --engine vllm: it is the HF "
                "engine's decoder",
                hint="drop --decoder, or use --engine hf",
            )
        if self.data_parallel < 1 or self.tensor_parallel < 1:
            raise ConfigError("--data-parallel and --tensor-parallel must be >= 1")
        if self.endpoint is not None:
            refuse_engine_options(
                engine=self.engine != "auto",
                decoder=self.decoder != "auto",
                dtype=self.dtype != "auto",
                tensor_parallel=self.tensor_parallel != 1,
                data_parallel=self.data_parallel != 1,
                gpu_memory_utilization=self.gpu_memory_utilization is not None,
                max_model_len=self.max_model_len is not None,
            )
            if self.seeding != "per_sample":
                raise ConfigError(
                    "--seeding engine with --endpoint: a server's own generator was seeded "
                    "when it started, not by this command",
                    hint="drop --seeding (per_sample: each sample sends its own seed)",
                )
            if self.logprobs_mode != "raw":
                raise ConfigError(
                    f"--logprobs-mode {self.logprobs_mode} with --endpoint: a server returns "
                    "the log-probs of the distribution it was started with",
                    hint="drop --logprobs-mode, and start the server with the mode you want "
                    "(vllm serve --logprobs-mode processed_logprobs, pt-rollout serve-openai "
                    "--logprobs-mode processed)",
                )
        self._check_environment()
        try:
            self.sampling(())
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _check_environment(self) -> None:
        if self.env is None:
            for name in ("max_turns", "max_episode_tokens"):
                if getattr(self, name) is not None:
                    flag = "--" + name.replace("_", "-")
                    raise ConfigError(
                        f"{flag} bounds an episode: it needs --env",
                        hint=f"add --env or drop {flag}",
                    )
            return
        if not self.template:
            raise ConfigError(
                "--env with --no-template: an episode's turns are appended with the chat "
                "template's text between them",
                hint="drop --no-template",
            )
        if self.env.endswith((".yaml", ".yml")) and Path(self.env).is_file():
            self.env = str(Path(self.env).resolve())  # workers may cd

    def sampling(self, stop_token_ids: tuple[int, ...]) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=tuple(self.stop),
            stop_token_ids=stop_token_ids,
            logprobs=self.logprobs,
            logprobs_mode=self.logprobs_mode,
            logprobs_top_k=self.logprobs_top_k,
            seeding=self.seeding,
        )


def refuse_engine_options(**given: bool) -> None:
    """With ``--endpoint`` the server has loaded the model: an option of the local engine
    would do nothing, so one that is given is refused."""
    named = [f"--{name.replace('_', '-')}" for name, is_given in given.items() if is_given]
    if named:
        raise ConfigError(
            f"{', '.join(named)} with --endpoint: the server has loaded the model, and these "
            "are options of a local engine",
            hint=f"drop {', '.join(named)} (the server's own options set them)",
        )


def generate(
    model: str | os.PathLike,
    prompts: str | os.PathLike,
    out: str | os.PathLike,
    options: GenerateOptions | None = None,
    **overrides,
) -> dict:
    """Generate ``options.n`` completions for every prompt into ``out``; resume from what
    ``out`` (or its ``.partial``) already holds. Returns the manifest fields."""
    if options is None:
        options = GenerateOptions(**overrides)
    elif overrides:
        options = dataclasses.replace(options, **overrides)
    model = str(model)
    started = time.perf_counter()
    source = prompts_path(prompts, options.split)
    rows = read_prompts(source, prompt_key=options.prompt_key, id_key=options.id_key)
    if options.limit is not None:
        rows = rows[: options.limit]
    output = ResumableOutput(out)
    pending = [
        (row, sample)
        for row in rows
        for sample in range(options.n)
        if row_key(row.id, sample) not in output.done
    ]
    log.info(
        "%d prompts x %d samples from %s: %d to generate, %d already in %s",
        len(rows),
        options.n,
        source,
        len(pending),
        output.resumed,
        output.path,
    )
    meter = Throughput("generate", total=len(rows) * options.n, done=output.resumed, n=options.n)
    engine_name = options.engine
    with output.kept_on_error():
        if pending and options.data_parallel > 1:
            from pt_rollout.parallel import generate_data_parallel

            with meter:
                generate_data_parallel(model, pending, output, options, meter)
            engine_name = f"{options.engine} x{options.data_parallel}"
        elif pending:
            engine_name = _generate_pending(model, pending, output, options, meter, source)
    total = output.finalize(order=_input_order(rows))
    return {
        "rows": total,
        "prompts": len(rows),
        "n": options.n,
        "generated": meter.rows,
        "completion_tokens": meter.tokens,
        "resumed": output.resumed,
        "engine": engine_name,
        **({"endpoint": options.endpoint.base_url} if options.endpoint else {}),
        "model": model,
        "prompts_path": str(source),
        "seconds": round(time.perf_counter() - started, 3),
        "tokens_per_s": round(meter.tokens_per_s, 1),
        "columns": _columns(output.path),
    }


def _generate_pending(model, pending, output, options, meter, source) -> str:
    """Generate the pending (row, sample) pairs with one engine, a batch at a time, each
    batch appended to ``output`` as it completes. Returns the engine's name."""
    from transformers import AutoTokenizer

    from pt_rollout.prompts import stop_token_ids, use_chat_template

    tokenizer_path = options.tokenizer or model
    tokenizer = use_chat_template(
        AutoTokenizer.from_pretrained(tokenizer_path), options.chat_template
    )
    sampling = options.sampling(
        stop_token_ids(tokenizer_path, tokenizer, template=options.template)
    )
    episodes = None
    token_ids = {}
    if options.env is not None:
        from pt_rollout.episodes.generate import EpisodeBatches

        episodes = EpisodeBatches(tokenizer, options)  # its errors before the engine loads
        first = episodes.template.opening([{"role": "user", "content": "Hello."}])
    else:
        for row, _ in pending:
            if row.position not in token_ids:
                token_ids[row.position] = prompt_token_ids(
                    tokenizer, row.prompt, template=options.template, system=options.system
                )
        first = token_ids[pending[0][0].position]
    try:
        with _open_engine(model, tokenizer, options) as engine, meter:
            engine_name = engine.name
            if options.endpoint is not None:
                engine.check_tokenizer(first)  # pyright: ignore[reportAttributeAccessIssue]
            if episodes is None:
                _check_prompt_lengths(pending, token_ids, engine.max_model_len, source)
            for start in range(0, len(pending), options.batch_size):
                batch = pending[start : start + options.batch_size]
                if episodes is not None:
                    new_rows = episodes.rows(engine, batch, sampling)
                else:
                    new_rows = _generate_batch(
                        engine, tokenizer, batch, token_ids, sampling, options
                    )
                output.write(new_rows)
                meter.advance(len(new_rows), sum(len(r["completion_token_ids"]) for r in new_rows))
    finally:
        if episodes is not None:
            episodes.close()
    return engine_name


def _open_engine(model: str, tokenizer, options: GenerateOptions):
    """The engine that generates: the server at ``options.endpoint``, or one loaded here."""
    if options.endpoint is not None:
        from pt_rollout.openai_api.client import EndpointEngine

        return EndpointEngine(options.endpoint, model, tokenizer)
    return load_local_engine(model, options, max_logprobs=max(20, options.logprobs_top_k))


def load_local_engine(model: str, options, *, max_logprobs: int):
    """The engine ``options`` (generate's or serve-openai's: ``engine``, ``dtype``, ``seed``,
    ``tensor_parallel``, ``gpu_memory_utilization``, ``max_model_len``, ``logprobs_mode``,
    ``decoder``) describe, loaded with ``model``."""
    from pt_rollout.engines import load_engine

    return load_engine(
        options.engine,
        model,
        dtype=options.dtype,
        seed=options.seed,
        tensor_parallel_size=options.tensor_parallel,
        gpu_memory_utilization=options.gpu_memory_utilization,
        max_model_len=options.max_model_len,
        max_logprobs=max_logprobs,
        logprobs_mode=options.logprobs_mode,
        hf_decoder=options.decoder,
    )


def _generate_batch(engine, tokenizer, batch, token_ids, sampling, options) -> list[dict]:
    from pt_rollout.engines import Request

    if sampling.greedy:
        # Greedy samples of one prompt are identical: decode each prompt once.
        unique = list(dict.fromkeys(row.position for row, _ in batch))
        requests = [Request(token_ids[p]) for p in unique]
        by_position = dict(zip(unique, engine.generate(requests, sampling), strict=True))
        completions = [by_position[row.position] for row, _ in batch]
    else:
        requests = [
            Request(token_ids[row.position], sample_seed(options.seed, row.id, sample))
            for row, sample in batch
        ]
        completions = engine.generate(requests, sampling)
    return [
        rollout_row(row, sample, token_ids[row.position], completion, tokenizer, options.stop)
        for (row, sample), completion in zip(batch, completions, strict=True)
    ]


def _check_prompt_lengths(pending, token_ids, max_model_len: int, source) -> None:
    for row, _ in pending:
        length = len(token_ids[row.position])
        if length >= max_model_len:
            raise InputError(
                f"{source}: prompt {row.id!r} is {length} tokens; the model takes "
                f"{max_model_len} in all, which leaves no room to generate",
                hint="shorten or drop that prompt (or raise --max-model-len if the model allows)",
            )


def _input_order(rows: list[PromptRow]):
    position = {row_key(row.id, 0)[0]: row.position for row in rows}
    unknown = len(rows)

    def order(record: dict) -> tuple:
        key = row_key(record["id"], record["sample"])
        return position.get(key[0], unknown), key[0], key[1]

    return order


def _columns(path: Path) -> list[str]:
    from pt_core.files import iter_rows

    for row in iter_rows(path):
        return list(row)
    return []
