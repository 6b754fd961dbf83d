"""`pt-rollout`: Generate rollouts and score them with a teacher (vLLM or HF).

    pt-rollout generate --model ckpt/ --prompts prompts.jsonl --n 8 --out rollouts.jsonl
    pt-rollout score --teacher big/ --rollouts - --top-k 8 --out scores.jsonl
    pt-train run train.yaml | pt-rollout generate --model - --prompts prompts.jsonl
    pt-rollout chat runs/sft/inference/step-235
    pt-rollout serve --listen 0.0.0.0:7000 --model ckpt/ --engine vllm

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


@app.command("generate")
def generate_cmd(
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="Model directory (a run's inference/step-N), hub name, or - for the checkpoint "
        "manifest piped in.",
    ),
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
    decoder: str = typer.Option(
        "auto",
        "--decoder",
        help="The HF engine's decoder: lean (Llama-family models as flat tensor operations), "
        "hf (the model's forward), auto (lean on a CPU).",
    ),
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
    dtype: str = typer.Option(
        "auto", "--dtype", help="auto (the checkpoint's), float32, bfloat16."
    ),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="GPUs per engine (vLLM)."),
    data_parallel: int = typer.Option(
        1, "--data-parallel", help="Engines, one per GPU group, each on a shard of the prompts."
    ),
    gpu_memory_utilization: float = typer.Option(
        None, "--gpu-memory-utilization", help="vLLM's memory share (default 0.9 GPU, 0.2 CPU)."
    ),
    max_model_len: int = typer.Option(None, "--max-model-len", help="vLLM context length cap."),
) -> None:
    """Generate n completions per prompt: one rollouts row per (id, sample)."""
    from pt_rollout.generate import GenerateOptions, generate

    one_stdin_input(model=model, prompts=prompts)
    model = resolve_model(model, option="--model")
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
    dtype: str = typer.Option("auto", "--dtype"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="GPUs per engine (vLLM)."),
    gpu_memory_utilization: float = typer.Option(None, "--gpu-memory-utilization"),
    max_model_len: int = typer.Option(None, "--max-model-len"),
) -> None:
    """Add the teacher's log-prob of every completion token (and its top-k) to each rollout."""
    from pt_rollout.score import score

    one_stdin_input(teacher=teacher, rollouts=rollouts)
    teacher = resolve_model(teacher, option="--teacher")
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


def _seeding(value: str) -> str:
    from pt_core.errors import ConfigError
    from pt_core.sampling import SEEDING, seeding_value

    if seeding_value(value) not in SEEDING:
        raise ConfigError(f"--seeding {value!r}", hint="use per_sample or engine")
    return seeding_value(value)


main = make_main(app)

if __name__ == "__main__":
    main()
