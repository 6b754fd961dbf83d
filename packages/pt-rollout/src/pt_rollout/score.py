"""`pt-rollout score`: a teacher's log-probs of every completion token (on-policy distillation).

    score("teacher/", "rollouts.jsonl", "scores.jsonl", top_k=8)

Adds ``teacher_token_logprobs`` (one per completion token) and, with ``top_k``,
``teacher_topk_ids`` / ``teacher_topk_logprobs`` (k per completion token, most likely
first) to each rollout row. Row j of each list is the teacher's distribution that predicts
completion token j, i.e. given the prompt and completion[:j]. The teacher must share the
student's tokenizer: scoring works on the rollout's token ids.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pt_core.errors import ConfigError, InputError
from pt_core.files import iter_rows, require_columns
from pt_core.log import get_logger
from pt_rollout.generate import refuse_engine_options
from pt_rollout.openai_api.client import EndpointEngine, EndpointOptions
from pt_rollout.output import ResumableOutput, row_key
from pt_rollout.throughput import Throughput

log = get_logger(__name__)

NEEDED = ("id", "sample", "prompt_token_ids", "completion_token_ids")


def score(
    teacher: str | os.PathLike,
    rollouts: str | os.PathLike,
    out: str | os.PathLike,
    *,
    top_k: int = 0,
    at_student_topk: bool = False,
    engine: str = "auto",
    batch_size: int = 256,
    dtype: str = "auto",
    tensor_parallel: int = 1,
    gpu_memory_utilization: float | None = None,
    max_model_len: int | None = None,
    endpoint: EndpointOptions | None = None,
    tokenizer: str | None = None,
) -> dict:
    """Score every rollout row in ``rollouts`` with ``teacher`` into ``out`` (resumable).
    With ``endpoint`` the teacher is the model of that name the server serves, and
    ``tokenizer`` (default: ``teacher``) the local tokenizer the server's is checked
    against. Returns the manifest fields."""
    from pt_core.manifest import resolve_input

    if top_k < 0:
        raise ConfigError(f"--top-k must be >= 0, got {top_k}")
    if endpoint is not None:
        refuse_engine_options(
            engine=engine != "auto",
            dtype=dtype != "auto",
            tensor_parallel=tensor_parallel != 1,
            gpu_memory_utilization=gpu_memory_utilization is not None,
            max_model_len=max_model_len is not None,
        )
    teacher = str(teacher)
    # which model scored each row, so a trainer can refuse a teacher.path naming another
    teacher_model = str(Path(teacher).resolve()) if Path(teacher).is_dir() else teacher
    started = time.perf_counter()
    path, _ = resolve_input(rollouts, expected=("rollouts", "scores", "grades"))
    rows = list(iter_rows(path))
    if not rows:
        raise InputError(f"{path}: no rollout rows")
    needed = (*NEEDED, "student_topk_ids") if at_student_topk else NEEDED
    for index, row in enumerate(rows):
        require_columns(row, needed, f"{path} row {index + 1}")
    output = ResumableOutput(out)
    pending = [r for r in rows if row_key(r["id"], r["sample"]) not in output.done]
    log.info(
        "%d rollouts from %s: %d to score, %d already in %s",
        len(rows),
        path,
        len(pending),
        output.resumed,
        output.path,
    )
    meter = Throughput("score", total=len(rows), done=output.resumed, unit="rows")
    engine_name = engine
    with output.kept_on_error():
        if pending:
            engine_name = _score_pending(
                _open_scorer(teacher, engine, dtype, tensor_parallel, gpu_memory_utilization,
                             max_model_len, top_k, endpoint, tokenizer),
                pending, output, meter, path, top_k, at_student_topk, batch_size, teacher_model,
            )  # fmt: skip
    position = {row_key(r["id"], r["sample"]): i for i, r in enumerate(rows)}
    total = output.finalize(
        order=lambda r: (position.get(row_key(r["id"], r["sample"]), len(rows)),)
    )
    return {
        "rows": total,
        "scored": meter.rows,
        "completion_tokens": meter.tokens,
        "resumed": output.resumed,
        "top_k": top_k,
        "engine": engine_name,
        **({"endpoint": endpoint.base_url} if endpoint else {}),
        "teacher": teacher,
        "rollouts_path": str(path),
        "seconds": round(time.perf_counter() - started, 3),
        "tokens_per_s": round(meter.tokens_per_s, 1),
    }


def _open_scorer(teacher, engine, dtype, tensor_parallel, gpu_memory_utilization, max_model_len,
                 top_k, endpoint, tokenizer):  # fmt: skip
    """The teacher: the model of that name at ``endpoint``, or one loaded here."""
    if endpoint is not None:
        from transformers import AutoTokenizer

        return EndpointEngine(
            endpoint, teacher, AutoTokenizer.from_pretrained(tokenizer or teacher)
        )
    from pt_rollout.engines import load_engine

    return load_engine(
        engine,
        teacher,
        dtype=dtype,
        tensor_parallel_size=tensor_parallel,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        max_logprobs=max(20, top_k),
    )


def _score_pending(scorer, pending, output, meter, path, top_k, at_student_topk, batch_size,
                   teacher_model) -> str:  # fmt: skip
    """Score the pending rows a batch at a time, each batch appended to ``output``;
    returns the engine's name."""
    with scorer, meter:
        if isinstance(scorer, EndpointEngine):  # a server: it must read ids as we do
            first = pending[0]
            scorer.check_tokenizer(first["prompt_token_ids"] + first["completion_token_ids"])
        for start in range(0, len(pending), batch_size):
            batch = pending[start : start + batch_size]
            try:
                scores = scorer.score(
                    [r["prompt_token_ids"] for r in batch],
                    [r["completion_token_ids"] for r in batch],
                    top_k=top_k,
                    at_ids=[r["student_topk_ids"] for r in batch] if at_student_topk else None,
                )
            except ValueError as exc:
                raise InputError(f"{path}: {exc}") from None
            scored = []
            for row, s in zip(batch, scores, strict=True):
                row = {
                    **row,
                    "teacher_token_logprobs": s.token_logprobs,
                    "teacher_model": teacher_model,
                }
                if top_k:
                    row["teacher_topk_ids"] = s.topk_ids
                    row["teacher_topk_logprobs"] = s.topk_logprobs
                if at_student_topk:
                    row["teacher_student_topk_logprobs"] = s.at_ids_logprobs
                scored.append(row)
            output.write(scored)
            meter.advance(len(scored), sum(len(r["completion_token_ids"]) for r in batch))
    return scorer.name
