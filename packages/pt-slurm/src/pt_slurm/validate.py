"""Check a stage's own config at submit, so that a mistake that would fail on every
retry is refused before ``sbatch`` instead of failing ``max_failures`` times on the nodes.

* train: ``pt-train check`` of the job's environment (its ``python_env``, else the one
  running pt-slurm, else PATH) at the job's world size: the schema and the batch layout.
* data: ``pt-data check`` of the same environment: the schema and the transforms.
* rollout, eval: the option mapping, parsed by the command's own option parser.

The stage's tool is the one judge of its config: pt-slurm imports neither pt_train nor
pt_data. Each returns one line saying what was checked (or why nothing could be).
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pt_core.errors import ConfigError
from pt_slurm.config import RunFile
from pt_slurm.render import (
    DEFAULT_LAUNCHER,
    INPUT_FLAG,
    OPTION_MAPPINGS,
    python_bindir,
    stage_flags,
)

_CLI_MODULES = {"rollout": ("pt_rollout.cli", "generate"), "eval": ("pt_eval.cli", "run")}


def validate_stage(
    stage: str,
    run: RunFile,
    data: dict,
    *,
    config: Path | None,
    overrides: list[str],
    has_input: bool,
) -> str:
    """Raise :class:`ConfigError` for a stage config that cannot run; else say what was checked."""
    if run.slurm.command is not None:
        return "slurm.command: the command's own config is not checked"
    if stage == "train":
        return _validate_train(run, config, overrides)
    if stage == "data":
        return _validate_data(run, config, overrides)
    return _validate_flags(stage, data[stage], has_input=has_input)


def job_world_size(run: RunFile, nproc: int = 1) -> tuple[int, str]:
    """Ranks of the whole job, and how that number comes about."""
    slurm = run.slurm
    launcher = slurm.launcher or DEFAULT_LAUNCHER["train"]
    if launcher == "none":  # pt-train starts launcher.nproc ranks on each node itself
        return slurm.nodes * nproc, f"{slurm.nodes} node(s) x launcher.nproc={nproc}"
    ranks = slurm.ranks_per_node
    return slurm.nodes * ranks, f"{slurm.nodes} node(s) x {ranks} rank(s)"


def _validate_train(run: RunFile, config: Path | None, overrides: list[str]) -> str:
    if config is None:
        raise ConfigError("a train stage needs a config file (its `config:` key)")
    launcher = run.slurm.launcher or DEFAULT_LAUNCHER["train"]
    if launcher == "none":  # pt-train starts launcher.nproc ranks on each node itself
        size = ["--nodes", str(run.slurm.nodes)]
        at = f"{run.slurm.nodes} node(s) x launcher.nproc"
    else:
        world, how = job_world_size(run)
        size = ["--world-size", str(world)]
        at = f"{world} ({how})"
    report = _run_check(
        "pt-train",
        run,
        config,
        [*overrides, *size],
        f"at the job's world size {at}",
        reads=("config.launcher.nproc", "grad_accum"),
    )
    if isinstance(report, str):
        return report
    tool, result = report
    nproc = result["config"]["launcher"]["nproc"]
    world, how = job_world_size(run, nproc)
    return (
        f"pt-train config checked at world size {world} ({how}): "
        f"{result['grad_accum']} accumulation step(s), by {tool} check"
    )


def _validate_data(run: RunFile, config: Path | None, overrides: list[str]) -> str:
    if config is None:
        raise ConfigError("a data stage needs a config file with a data: section (`config:`)")
    data_overrides = [o for o in overrides if o.startswith("data.")]
    report = _run_check("pt-data", run, config, data_overrides, "", reads=("datasets",))
    if isinstance(report, str):
        return report
    tool, result = report
    return f"pt-data config checked: {result['datasets']} dataset(s), by {tool} check"


def _check_command(run: RunFile, name: str) -> Path | None:
    """The job's own ``name`` command: in its environment's bin/, else beside the Python
    running pt-slurm, else on PATH."""
    bindir = python_bindir(run.slurm)
    candidates = [Path(bindir, name)] if bindir else []
    candidates.append(Path(sys.executable).with_name(name))
    found = shutil.which(name)
    candidates += [Path(found)] if found else []
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


def _run_check(
    name: str, run: RunFile, config: Path, args: list[str], where: str, *, reads: tuple[str, ...]
) -> tuple[Path, dict] | str:
    """Run ``name check CONFIG ARGS`` as the job would; its JSON result, which holds the
    dotted keys ``reads``, or (when no such command is found) one line saying the config
    was not checked. A config the command refuses is one :class:`ConfigError` with its own
    words, naming ``config``; a command that answers with anything but such a result (an
    older or a foreign one) is one too."""
    tool = _check_command(run, name)
    if tool is None:
        place = python_bindir(run.slurm) or "the container"
        return f"not checked: no {name} command was found in {place}, beside pt-slurm or on PATH"
    with _without_option_mappings(config) as readable:
        proc = subprocess.run(
            [str(tool), "check", str(readable), *args],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "400", "NO_COLOR": "1"},
        )
    said = [
        line.strip().replace(str(readable), str(config))
        for line in proc.stderr.splitlines()
        if line.strip()
    ]
    if proc.returncode != 0:
        words = " ".join(said[-3:] or [f"exit {proc.returncode}"])
        raise ConfigError(
            f"`{name} check`{' ' + where if where else ''} refused the config: {words}"
        )
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result = None
    if not isinstance(result, dict) or not all(_holds(result, key) for key in reads):
        printed = " ".join(proc.stdout.split())
        printed = printed[:117] + "..." if len(printed) > 120 else printed or "nothing"
        raise ConfigError(
            f"`{tool} check {config}` printed no {name} check result (it printed: {printed})",
            hint=f"is {tool} the {name} of this pt-slurm's version? Install this pt in the "
            "job's environment, or point slurm.python_env at one that has it",
        )
    return tool, result


def _holds(result: Any, dotted: str) -> bool:
    """Whether the JSON ``result`` has the mapping keys ``dotted`` (``config.launcher.nproc``)."""
    for key in dotted.split("."):
        if not isinstance(result, dict) or key not in result:
            return False
        result = result[key]
    return True


@contextlib.contextmanager
def _without_option_mappings(config: Path) -> Iterator[Path]:
    """``config``, or where it holds the ``rollout:``/``eval:`` option mappings of other
    stages (which pt-train's schema does not know), a copy with their lines blanked, so
    that every other key keeps its line for the error messages."""
    text = config.read_text(encoding="utf-8")
    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        root = None  # the stage's own loader reports it
    blank = set()
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value in OPTION_MAPPINGS:
                end = value.end_mark
                blank |= set(range(key.start_mark.line, end.line + (1 if end.column else 0)))
    if not blank:
        yield config
        return
    lines = text.splitlines(keepends=True)
    kept = "".join("\n" if i in blank else line for i, line in enumerate(lines))
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / config.name
        copy.write_text(kept, encoding="utf-8")
        yield copy


def _validate_flags(stage: str, options: dict[str, Any], *, has_input: bool) -> str:
    """Parse the stage's options as its command line would, without running it."""
    module_name, command_name = _CLI_MODULES[stage]
    flag = INPUT_FLAG[stage]
    if has_input and flag.removeprefix("--").replace("-", "_") in options:
        raise ConfigError(
            f"{stage}.{flag.removeprefix('--')} is given, but the stage takes it from the "
            "stage before it",
            hint=f"drop {stage}.{flag.removeprefix('--')}, or set `input: null` on the stage",
        )
    try:
        import typer

        module = importlib.import_module(module_name)
    except ImportError:
        return f"not checked: {module_name} is not importable here"
    group = typer.main.get_command(module.app)
    command = getattr(group, "commands", {}).get(command_name, group)
    tool = f"{module_name.split('.')[0].replace('_', '-')} {command_name}"
    known = [o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    for key in options:
        # by name first: a false or null value leaves the flag out of the command line
        name = "--" + str(key).replace("_", "-")
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise ConfigError(
                f"{stage}.{key}: `{tool}` has no option {name}",
                hint=f"did you mean {close[0]}?" if close else f"`{tool} --help` lists its options",
            )
    args = stage_flags(options) + ([flag, "<from the stage before>"] if has_input else [])
    try:
        command.make_context(f"{stage} stage", args)
    except Exception as exc:
        # the usage errors of the click that typer carries (its own copy of click)
        format_message = getattr(exc, "format_message", None)
        if not callable(format_message):
            raise
        raise ConfigError(
            f"the {stage}: options do not parse as `{tool}` options: {format_message()}",
            hint=f"`{tool} --help` lists its options and their types",
        ) from None
    return f"{stage} options parsed by {tool}"
