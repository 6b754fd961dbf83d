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

from pt_core.errors import PtError
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
    **generate_options,
) -> tuple[Path, dict]:
    """Generate ``n`` samples per problem of ``benchmark`` (a name from
    ``pt_eval.benchmarks.BENCHMARKS`` or a file) with ``model`` and grade them. Returns the
    grades file and the grading summary (plus the run's settings)."""
    try:
        from pt_rollout.generate import GenerateOptions, generate
    except ImportError as exc:
        raise PtError(
            f"pt-eval run generates with pt-rollout, which is not installed ({exc})",
            hint="pip install 'pt-eval[rollout]', or generate with pt-rollout and pipe "
            "into pt-eval grade -",
        ) from None

    rows = load_benchmark(benchmark)
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
    grades_path, summary = grade_file(
        rollouts_path, out_dir / "grades.jsonl", grade_options or GradeOptions(id_key="id")
    )
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
