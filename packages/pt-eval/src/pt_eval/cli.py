"""`pt-eval`: Extract and grade math answers; pass@k and benchmark runs.

    pt-eval grade predictions.jsonl --group-key level
    pt-rollout generate gen.yaml | pt-eval grade -
    pt-train run train.yaml | pt-eval run --model - --benchmark math500

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Protocol, cast

import typer

from pt_core.cli import make_app, make_main
from pt_core.errors import InputError, Interrupted, disk_full_as_error
from pt_core.log import console
from pt_core.manifest import emit_manifest, read_manifest
from pt_eval import __version__
from pt_eval.grade import GradeOptions, grade_file, summary_table_rows
from pt_eval.worker import DEFAULT_TIMEOUT

app = make_app("pt-eval", "Extract and grade math answers; pass@k and benchmark runs.", __version__)

NUMERIC_TOLERANCE = typer.Option(
    None,
    "--numeric-tolerance",
    min=0.0,
    max=0.5,
    help="Also accept two numbers within this relative tolerance (1e-4 is the Qwen2.5-Math "
    "/ DFT evaluation's). Default: exact, a decimal gold judged at its own precision.",
)


def upstream_path(value: str, expected: tuple[str, ...] | None, what: str) -> Path:
    """``value`` as a path; ``-`` reads the upstream stage's manifest from stdin."""
    if value != "-":
        path = Path(value)
        if not path.exists():
            raise InputError(f"{path}: no such file or directory")
        return path
    manifest = read_manifest(expected=expected)
    path = manifest["path"]
    if not isinstance(path, str) or not path:
        raise InputError(
            f"the upstream manifest's 'path' is {type(path).__name__} {path!r}, not a path",
            hint=f"pipe the stage that wrote the {what} into this one, or pass its path",
        )
    if not Path(path).exists():
        raise InputError(f"the upstream manifest names {path}, which does not exist")
    return Path(path)


@app.command()
def grade(
    input: str = typer.Argument(
        ...,
        metavar="FILE|-",
        help="Predictions (jsonl, json array, parquet, csv), or - for a manifest on stdin.",
    ),
    pred_key: str = typer.Option(
        None,
        "--pred-key",
        help="Prediction column; a.b reads a nested key (default: completion, prediction, "
        "response, code, filtered_resps or resps).",
    ),
    gold_key: str = typer.Option(
        None,
        "--gold-key",
        help="Gold answer column, e.g. doc.answer (default: answer, gold, gt, final_answer "
        "or target).",
    ),
    id_key: str = typer.Option(
        None,
        "--id-key",
        help="Problem id column; rows sharing an id are samples of one problem "
        "(default: id, idx, unique_id, problem_id, question_id or doc_id when present).",
    ),
    group_key: list[str] = typer.Option(
        None,
        "--group-key",
        help="Also report per value of this column (e.g. level, subject); repeatable.",
    ),
    filter_name: str = typer.Option(
        None,
        "--filter",
        help="lm-evaluation-harness samples file: grade only the rows of this filter (e.g. "
        "strict-match); default: every filter, reported apart.",
    ),
    out: Path = typer.Option(
        None,
        "--out",
        "-o",
        help="Grades file (.jsonl, .parquet or .csv) (default: INPUT.grades.jsonl beside the "
        "input).",
    ),
    workers: int = typer.Option(
        None, "--workers", min=1, help="Grading processes (default: min(CPU cores, 4))."
    ),
    timeout: float = typer.Option(
        DEFAULT_TIMEOUT,
        "--timeout",
        min=0.1,
        help="Seconds allowed per sample before it is marked timeout.",
    ),
    numeric_tolerance: float = NUMERIC_TOLERANCE,
    last_number: bool = typer.Option(
        None,
        "--last-number/--no-last-number",
        help="Fall back to the last number of a response that states no answer: by default "
        "only for responses that finished; --last-number for cut-off ones too.",
        show_default=False,
    ),
) -> None:
    """Grade every prediction against its gold answer; print pass@k, maj@n and accuracy."""
    path = upstream_path(input, None, "predictions")
    options = GradeOptions(
        pred_key=pred_key, gold_key=gold_key, id_key=id_key, group_keys=list(group_key or []),
        workers=workers, timeout=timeout, numeric_tolerance=numeric_tolerance,
        last_number=last_number, filter=filter_name,
    )  # fmt: skip
    try:
        out_path, summary = grade_file(path, out, options)
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted while grading: nothing written (the grades file is written whole, "
            "at the end); run the same command again to grade from the start"
        ) from None
    _print_summary(summary)
    emit_manifest("grades", out_path, **summary)


def _print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="pt-eval grade", show_header=False)
    for name, value in summary_table_rows(summary):
        table.add_row(name, value)
    console.print(table)
    if len(summary.get("filters", {})) > 1:
        _print_breakdown("filter", summary["filters"])
    for key, groups in summary.get("groups", {}).items():
        _print_breakdown(key, groups)


def _print_breakdown(key: str, groups: dict[str, dict]) -> None:
    from rich.table import Table

    ks = list(next(iter(groups.values())).get("pass@k", {}))
    table = Table(title=f"by {key}")
    for column in (key, "problems", "samples", "accuracy", *(f"pass@{k}" for k in ks), "maj@n"):
        table.add_column(column, justify="left" if column == key else "right")
    for name, s in groups.items():
        table.add_row(
            name, str(s["problems"]), str(s["samples"]), f"{s['accuracy']:.4f}",
            *(f"{s.get('pass@k', {}).get(k, float('nan')):.4f}" for k in ks),
            f"{s.get('maj@n', float('nan')):.4f}",
        )  # fmt: skip
    console.print(table)


@app.command()
def run(
    model: str = typer.Option(
        ...,
        "--model",
        "-m",
        help="Inference checkpoint (RUN_DIR/inference/step-N), a hub name, or - for the "
        "checkpoint manifest that pt-train prints.",
    ),
    benchmark: str = typer.Option(
        ..., "--benchmark", "-b", help="A benchmark name (math500, aime24, gsm8k, ...) or a file."
    ),
    benchmarks_dir: Path = typer.Option(
        None,
        "--benchmarks-dir",
        help="Directory that holds the named benchmarks (default: $PT_BENCHMARKS, else "
        "$PT_SHARED_DIR/benchmarks, else shared/benchmarks beside the checkout).",
    ),
    prompt_key: str = typer.Option(
        None,
        "--prompt-key",
        help="Column with the problem (default: prompt, problem, question or messages).",
    ),
    n: int = typer.Option(16, "--n", min=1, help="Samples per problem."),
    temperature: float = typer.Option(1.0, "--temperature", min=0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
    max_tokens: int = typer.Option(4096, "--max-tokens", min=1, help="New tokens per sample."),
    engine: str = typer.Option("auto", "--engine", help="vllm, hf, or auto."),
    seed: int = typer.Option(0, "--seed"),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the first N problems."),
    out: Path = typer.Option(
        None, "--out", "-o", help="Output dir (default: eval/<model>/<benchmark>); reruns resume."
    ),
    tensor_parallel: int = typer.Option(
        1, "--tensor-parallel", min=1, help="GPUs per engine (vLLM)."
    ),
    data_parallel: int = typer.Option(
        1, "--data-parallel", min=1, help="Engines, one per GPU group."
    ),
    numeric_tolerance: float = NUMERIC_TOLERANCE,
) -> None:
    """Generate n samples per benchmark problem with the standard math prompt, then grade."""
    from pt_eval.run import default_out_dir, run_benchmark

    if engine not in ("auto", "vllm", "hf"):
        raise InputError(f"--engine {engine!r}: expected vllm, hf or auto")
    model_path = str(upstream_path(model, ("checkpoint",), "checkpoint")) if model == "-" else model
    out_dir = out or default_out_dir(model_path, benchmark)
    try:
        with disk_full_as_error(out_dir):
            out_path, summary = run_benchmark(
                model_path, benchmark, n=n, temperature=temperature, top_p=top_p,
                max_tokens=max_tokens, engine=engine, seed=seed, limit=limit, out_dir=out_dir,
                tensor_parallel=tensor_parallel, data_parallel=data_parallel,
                grade_options=GradeOptions(numeric_tolerance=numeric_tolerance),
                benchmarks_dir=benchmarks_dir, prompt_key=prompt_key,
            )  # fmt: skip
    except KeyboardInterrupt:
        raise _run_interrupted(out_dir) from None
    _print_summary(summary)
    emit_manifest("grades", out_path, **summary)


def _run_interrupted(out_dir: Path) -> Interrupted:
    """What Ctrl-C left of ``pt-eval run``'s outputs: the rollouts (kept, resumed by the same
    command) and no grades (written whole, at the end)."""
    rollouts = out_dir / "rollouts.jsonl"
    if rollouts.exists():
        return Interrupted(
            f"interrupted while grading: the rollouts in {rollouts} are complete and kept, no "
            "grades written; the same command grades them without generating again"
        )
    from pt_rollout.output import interrupted

    return interrupted(rollouts)


class _UsageError(Protocol):
    """What is used here of click's UsageError."""

    def format_message(self) -> str: ...


class _OneLineUsageErrors:
    """The app, with a mistyped or missing flag reported as one ``error:`` line (exit 2)."""

    def __init__(self, typer_app: typer.Typer):
        self.app = typer_app

    def __call__(self, **kwargs):
        try:
            return self.app(**kwargs)
        except Exception as exc:
            # click's UsageError, as typer bundles it (its class differs between versions)
            if not any(c.__name__ == "UsageError" for c in type(exc).__mro__):
                raise
            usage_error = cast(_UsageError, exc)  # a UsageError, by the check above
            ctx = getattr(exc, "ctx", None)
            command = ctx.command_path if ctx is not None else "pt-eval"
            raise InputError(f"{usage_error.format_message()} (see {command} --help)") from None


# seconds a SIGTERM'd grading has to unwind before it is ended without unwinding
TERMINATE_GRACE = 15.0


def _terminate(signum, frame) -> None:
    """Unwind (the grading pool closes and removes its socket directory); should the
    unwinding not end within TERMINATE_GRACE (a signal that landed inside a lock's
    acquisition can leave it held), kill the pool's processes, remove its directory and
    end the process anyway, with the same exit code."""
    import os
    import threading
    import time

    def deadline() -> None:
        time.sleep(TERMINATE_GRACE)
        from pt_eval.worker import abandon_open_pools

        abandon_open_pools()
        os.write(2, b"error: stopped (SIGTERM); the grading did not unwind in time\n")
        os._exit(128 + signum)

    threading.Thread(target=deadline, daemon=True).start()
    raise SystemExit(128 + signum)


# make_main only calls its app, as the wrapper is called
_main = make_main(cast(typer.Typer, _OneLineUsageErrors(app)))


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    _main()


if __name__ == "__main__":
    main()
