"""`pt-data`: Load, transform, mix, template, tokenize, pack and inspect datasets.

    pt-data build data.yaml [data.seed=3 ...]     -> one manifest line on stdout
    pt-data check data.yaml [data.seed=3 ...]     -> the resolved config, nothing read or built
    pt-data inspect data.yaml --stage tokenized -n 3
    pt-data stats data.yaml|DATASET [--plot lengths.png]
    pt-data pairs grades.jsonl|-                  -> preference pairs from graded rollouts
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

_BOOLEAN_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0"}


def flag(name: str, help: str):
    """An on/off option that takes no value (shown without a value type in --help)."""
    return typer.Option(False, name, help=help, metavar="")


def overrides_of(words: list[str] | None) -> list[str]:
    """The ``key=value`` words after a config; anything else is one clear error."""
    words = split_overrides(words)
    for word in words:
        if "=" not in word:
            hint = "write overrides as key=value, e.g. data.seed=3"
            if word.lower() in _BOOLEAN_WORDS:
                hint = "flags take no value: give the flag alone to turn it on"
            raise InputError(f"{word!r} is not an override (key=value)", hint=hint)
    return words


@app.command()
def build(
    config: Path = typer.Argument(..., help="YAML file with a data: section"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. data.seed=3"),
    out: Path | None = typer.Option(
        None, "--out", "-o", help="output directory (overrides data.output_dir)"
    ),
    skip_bad: bool = flag("--skip-bad", "skip malformed jsonl lines and count them"),
    shard: str | None = typer.Option(
        None,
        "--shard",
        metavar="I/N",
        help="build every N-th chunk from the I-th (0-based), one of N processes, nodes or "
        "SLURM tasks; the last to finish assembles the dataset and prints its manifest",
    ),
) -> None:
    """Build a dataset directory (parquet shards + dataset.json) and print its manifest.
    Run again after an interruption, it resumes at its last complete chunk."""
    from pt_data.build import build as run_build
    from pt_data.chunks import parse_shard
    from pt_data.config import load_data_config

    which = parse_shard(shard)
    cfg = load_data_config(config, overrides_of(overrides))
    fields = run_build(cfg, out_dir=out, skip_bad=skip_bad or None, shard=which)
    if fields is not None:
        emit_manifest("dataset", fields.pop("path"), **fields)


@app.command()
def check(
    config: Path = typer.Argument(..., help="YAML file with a data: section"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides, e.g. data.seed=3"),
) -> None:
    """Validate a data config (its schema and transforms) without reading or building any
    data; print the resolved config as JSON."""
    from pt_core.config import config_to_dict
    from pt_data.config import load_data_config
    from pt_data.transforms import get_transform

    cfg = load_data_config(config, overrides_of(overrides))
    for dataset in cfg.datasets:
        get_transform(dataset.transform_name)  # an unknown transform is refused by name
    typer.echo(json.dumps({"config": config_to_dict(cfg), "datasets": len(cfg.datasets)}))
    typer.echo(f"ok: {config}", err=True)


@app.command()
def inspect(
    target: str = typer.Argument(..., help="a data config (YAML), or a built dataset / '-'"),
    overrides: list[str] = typer.Argument(None, help="key=value overrides"),
    stage: str = typer.Option(
        "tokenized", "--stage", "-s", help="raw | transformed | formatted | tokenized"
    ),
    n: int = typer.Option(3, "-n", min=1, help="rows to show (per dataset)"),
    dataset: int | None = typer.Option(None, "--dataset", "-d", help="only this dataset (index)"),
    split: str = typer.Option("train", "--split", help="split of a built dataset"),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="tokenizer to decode a built dataset with (default: the one in its dataset.json)",
    ),
    as_json: bool = flag("--json", "also print the rows as JSON lines on stdout"),
    skip_bad: bool = flag("--skip-bad", "skip malformed jsonl lines"),
) -> None:
    """Show rows at one stage; at 'tokenized' the trained tokens are highlighted.

    Preference pairs show the prompt once, chosen and rejected side by side.
    """
    from pt_data.inspect import inspect_config, inspect_dataset, show

    if target == "-" or not target.endswith((".yaml", ".yml")):
        if overrides:
            raise InputError(
                f"overrides ({' '.join(overrides)}) apply to a config; {target} is a dataset"
            )
        path, _ = resolve_input(target, expected=("dataset", "rollouts"))
        tok = None
        if tokenizer is not None:
            from pt_data.build import load_tokenizer

            tok = load_tokenizer(tokenizer, key="--tokenizer")
        records, _ = inspect_dataset(path, n=n, split=split, tokenizer=tok, skip_bad=skip_bad)
    else:
        from pt_data.config import load_data_config

        if tokenizer is not None:
            raise InputError(
                "--tokenizer decodes a built dataset; a config names its tokenizer",
                hint="pass data.tokenizer.name_or_path=DIR after the config instead",
            )
        cfg = load_data_config(target, overrides_of(overrides))
        records = inspect_config(cfg, stage, n=n, dataset=dataset, skip_bad=skip_bad)
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
        None, "--limit", min=1, help="count only the first N rows of a config"
    ),
    skip_bad: bool = flag("--skip-bad", "skip malformed jsonl lines"),
) -> None:
    """Token counts per source, or per part of a pair, and a length histogram.

    Total, mean, min, max and percentiles per source (pairs: prompt, chosen, rejected);
    the figures as one JSON line on stdout, the table on stderr.
    """
    from pt_data.stats import compute_stats, plot_lengths, render_stats

    if target == "-":
        path, _ = resolve_input(target, expected=("dataset",))
        target = str(path)
    elif not Path(target).exists():
        raise InputError(f"{target}: no such file or directory")
    result = compute_stats(
        target, overrides_of(overrides), split=split, limit=limit, skip_bad=skip_bad
    )
    lengths = result.pop("_lengths")
    render_stats(result)
    if plot is not None:
        result["plot"] = str(plot_lengths(lengths, plot, result.get("max_seq_length")))
    sys.stdout.write(json.dumps(result) + "\n")


@app.command()
def pairs(
    input: str = typer.Argument(
        ...,
        metavar="FILE|-",
        help="graded rollouts (pt-eval grade output), or - for its manifest on stdin",
    ),
    out: Path | None = typer.Option(
        None,
        "--out",
        "-o",
        help="dataset directory to write (default: beside the input, INPUT.pairs)",
    ),
    strategy: str = typer.Option(
        "one",
        "--strategy",
        help="one: a correct and an incorrect sample per prompt; all: every correct x "
        "incorrect pair (at most --k); margin: samples whose --score-key differs by --margin",
    ),
    k: int | None = typer.Option(
        None, "--k", help="all, margin: at most this many pairs per prompt (seeded sample)"
    ),
    seed: int = typer.Option(0, "--seed", help="seed of the choices (per prompt id)"),
    score_key: str | None = typer.Option(
        None,
        "--score-key",
        help="numeric column: the margin strategy's score; with one/all it fills 'margin'",
    ),
    margin: float | None = typer.Option(
        None, "--margin", help="margin: least score difference (default: any positive one)"
    ),
    skip_bad: bool = flag("--skip-bad", "skip malformed jsonl lines and count them"),
) -> None:
    """Preference pairs for on-policy DPO from graded rollouts; prints the dataset manifest.

    Correct against incorrect samples of one prompt, with the rollouts' own token ids.
    """
    from pt_data.pairs import PairOptions, write_pairs

    options = PairOptions(strategy=strategy, k=k, seed=seed, score_key=score_key, margin=margin)
    options.check()
    path, _ = resolve_input(input, expected=("grades", "rollouts", "scores"))
    fields = write_pairs(path, out, options, skip_bad=skip_bad)
    emit_manifest("dataset", fields.pop("path"), **fields)


@app.command()
def synth(
    kind: str = typer.Argument(
        ...,
        help="generator: arithmetic (sums and differences of 2-digit numbers, or --digits, "
        "worked column by column), multiplication (products answered directly), calculator (the same "
        "products solved by a call of a multiply tool: messages and tools columns)",
    ),
    n: int = typer.Option(..., "--n", help="train rows"),
    out: Path = typer.Option(..., "--out", "-o", help="directory for train.jsonl and test.jsonl"),
    seed: int = typer.Option(
        0,
        "--seed",
        help="the same seed, --n, --n-test and --digits "
        "give multiplication and calculator the same problems",
    ),
    n_test: int | None = typer.Option(None, "--n-test", help="test rows (default n/10, 50..500)"),
    digits: int | None = typer.Option(
        None,
        "--digits",
        help="digits of each number: arithmetic's terms (2), multiplication's and "
        "calculator's factors (5)",
    ),
    ops: str | None = typer.Option(
        None, "--ops", help="arithmetic's operators: +, - or +- (both, the default)"
    ),
    flawed: float | None = typer.Option(
        None,
        "--flawed",
        help="arithmetic: the share (0-1) of train problems with a carry or borrow whose "
        "worked solution forgets to pass it on (marked flawed: true; answer stays true)",
    ),
) -> None:
    """Generate a small math dataset (train.jsonl, test.jsonl; no test problem in train) a
    tiny model learns on a CPU."""
    from pt_data.synth import write_synth

    counts = write_synth(
        kind, n, out, seed=seed, n_test=n_test, digits=digits, ops=ops, flawed=flawed
    )
    emit_manifest("dataset", out, format="raw", rows=counts["train"], splits=counts)


@app.command()
def tokenizer(
    texts: list[Path] = typer.Option(
        ..., "--texts", "-t", help="row files (jsonl/json/parquet) whose text the tokenizer learns"
    ),
    out: Path = typer.Option(..., "--out", "-o", help="directory for the tokenizer files"),
    vocab_size: int = typer.Option(512, "--vocab-size", help="at most this many tokens"),
    skip_bad: bool = flag("--skip-bad", "skip malformed jsonl lines"),
) -> None:
    """Train a small byte-level BPE tokenizer with a ChatML template on local text (offline)."""
    from pt_data.tokenizer import train_tokenizer_on_rows

    tok = train_tokenizer_on_rows(texts, out, vocab_size=vocab_size, skip_bad=skip_bad)
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
        typer.echo(f"transform {name:<20} -> {t.kind or '?':<13} {doc}", err=True)


main = make_main(app)


if __name__ == "__main__":
    main()
