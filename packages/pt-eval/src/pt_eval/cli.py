"""`pt-eval`: Extract and grade math answers; pass@k and benchmark runs.

    pt-eval grade predictions.jsonl --group-key level
    pt-rollout generate gen.yaml | pt-eval grade -

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

from pathlib import Path

import typer

from pt_core.cli import make_app, make_main
from pt_core.log import console
from pt_core.manifest import emit_manifest, resolve_input
from pt_eval import __version__
from pt_eval.grade import GradeOptions, grade_file, summary_table_rows
from pt_eval.worker import DEFAULT_TIMEOUT

app = make_app("pt-eval", "Extract and grade math answers; pass@k and benchmark runs.", __version__)


@app.command()
def grade(
    input: str = typer.Argument(
        ...,
        metavar="FILE|-",
        help="Predictions (jsonl, json array, parquet), or - for a manifest on stdin.",
    ),
    pred_key: str = typer.Option(
        None,
        "--pred-key",
        help="Prediction column (default: completion, prediction, response or code).",
    ),
    gold_key: str = typer.Option(
        None, "--gold-key", help="Gold answer column (default: answer, gold, gt or final_answer)."
    ),
    id_key: str = typer.Option(
        None,
        "--id-key",
        help="Problem id column; rows sharing an id are samples of one problem "
        "(default: id, idx, unique_id, problem_id or question_id when present).",
    ),
    group_key: list[str] = typer.Option(
        None,
        "--group-key",
        help="Also report per value of this column (e.g. level, subject); repeatable.",
    ),
    out: Path = typer.Option(
        None,
        "--out",
        "-o",
        help="Grades file (.jsonl or .parquet) (default: INPUT.grades.jsonl beside the input).",
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
    last_number: bool = typer.Option(
        True,
        "--last-number/--no-last-number",
        help="Fall back to the last number in a response that states no answer.",
    ),
) -> None:
    """Grade every prediction against its gold answer; print pass@k, maj@n and accuracy."""
    path, _ = resolve_input(input)
    options = GradeOptions(
        pred_key=pred_key, gold_key=gold_key, id_key=id_key, group_keys=list(group_key or []),
        workers=workers, timeout=timeout, last_number=last_number,
    )  # fmt: skip
    out_path, summary = grade_file(path, out, options)
    _print_summary(summary)
    emit_manifest("grades", out_path, **summary)


def _print_summary(summary: dict) -> None:
    from rich.table import Table

    table = Table(title="pt-eval grade", show_header=False)
    for name, value in summary_table_rows(summary):
        table.add_row(name, value)
    console.print(table)
    for key, groups in summary.get("groups", {}).items():
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
    model: str = typer.Option(..., "--model", "-m", help="Model directory (or hub name)."),
    benchmark: str = typer.Option(
        ..., "--benchmark", "-b", help="A benchmark name (math500, aime24, gsm8k, ...) or a file."
    ),
    n: int = typer.Option(16, "--n", min=1, help="Samples per problem."),
    temperature: float = typer.Option(1.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    max_tokens: int = typer.Option(4096, "--max-tokens", help="New tokens per sample."),
    engine: str = typer.Option("auto", "--engine", help="vllm, hf, or auto."),
    seed: int = typer.Option(0, "--seed"),
    limit: int = typer.Option(None, "--limit", min=1, help="Only the first N problems."),
    out: Path = typer.Option(
        None, "--out", "-o", help="Output dir (default: eval/<model>/<benchmark>); reruns resume."
    ),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", help="GPUs per engine (vLLM)."),
    data_parallel: int = typer.Option(1, "--data-parallel", help="Engines, one per GPU group."),
) -> None:
    """Generate n samples per benchmark problem with the standard math prompt, then grade."""
    from pt_eval.run import run_benchmark

    out_path, summary = run_benchmark(
        model, benchmark, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens,
        engine=engine, seed=seed, limit=limit, out_dir=out,
        tensor_parallel=tensor_parallel, data_parallel=data_parallel,
    )  # fmt: skip
    _print_summary(summary)
    emit_manifest("grades", out_path, **summary)


main = make_main(app)

if __name__ == "__main__":
    main()
