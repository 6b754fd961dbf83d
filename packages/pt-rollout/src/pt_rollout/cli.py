"""`pt-rollout`: Generate rollouts and score them with a teacher (vLLM or HF).

    pt-rollout generate --model ckpt/ --prompts prompts.jsonl --n 8 --out rollouts.jsonl
    pt-rollout score --teacher big/ --rollouts - --top-k 8 --out scores.jsonl
    pt-train run train.yaml | pt-rollout generate --model - --prompts prompts.jsonl
    pt-rollout chat runs/sft/inference/step-600
    pt-rollout serve --listen 0.0.0.0:7000 --model ckpt/ --engine vllm
    pt-rollout serve-openai --model ckpt/ --listen 127.0.0.1:8000
    pt-rollout generate --endpoint http://127.0.0.1:8000/v1 --model ckpt/ --prompts p.jsonl

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pathlib import Path

import typer

from pt_core.cli import flag, make_app, make_main
from pt_core.manifest import emit_manifest
from pt_rollout import __version__
from pt_rollout.model_path import one_stdin_input, resolve_model
from pt_rollout.output import interrupted
from pt_rollout.serve.spec import GeneratorSpec, with_spec_options

app = make_app(
    "pt-rollout", "Generate rollouts and score them with a teacher (vLLM or HF).", __version__
)

ENGINE_HELP = "vllm, hf, or auto (vLLM when installed and a device fits, else HF)."

# An OpenAI-compatible server in place of a local engine (generate and score).
MODEL_OPTION = typer.Option(
    ...,
    "--model",
    "-m",
    help="Model directory (a run's inference/step-N), hub name, or - for the checkpoint "
    "manifest piped in.",
)
DTYPE_OPTION = typer.Option("auto", "--dtype", help="auto (the checkpoint's), float32, bfloat16.")
DECODER_OPTION = typer.Option(
    "auto",
    "--decoder",
    help="The HF engine's decoder: lean (Llama-family models as flat tensor operations), "
    "hf (the model's forward), auto (lean on a CPU).",
)
TENSOR_PARALLEL_OPTION = typer.Option(1, "--tensor-parallel", help="GPUs per engine (vLLM).")
GPU_MEMORY_OPTION = typer.Option(
    None, "--gpu-memory-utilization", help="vLLM's memory share (default 0.9 GPU, 0.2 CPU)."
)
MAX_MODEL_LEN_OPTION = typer.Option(None, "--max-model-len", help="vLLM context length cap.")
TOKENIZER_OPTION = typer.Option(
    None,
    "--tokenizer",
    help="With --endpoint: the local tokenizer (a model directory or hub name) the token ids "
    "are made and read with, checked against the server's (default: the model name's).",
)
API_KEY_ENV_OPTION = typer.Option(
    "OPENAI_API_KEY",
    "--api-key-env",
    help="With --endpoint: the environment variable holding the server's API key (none sent "
    "where it is unset).",
)
CONCURRENCY_OPTION = typer.Option(
    16, "--concurrency", help="With --endpoint: requests in flight at once."
)
TIMEOUT_OPTION = typer.Option(
    600.0, "--timeout", help="With --endpoint: seconds a request may take."
)
RETRIES_OPTION = typer.Option(
    3,
    "--retries",
    help="With --endpoint: tries more for a request that fails in a way that may pass "
    "(no connection, a cut answer, a timeout, 429, 5xx), with exponential backoff.",
)


def _endpoint(url, tokenizer, api_key_env, concurrency, timeout, retries):
    """The server to use, or None; client settings given without --endpoint are refused."""
    from pt_core.errors import ConfigError
    from pt_rollout.openai_api.client import DEFAULT_KEY_ENV, EndpointOptions

    if url is None:
        given = [name for name, value, default in (
            ("--tokenizer", tokenizer, None), ("--api-key-env", api_key_env, DEFAULT_KEY_ENV),
            ("--concurrency", concurrency, 16), ("--timeout", timeout, 600.0),
            ("--retries", retries, 3)) if value != default]  # fmt: skip
        if given:
            raise ConfigError(
                f"{', '.join(given)}: settings of the client of a server, and no --endpoint "
                "is given",
                hint="add --endpoint URL, or drop them",
            )
        return None
    return EndpointOptions(
        url, api_key_env=api_key_env, concurrency=concurrency, timeout=timeout, retries=retries
    )


def _served_model(name: str, tokenizer: str | None, option: str) -> tuple[str, str]:
    """With --endpoint, ``name`` is the served model's name; the local tokenizer is
    ``tokenizer`` or, where it names none, the model of that name here."""
    from pt_core.errors import InputError

    if tokenizer is not None:
        return name, resolve_model(tokenizer, option="--tokenizer")
    try:
        return name, resolve_model(name, option=option)
    except InputError as exc:
        raise InputError(
            f"{exc.message} (with --endpoint, {option} is the name the server serves the model "
            "under, and the local tokenizer is read from it)",
            hint="pass the model's tokenizer with --tokenizer DIR",
        ) from None


@app.command("generate")
def generate_cmd(
    model: str = MODEL_OPTION,
    prompts: str = typer.Option(
        ...,
        "--prompts",
        "-p",
        help="Prompt rows: .jsonl/.parquet, a pt-data dataset dir, or - (not with --model -).",
    ),
    out: Path = typer.Option(
        Path("rollouts.jsonl"),
        "--out",
        "-o",
        help="Output .jsonl or .parquet (resumed if present).",
    ),
    n: int = typer.Option(8, "--n", help="Samples per prompt."),
    temperature: float = typer.Option(1.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(
        1.0, "--top-p", help="Sample from the most likely tokens holding this mass (1: all)."
    ),
    top_k: int = typer.Option(0, "--top-k", help="Sample from the k most likely tokens (0: all)."),
    max_tokens: int = typer.Option(1024, "--max-tokens", help="New tokens per completion."),
    stop: list[str] = typer.Option(None, "--stop", help="Stop string (repeatable)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed; each (id, sample) derives its own."),
    logprobs: bool = flag(
        "--logprobs", help="Add completion_logprobs: each sampled token's log-prob."
    ),
    logprobs_mode: str = typer.Option(
        "raw",
        "--logprobs-mode",
        help="raw: under the model's distribution; processed: under the one sampled from "
        "(after temperature and top-p), as an importance ratio needs.",
    ),
    logprobs_top_k: int = typer.Option(
        0,
        "--logprobs-top-k",
        help="Add student_topk_ids/student_topk_logprobs: the model's k most likely tokens at "
        "every step (for distillation over the student's top-k).",
    ),
    seeding: str = typer.Option(
        "per_sample",
        "--seeding",
        help="per_sample: each (id, sample) has its own seed, whatever the batch (exact "
        "resume); engine: one seed for the engine, faster sampling on GPUs, output depends "
        "on batching.",
    ),
    engine: str = typer.Option("auto", "--engine", help=ENGINE_HELP),
    decoder: str = DECODER_OPTION,
    no_template: bool = flag(
        "--no-template", help="Send string prompts as raw text, without the chat template."
    ),
    chat_template: str = typer.Option(
        None,
        "--chat-template",
        help="NAME|FILE: prompt with this template (chatml, plain, or a .jinja file) "
        "instead of the model's own; its end-of-turn token stops generation.",
    ),
    system: str = typer.Option(None, "--system", help="System prompt for every row."),
    split: str = typer.Option(
        None, "--split", help="Split of a dataset dir (default: test if present, else train)."
    ),
    prompt_key: str = typer.Option(
        None, "--prompt-key", help="Prompt column (default: prompt, problem, question, messages)."
    ),
    id_key: str = typer.Option("id", "--id-key", help="Id column (default: row position)."),
    limit: int = typer.Option(None, "--limit", help="Only the first N prompt rows."),
    batch_size: int = typer.Option(
        256, "--batch-size", help="Completions per engine call; a crash loses at most one batch."
    ),
    dtype: str = DTYPE_OPTION,
    tensor_parallel: int = TENSOR_PARALLEL_OPTION,
    data_parallel: int = typer.Option(
        1, "--data-parallel", help="Engines, one per GPU group, each on a shard of the prompts."
    ),
    gpu_memory_utilization: float = GPU_MEMORY_OPTION,
    max_model_len: int = MAX_MODEL_LEN_OPTION,
    endpoint: str = typer.Option(
        None,
        "--endpoint",
        help="URL of an OpenAI-compatible server (http://host:8000/v1) to generate with "
        "instead of a local engine; --model is the name it serves the model under.",
    ),
    tokenizer: str = TOKENIZER_OPTION,
    api_key_env: str = API_KEY_ENV_OPTION,
    concurrency: int = CONCURRENCY_OPTION,
    timeout: float = TIMEOUT_OPTION,
    retries: int = RETRIES_OPTION,
    env: str = typer.Option(
        None,
        "--env",
        help="Play each sample as an episode of an environment: module:Class, "
        "path/to/file.py:Class, or a YAML file with an environment section (name: a class "
        "or tools; options, tools, tool_format, max_turns, max_tokens). Rows add "
        "completion_mask, turns and messages.",
    ),
    max_turns: int = typer.Option(
        None, "--max-turns", help="With --env: the policy's turns in an episode at most (8)."
    ),
    max_episode_tokens: int = typer.Option(
        None,
        "--max-episode-tokens",
        help="With --env: the ids after an episode's prompt at most, the environment's "
        "included (4096).",
    ),
) -> None:
    """Generate n completions per prompt: one rollouts row per (id, sample)."""
    from pt_rollout.generate import GenerateOptions, generate

    one_stdin_input(model=model, prompts=prompts)
    server = _endpoint(endpoint, tokenizer, api_key_env, concurrency, timeout, retries)
    if server is None:
        model = resolve_model(model, option="--model")
    else:
        model, tokenizer = _served_model(model, tokenizer, "--model")
    options = GenerateOptions(
        n=n,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max_tokens,
        stop=list(stop or []),
        seed=seed,
        logprobs=logprobs,
        logprobs_mode=logprobs_mode,
        logprobs_top_k=logprobs_top_k,
        seeding=_seeding(seeding),
        decoder=decoder,
        engine=engine,
        template=not no_template,
        chat_template=chat_template,
        system=system,
        split=split,
        prompt_key=prompt_key,
        id_key=id_key,
        limit=limit,
        batch_size=batch_size,
        dtype=dtype,
        tensor_parallel=tensor_parallel,
        data_parallel=data_parallel,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        endpoint=server,
        tokenizer=tokenizer,
        env=env,
        max_turns=max_turns,
        max_episode_tokens=max_episode_tokens,
    )
    try:
        summary = generate(model, prompts, out, options)
    except KeyboardInterrupt:
        raise interrupted(out) from None
    emit_manifest("rollouts", out, **summary)


@app.command("score")
def score_cmd(
    teacher: str = typer.Option(
        ...,
        "--teacher",
        "-t",
        help="Teacher model directory, hub name, or - for the checkpoint manifest piped in.",
    ),
    rollouts: str = typer.Option(
        ..., "--rollouts", "-r", help="Rollout rows, or - to pipe (not with --teacher -)."
    ),
    out: Path = typer.Option(
        Path("scores.jsonl"), "--out", "-o", help="Output .jsonl or .parquet (resumed if present)."
    ),
    top_k: int = typer.Option(0, "--top-k", help="Also keep the teacher's top-k tokens."),
    at_student_topk: bool = typer.Option(
        False,
        "--at-student-topk",
        help="Add teacher_student_topk_logprobs: the teacher's log-probs of the student's top-k "
        "tokens (HF engine; rollouts generated with --logprobs-top-k).",
    ),
    engine: str = typer.Option("auto", "--engine", help=ENGINE_HELP),
    batch_size: int = typer.Option(256, "--batch-size", help="Rows per engine call."),
    dtype: str = DTYPE_OPTION,
    tensor_parallel: int = TENSOR_PARALLEL_OPTION,
    gpu_memory_utilization: float = GPU_MEMORY_OPTION,
    max_model_len: int = MAX_MODEL_LEN_OPTION,
    endpoint: str = typer.Option(
        None,
        "--endpoint",
        help="URL of an OpenAI-compatible server (http://host:8000/v1) that serves the teacher "
        "and gives prompt log-probs (vllm serve, pt-rollout serve-openai); --teacher is the "
        "name it serves the teacher under.",
    ),
    tokenizer: str = TOKENIZER_OPTION,
    api_key_env: str = API_KEY_ENV_OPTION,
    concurrency: int = CONCURRENCY_OPTION,
    timeout: float = TIMEOUT_OPTION,
    retries: int = RETRIES_OPTION,
) -> None:
    """Add the teacher's log-prob of every completion token (and its top-k) to each rollout."""
    from pt_rollout.score import score

    one_stdin_input(teacher=teacher, rollouts=rollouts)
    server = _endpoint(endpoint, tokenizer, api_key_env, concurrency, timeout, retries)
    if server is None:
        teacher = resolve_model(teacher, option="--teacher")
    else:
        teacher, tokenizer = _served_model(teacher, tokenizer, "--teacher")
    try:
        summary = score(
            teacher,
            rollouts,
            out,
            top_k=top_k,
            at_student_topk=at_student_topk,
            engine=engine,
            batch_size=batch_size,
            dtype=dtype,
            tensor_parallel=tensor_parallel,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            endpoint=server,
            tokenizer=tokenizer,
        )
    except KeyboardInterrupt:
        raise interrupted(out) from None
    emit_manifest("scores", out, **summary)


@app.command("chat")
def chat_cmd(
    model: str = typer.Argument(
        ...,
        metavar="MODEL|-",
        help="Model directory (a run's inference/step-N), hub name, or - for the checkpoint "
        "manifest piped in.",
    ),
    chat_template: str = typer.Option(
        None,
        "--chat-template",
        help="NAME|FILE: chat in this template (chatml, plain, or a .jinja file) instead of "
        "the model's own; its end-of-turn token ends a reply.",
    ),
    system: str = typer.Option(None, "--system", help="System prompt (/system TEXT changes it)."),
    temperature: float = typer.Option(0.7, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(
        1.0, "--top-p", help="Sample from the most likely tokens holding this mass (1: all)."
    ),
    max_tokens: int = typer.Option(512, "--max-tokens", help="New tokens per reply."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
) -> None:
    """Chat with a model in the terminal: /system TEXT, /reset, /exit."""
    import sys

    from pt_rollout.chat import Chat, attach_terminal, read_terminal, run_chat

    model = resolve_model(model, option="MODEL")
    attach_terminal()
    chat = Chat(
        model,
        chat_template=chat_template,
        system=system,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
    )
    run_chat(chat, read_terminal, sys.stdout)


@app.command("serve")
@with_spec_options
def serve_cmd(
    spec: GeneratorSpec,
    listen: str = typer.Option(
        None,
        "--listen",
        help="HOST:PORT to listen on for a trainer (0.0.0.0:7000: every interface; port 0: "
        "any free one, printed).",
    ),
    socket: str = typer.Option(
        None, "--socket", hidden=True, help="A Unix socket, for the trainer that starts this."
    ),
    key_file: str = typer.Option(
        None,
        "--key-file",
        help="The key a trainer must have (default ~/.pt/serve.key; written, mode 0600, if "
        "absent).",
    ),
    start_version: int = typer.Option(
        0, "--start-version", hidden=True, help="The weight version of --model's weights."
    ),
) -> None:
    """Serve a generator to a trainer on another node (rollout.servers: [HOST:PORT, ...])."""
    from pt_core.errors import ConfigError
    from pt_rollout.serve import parse_address, serve

    if (listen is None) == (socket is None):
        raise ConfigError("give --listen HOST:PORT", hint="e.g. --listen 0.0.0.0:7000")
    if listen is not None:
        if spec.weight_transfer == "ipc":
            raise ConfigError(
                "--weight-transfer ipc: not a way to a trainer on another node",
                hint="use gloo or nccl (ipc shares a GPU with the trainer, on its own node)",
            )
        try:
            parse_address(listen, listen=True)
        except ValueError as exc:
            raise ConfigError(f"--listen: {exc}", hint="e.g. --listen 0.0.0.0:7000") from None
    spec = spec.replace(model=resolve_model(spec.model, option="--model"))
    serve(spec, socket=socket, listen=listen, key_file=key_file, version=start_version)


@app.command("serve-openai")
def serve_openai_cmd(
    model: str = MODEL_OPTION,
    listen: str = typer.Option(
        "127.0.0.1:8000",
        "--listen",
        help="HOST:PORT to serve on (port 0: any free one, printed). Another host than "
        "loopback needs --api-key-env.",
    ),
    served_model_name: str = typer.Option(
        None,
        "--served-model-name",
        help="The name clients ask for (the model field); default: --model as given.",
    ),
    api_key_env: str = typer.Option(
        None,
        "--api-key-env",
        help="An environment variable holding the key every client must send "
        "(Authorization: Bearer KEY).",
    ),
    engine: str = typer.Option("auto", "--engine", help=ENGINE_HELP),
    chat_template: str = typer.Option(
        None,
        "--chat-template",
        help="NAME|FILE: render chats with this template (chatml, plain, or a .jinja file) "
        "instead of the model's own; its end-of-turn token ends a reply.",
    ),
    max_logprobs: int = typer.Option(
        20, "--max-logprobs", help="Log-probs a position a request may ask for, at most."
    ),
    logprobs_mode: str = typer.Option(
        "raw",
        "--logprobs-mode",
        help="raw: log-probs under the model's distribution; processed: under the one sampled "
        "from (after temperature and top-p).",
    ),
    decoder: str = DECODER_OPTION,
    dtype: str = DTYPE_OPTION,
    seed: int = typer.Option(0, "--seed", help="Seed of requests that send none."),
    tensor_parallel: int = TENSOR_PARALLEL_OPTION,
    gpu_memory_utilization: float = GPU_MEMORY_OPTION,
    max_model_len: int = MAX_MODEL_LEN_OPTION,
) -> None:
    """Serve a model to OpenAI clients: /v1/models, /v1/completions, /v1/chat/completions."""
    from pt_rollout.openai_api.server import ServeOptions, serve_checkpoint

    model = resolve_model(model, option="--model")
    serve_checkpoint(
        model,
        ServeOptions(
            listen=listen, served_model_name=served_model_name, api_key_env=api_key_env,
            engine=engine, chat_template=chat_template, max_logprobs=max_logprobs,
            logprobs_mode=logprobs_mode, decoder=decoder, dtype=dtype, seed=seed,
            tensor_parallel=tensor_parallel, gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
        ),
    )  # fmt: skip


def _seeding(value: str) -> str:
    from pt_core.errors import ConfigError
    from pt_core.sampling import SEEDING, seeding_value

    if seeding_value(value) not in SEEDING:
        raise ConfigError(f"--seeding {value!r}", hint="use per_sample or engine")
    return seeding_value(value)


main = make_main(app)

if __name__ == "__main__":
    main()
