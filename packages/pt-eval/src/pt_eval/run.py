"""`pt-eval run`: generate on a benchmark with a model, then grade (the DFT paper's protocol).

    grades_path, summary = run_benchmark("ckpt/inference/step-500", "math500", n=16)

Each problem is asked with the standard math prompt as the system message (the
Qwen2.5-Math chain-of-thought prompt the DFT paper evaluates with) and sampled ``n`` times
at ``temperature``; the summary is that of ``pt-eval grade`` (accuracy = avg@n, pass@k,
maj@n). Generation needs pt-rollout (``pip install 'pt-eval[rollout]'``), which is imported
only here, so grading alone never imports torch. Outputs go to ``out_dir``: the prompts,
the rollouts (resumed when the command is rerun) and the grades.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pt_core.errors import InputError, PtError
from pt_core.files import write_rows
from pt_core.log import get_logger
from pt_eval.benchmarks import load_benchmark
from pt_eval.grade import GradeOptions, grade_file

log = get_logger(__name__)

MATH_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def default_out_dir(model: str | os.PathLike, benchmark: str | os.PathLike) -> Path:
    """``eval/<model>/<benchmark>`` under the working directory."""
    model_path = Path(model)
    model_name = (
        f"{model_path.parent.name}-{model_path.name}" if model_path.exists() else str(model)
    )
    bench_name = Path(benchmark).stem if Path(benchmark).exists() else str(benchmark)
    return Path("eval") / _slug(model_name) / _slug(bench_name)


def check_model(model: str | os.PathLike) -> str:
    """The model to generate with: an inference checkpoint directory (one with a
    config.json) or a hub name. A run directory or a training-state checkpoint is refused
    with the inference checkpoint to use instead."""
    path = Path(model)
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(model)
        run_dir = path if (path / "inference").is_dir() else None
        if run_dir is None and path.parent.name == "checkpoints":
            run_dir = path.parent.parent  # run/checkpoints/step-N: training state
        if run_dir is not None:
            steps = sorted(
                (p for p in (run_dir / "inference").glob("step-*") if p.is_dir()),
                key=lambda p: int(p.name.split("-")[-1]) if p.name.split("-")[-1].isdigit() else -1,
            )
            if steps:
                raise InputError(
                    f"{path} is a training run directory, not an inference checkpoint",
                    hint=f"pass --model {steps[-1]} (the latest of "
                    f"{', '.join(p.name for p in steps)})",
                )
            raise InputError(
                f"{path} is a training run directory with no inference checkpoint yet",
                hint="evaluate RUN_DIR/inference/step-N once training has written one",
            )
        raise InputError(
            f"{path}: not a model directory (no config.json)",
            hint="pass an inference checkpoint (RUN_DIR/inference/step-N) or a hub name",
        )
    text = str(model)
    if path.exists():
        raise InputError(f"{path} is a file; expected a model directory or a hub name")
    if text.startswith(("/", "./", "../", "~")) or text.count("/") > 1:
        raise InputError(
            f"{text}: no such model directory",
            hint="pass an inference checkpoint (RUN_DIR/inference/step-N) or a hub name",
        )
    return text


def run_benchmark(
    model: str | os.PathLike,
    benchmark: str | os.PathLike,
    *,
    n: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 4096,
    engine: str = "auto",
    seed: int = 0,
    out_dir: str | os.PathLike | None = None,
    limit: int | None = None,
    system_prompt: str = MATH_PROMPT,
    grade_options: GradeOptions | None = None,
    benchmarks_dir: str | os.PathLike | None = None,
    prompt_key: str | None = None,
    **generate_options,
) -> tuple[Path, dict]:
    """Generate ``n`` samples per problem of ``benchmark`` (a name from
    ``pt_eval.benchmarks.BENCHMARKS`` or a file) with ``model`` and grade them. Returns the
    grades file and the grading summary (plus the run's settings)."""
    model = check_model(model)
    rows = load_benchmark(benchmark, benchmarks_dir=benchmarks_dir, prompt_key=prompt_key)
    try:
        from pt_rollout.generate import GenerateOptions, generate
    except ImportError as exc:
        raise PtError(
            f"pt-eval run generates with pt-rollout, which is not installed ({exc})",
            hint="pip install 'pt-eval[rollout]', or generate with pt-rollout and pipe "
            "into pt-eval grade -",
        ) from None

    if limit is not None:
        rows = rows[:limit]
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(model, benchmark)
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts_path = write_rows(
        out_dir / "prompts.jsonl", [{**row, "prompt": row["problem"]} for row in rows]
    )
    rollouts_path = out_dir / "rollouts.jsonl"
    options = GenerateOptions(
        n=n,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        engine=engine,
        seed=seed,
        system=system_prompt or None,
        prompt_key="prompt",
        id_key="id",
        **generate_options,
    )
    log.info("%s: %d problems x %d samples with %s", benchmark, len(rows), n, model)
    generated = generate(str(model), prompts_path, rollouts_path, options)
    grade_options = grade_options or GradeOptions()
    grade_options.id_key = "id"
    grades_path, summary = grade_file(rollouts_path, out_dir / "grades.jsonl", grade_options)
    summary.update(
        benchmark=str(benchmark),
        model=str(model),
        temperature=temperature,
        max_tokens=max_tokens,
        engine=generated["engine"],
        rollouts=str(rollouts_path.resolve()),
        completion_tokens=generated["completion_tokens"],
    )
    return grades_path, summary


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "run"
