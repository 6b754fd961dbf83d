"""`pt-train`: Train causal language models with DeepSpeed (SFT, DFT, ASFT, DPO, OPD, GRPO,
ORPO, KTO).

    pt-train run train.yaml training.learning_rate=1e-5 --data out/data/sft
    pt-data build data.yaml | pt-train run train.yaml --data -
    pt-train check train.yaml launcher.nproc=2
    pt-train plot runs/sft-tiny
    pt-train plot runs/sft runs/dft --out compare.png --key loss --key grad_norm
    pt-train push runs/sft-tiny --repo-id me/sft-tiny

This module only parses arguments and calls library functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import typer

from pt_core.cli import flag, make_app, make_main, split_overrides
from pt_core.errors import Interrupted, disk_full_as_error
from pt_core.log import console
from pt_core.manifest import emit_manifest, resolve_input
from pt_train import OBJECTIVES, __version__

app = make_app(
    "pt-train",
    "Train causal language models with DeepSpeed "
    f"({', '.join(name.upper() for name in OBJECTIVES)}).",
    __version__,
)


@app.command()
def run(
    config: Path = typer.Argument(..., help="Training config (YAML)."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
    data: str = typer.Option(
        None,
        "--data",
        help="Training data: a pt-data dataset, a row file (rollouts or scores for opd), or '-' "
        "for a piped manifest.",
    ),
    force_resume: bool = flag(
        "--force-resume",
        help="Resume even if keys that change training, or the data, differ.",
    ),
) -> None:
    """Train (or resume) a run; print the final inference checkpoint's manifest.

    Exits 85 after saving a checkpoint when stopped by SIGTERM/SIGUSR1 (rerun to resume),
    130 after saving one on Ctrl-C (a second Ctrl-C stops at once, without saving),
    86 when the hang watchdog (training.watchdog_minutes) ended it (stacks in RUN_DIR/hang/).
    """
    from pt_core.contracts import REQUEUE_EXIT_CODE
    from pt_train.config import check_gpus, load_train_config
    from pt_train.distributed import launched_env, spawn_local_ranks

    overrides = split_overrides(overrides)
    cfg = load_train_config(config, overrides)
    check_gpus(cfg)
    data_path = None
    if data is not None:
        data_path, _ = resolve_input(data, expected=("dataset", "rollouts", "scores", "grades"))
    if cfg.launcher.nproc > 1 and launched_env() is None:
        argv = [sys.executable, "-m", "pt_train.cli", "run", str(config), *overrides]
        if data_path is not None:
            argv += ["--data", str(data_path)]
        if force_resume:
            argv.append("--force-resume")
        code = spawn_local_ranks(cfg.launcher.nproc, argv, cfg.launcher.master_port)
        # sys.exit, not typer.Exit: click returns (rather than raises) Exit codes when
        # not standalone, and the requeue code must reach the shell.
        if code:
            sys.exit(code)
        return

    from pt_train.signals import StopRequest
    from pt_train.trainer import train

    try:
        with _stdout_to_stderr(), disk_full_as_error(cfg.run_dir):
            result = train(cfg, data_path=data_path, force_resume=force_resume)
    except KeyboardInterrupt:
        raise Interrupted(_resume_point(cfg.run_dir, "interrupted again, without saving")) from None
    if result.stopped:
        if StopRequest.last is not None and StopRequest.last.interrupted:
            raise Interrupted(_resume_point(cfg.run_dir, f"interrupted at step {result.step}"))
        sys.exit(REQUEUE_EXIT_CODE)
    env = launched_env()
    if env is None or env.rank == 0:
        assert result.inference_path is not None  # None only when stopped
        emit_manifest(
            "checkpoint",
            result.inference_path,
            run_dir=str(result.run_dir.resolve()),
            step=result.step,
            objective=cfg.objective.name,
            config_hash=_frozen_hash(result.run_dir),
        )


@app.command()
def init(
    config: Path = typer.Argument(..., help="Training config (YAML)."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
    out: Path = typer.Option(
        None, "--out", "-o", help="Directory to write (default: RUN_DIR/inference/step-0)."
    ),
) -> None:
    """Write the model a run starts from (step 0, untrained for model.init) as an inference
    checkpoint, to evaluate it beside the trained ones."""
    from pt_train.config import load_train_config
    from pt_train.model import save_initial_model

    cfg = load_train_config(config, split_overrides(overrides))
    target = out if out is not None else cfg.run_dir / "inference" / "step-0"
    with _stdout_to_stderr():
        path = save_initial_model(cfg, target)
    emit_manifest("checkpoint", path, step=0, objective=None)


@app.command()
def check(
    config: Path = typer.Argument(..., help="Training config (YAML)."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides."),
    world_size: int = typer.Option(
        None, "--world-size", min=1, help="Ranks of the whole job (default: launcher.nproc)."
    ),
    nodes: int = typer.Option(
        None,
        "--nodes",
        min=1,
        help="Nodes that each start launcher.nproc ranks (world size = nodes x launcher.nproc).",
    ),
) -> None:
    """Validate a config (and show the DeepSpeed JSON it gives) without training.

    The config alone: whether this machine has the GPUs that rollout.sleep_level,
    rollout.weight_transfer ipc or nccl and rollout.server_devices need is checked by run."""
    from pt_core.config import config_to_dict
    from pt_core.errors import InputError
    from pt_train.config import batch_layout, load_train_config
    from pt_train.trainer import deepspeed_config

    if world_size is not None and nodes is not None:
        raise InputError("--world-size and --nodes both say the world size", hint="give one")
    cfg = load_train_config(config, split_overrides(overrides))
    world = world_size or (nodes or 1) * cfg.launcher.nproc
    accum = batch_layout(cfg.training, world)
    ds = deepspeed_config(cfg, accum, cfg.training.precision == "bf16")
    result = {
        "config": config_to_dict(cfg),
        "world_size": world,
        "grad_accum": accum,
        "gradient_clipping": _gradient_clipping(cfg, ds),
        "deepspeed": ds,
    }
    # the result on stdout (for jq, pt-slurm), highlighted in a terminal
    if sys.stdout.isatty():
        from rich.console import Console

        Console().print_json(json.dumps(result))
    else:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    console.print(f"[green]ok[/green]: {config}", soft_wrap=True)


@app.command()
def plot(
    run_dirs: list[Path] = typer.Argument(
        ..., help="Run directories with metrics.jsonl (one or more)."
    ),
    out: Path = typer.Option(
        None,
        "--out",
        "-o",
        help="One figure: a panel per key, a line per run (needed for several runs).",
    ),
    keys: list[str] = typer.Option(
        None, "--key", "-k", help="metrics.jsonl key to plot (repeatable; default: loss, lr)."
    ),
    smooth: int = typer.Option(
        0, "--smooth", help="Also draw each line's running mean over this many points."
    ),
) -> None:
    """Draw metrics against step: RUN_DIR/loss.png and RUN_DIR/lr.png for one run, or one
    figure (--out) comparing several runs."""
    from pt_train.plot import DEFAULT_KEYS, plot_metrics

    for path in plot_metrics(run_dirs, out, tuple(keys or DEFAULT_KEYS), smooth):
        console.print(f"wrote {path}", soft_wrap=True)


@app.command()
def push(
    run_dir: Path = typer.Argument(..., help="Run directory (with config.yaml and inference/)."),
    repo_id: str = typer.Option(
        None,
        "--repo-id",
        help="Also upload the checkpoint to this hub repository (NAMESPACE/NAME); needs the "
        "network and a token (huggingface-cli login or HF_TOKEN).",
    ),
    private: bool = flag("--private", help="Create the hub repository private."),
    checkpoint: Path = typer.Option(
        None, "--checkpoint", help="Inference checkpoint (default: the run's last)."
    ),
) -> None:
    """Write a Hugging Face model card (README.md: base model, data, objective, resolved
    config, final metrics) into the run's inference checkpoint; upload it with --repo-id."""
    from pt_train.push import push as push_run

    card, url = push_run(run_dir, repo_id=repo_id, private=private, checkpoint=checkpoint)
    console.print(f"wrote {card}" + (f"; uploaded to {url}" if url else ""), soft_wrap=True)


def _gradient_clipping(cfg, ds: dict) -> dict:
    """The clipping that takes effect: at ZeRO stage 0 pt-train clips the gradient itself
    (to report its norm) and DeepSpeed's ``gradient_clipping`` is 0; ZeRO stages clip their
    own partitions."""
    norm = cfg.training.max_grad_norm
    if ds.get("gradient_clipping"):  # ZeRO 1-3, or set in deepspeed.raw
        return {"max_norm": ds["gradient_clipping"], "by": "DeepSpeed"}
    return {"max_norm": norm, "by": "pt-train" if norm > 0 else "off"}


def _resume_point(run_dir: Path, what: str) -> str:
    """``what`` happened; where the run goes on when the same command is run again."""
    from pt_train.checkpoint import latest_checkpoint

    latest = latest_checkpoint(run_dir)
    if latest is None:
        return f"{what}: no checkpoint saved yet; the same command starts the run afresh"
    return f"{what}: the same command resumes the run from {latest}"


def _frozen_hash(run_dir: Path) -> str:
    import yaml

    from pt_core.config import config_hash

    return config_hash(yaml.safe_load((run_dir / "config.yaml").read_text()))


@contextlib.contextmanager
def _stdout_to_stderr():
    """Keep stdout for the manifest: DeepSpeed and compiler output go to stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


_main = make_main(app)


def main() -> None:
    # The deepspeed launcher puts --local_rank=N before the command; the rank is also in
    # the LOCAL_RANK environment variable, which is what pt-train reads.
    sys.argv = [a for a in sys.argv if not a.startswith(("--local_rank=", "--local-rank="))]
    try:
        _main()
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    _exit_without_teardown(code)


def _exit_without_teardown(code: int) -> None:
    """End the process without running the C++ static destructors of torch's CUDA
    libraries: at exit they page in about 130 MB and take up to half a second, even on
    a CPU-only run (``import torch`` alone peaks at 735 MB on exit against 606 MB before
    it). Python's exit handlers run and every stream is flushed first; nothing pt-train
    writes is left open (files are written to a temporary path and renamed)."""
    import atexit
    import logging

    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
