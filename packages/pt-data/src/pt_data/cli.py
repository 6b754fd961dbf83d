"""`pt-data`: Load, transform, mix, template, tokenize, pack and inspect datasets.

    pt-data build data.yaml [data.seed=3 ...]     -> one manifest line on stdout
    pt-data inspect data.yaml --stage tokenized -n 3
    pt-data stats data.yaml|DATASET [--plot lengths.png]
    pt-data synth arithmetic --n 2000 --out data/arith

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from pt_core.cli import make_app, make_main, split_overrides
from pt_core.errors import InputError
from pt_core.manifest import emit_manifest, resolve_input
from pt_data import __version__

app = make_app(
    "pt-data", "Load, transform, mix, template, tokenize, pack and inspect datasets.", __version__
)


@app.command()
def build(
    config: Path = typer.Argument(..., help="YAML file with a data: section"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. data.seed=3"),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="output directory (overrides data.output_dir)"
    ),
    skip_bad: bool = typer.Option(
        False, "--skip-bad", help="skip malformed jsonl lines and count them"
    ),
) -> None:
    """Build a dataset directory (parquet shards + dataset.json) and print its manifest."""
    from pt_data.build import build as run_build
    from pt_data.config import load_data_config

    cfg = load_data_config(config, split_overrides(overrides))
    fields = run_build(cfg, out_dir=out, skip_bad=skip_bad or None)
    emit_manifest("dataset", fields.pop("path"), **fields)


@app.command()
def inspect(
    target: str = typer.Argument(..., help="a data config (YAML), or a built dataset / '-'"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides"),
    stage: str = typer.Option(
        "tokenized", "--stage", "-s", help="raw | transformed | formatted | tokenized"
    ),
    n: int = typer.Option(3, "-n", help="rows to show (per dataset)"),
    dataset: int | None = typer.Option(None, "--dataset", "-d", help="only this dataset (index)"),
    split: str = typer.Option("train", "--split", help="split of a built dataset"),
    as_json: bool = typer.Option(
        False, "--json", help="also print the rows as JSON lines on stdout"
    ),
) -> None:
    """Show rows at one stage; at 'tokenized' the trained tokens are highlighted."""
    from pt_data.inspect import inspect_config, inspect_dataset, show

    if target == "-" or not target.endswith((".yaml", ".yml")):
        path, _ = resolve_input(target, expected=("dataset",))
        records, _ = inspect_dataset(path, n=n, split=split)
    else:
        from pt_data.config import load_data_config

        cfg = load_data_config(target, split_overrides(overrides))
        records = inspect_config(cfg, stage, n=n, dataset=dataset)
    show(records)
    if as_json:
        for rec in records:
            rec = {k: v for k, v in rec.items() if k != "tokenizer"}
            sys.stdout.write(json.dumps(rec, ensure_ascii=False, default=str) + "\n")


@app.command()
def stats(
    target: str = typer.Argument(..., help="a data config (YAML), or a built dataset / '-'"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides"),
    plot: Path | None = typer.Option(
        None, "--plot", help="also draw the length histogram to this PNG"
    ),
    split: str = typer.Option("train", "--split", help="split of a built dataset"),
    limit: int | None = typer.Option(
        None, "--limit", help="count only the first N rows of a config"
    ),
) -> None:
    """Token counts (total, mean, min, max, percentiles) per source, and a length histogram.
    Prints the figures as one JSON line on stdout, the table on stderr."""
    from pt_data.stats import compute_stats, plot_lengths, render_stats

    if target != "-" and not Path(target).exists():
        raise InputError(f"{target}: no such file or directory")
    if target == "-":
        path, _ = resolve_input(target, expected=("dataset",))
        target = str(path)
    result = compute_stats(target, split_overrides(overrides), split=split, limit=limit)
    lengths = result.pop("_lengths")
    render_stats(result)
    if plot is not None:
        result["plot"] = str(plot_lengths(lengths, plot, result.get("max_seq_length")))
    sys.stdout.write(json.dumps(result) + "\n")


@app.command()
def synth(
    kind: str = typer.Argument(..., help="generator: arithmetic"),
    n: int = typer.Option(..., "--n", help="train rows"),
    out: Path = typer.Option(..., "--out", "-o", help="directory for train.jsonl and test.jsonl"),
    seed: int = typer.Option(0, "--seed"),
    n_test: int | None = typer.Option(None, "--n-test", help="test rows (default n/10, 50..500)"),
) -> None:
    """Generate a small math dataset (train.jsonl, test.jsonl) a tiny model learns on a CPU."""
    from pt_data.synth import write_synth

    counts = write_synth(kind, n, out, seed=seed, n_test=n_test)
    emit_manifest("dataset", out, format="raw", rows=counts["train"], splits=counts)


@app.command()
def tokenizer(
    texts: list[Path] = typer.Option(
        ..., "--texts", "-t", help="row files (jsonl/json/parquet) whose text the tokenizer learns"
    ),
    out: Path = typer.Option(..., "--out", "-o", help="directory for the tokenizer files"),
    vocab_size: int = typer.Option(512, "--vocab-size", help="at most this many tokens"),
) -> None:
    """Train a small byte-level BPE tokenizer with a ChatML template on local text (offline)."""
    from pt_data.tokenizer import train_tokenizer_on_rows

    tok = train_tokenizer_on_rows(texts, out, vocab_size=vocab_size)
    emit_manifest("tokenizer", out, vocab_size=len(tok))


@app.command()
def templates() -> None:
    """List the named chat templates and the built-in transforms."""
    from pt_data.templates import TEMPLATES
    from pt_data.transforms import get_transform, known_transforms

    typer.echo("chat templates: " + ", ".join(TEMPLATES), err=True)
    for name in known_transforms():
        t = get_transform(name)
        doc = (t.fn.__doc__ or "").strip().splitlines()[0] if t.fn.__doc__ else ""
        typer.echo(f"transform {name:<18} -> {t.kind or '?':<13} {doc}", err=True)


main = make_main(app)

if __name__ == "__main__":
    main()
