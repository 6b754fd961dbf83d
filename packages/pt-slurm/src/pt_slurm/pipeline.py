"""Pipelines: several stages submitted as jobs chained with ``--dependency=afterok``,
each stage taking the result (the manifest) of the stage before it.

    name: sft-recipe                # the pipeline's directory: <output_dir>/<name>
    output_dir: runs
    slurm: {time: "04:00:00"}       # defaults for every stage
    stages:
      - name: data
        stage: data                 # data | train | rollout | eval
        config: data.yaml           # the stage's own config, relative to this file
        slurm: {partition: cpu, cpus_per_task: 16}
      - name: train
        stage: train
        config: sft.yaml            # gets --data <the data stage's dataset>
        overrides: [training.learning_rate=1e-5]
        slurm: {partition: gpu, nodes: 2, gpus_per_node: 8}
      - name: eval
        stage: eval
        eval: {benchmark: math500, n: 4}   # gets --model <the train stage's checkpoint>
        slurm: {partition: gpu, gpus_per_node: 1}

A stage's run directory is ``<output_dir>/<name>/<stage name>`` (a train stage's
checkpoints included). A stage takes the result of the stage before it when that
result is what it takes (data -> train, train -> rollout/eval); ``input: <name>``
names another earlier stage, ``input: null`` none. Its ``slurm:`` keys are the
pipeline's, then those of its config file, then its own.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import ConfigDict, Field, field_validator

from pt_core.config import Section, apply_overrides, load_config, read_yaml, validate
from pt_core.errors import ConfigError
from pt_slurm.config import STAGES, RunFile, SlurmConfig, check_stage
from pt_slurm.render import INPUT_KINDS, OPTION_MAPPINGS, OUTPUT_KIND

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

StageKind = Literal["data", "train", "rollout", "eval"]  # the names in STAGES


def _plain_name(value: str) -> str:
    """Names that become directories: letters, digits, . _ - (no '/', no leading dot)."""
    if not _NAME_RE.match(value):
        raise ValueError("must be a plain directory name (letters, digits, . _ -)")
    return value


class StageSpec(Section):
    name: str
    stage: StageKind
    config: str | None = None  # the stage's config file, relative to the pipeline file
    overrides: list[str] = Field(default_factory=list)
    input: str | None = None  # an earlier stage; unset: the one before, if its result fits
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    rollout: dict[str, Any] | None = None  # the command's options (rollout/eval stages)
    eval: dict[str, Any] | None = None

    _name = field_validator("name")(classmethod(lambda cls, value: _plain_name(value)))


class PipelineFile(Section):
    name: str
    output_dir: str = "runs"
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)
    stages: list[StageSpec] = Field(min_length=1)

    _name = field_validator("name")(classmethod(lambda cls, value: _plain_name(value)))


@dataclass
class Stage:
    """One job to submit: a stage's validated keys, whole config and where it runs."""

    name: str
    stage: str
    run: RunFile
    data: dict
    run_dir: Path
    config: Path | None  # the stage's own config file (for its validation)
    overrides: list[str] = field(default_factory=list)
    input: Stage | None = None


def is_pipeline_file(path: str | Path) -> bool:
    data, _ = read_yaml(path)
    return "stages" in data


def load_pipeline(path: str | Path, overrides: list[str] | None = None) -> list[Stage]:
    """The stages of a pipeline file, each with its merged and validated config."""
    path = Path(path)
    pipe = load_config(path, overrides, PipelineFile)
    root = (Path(pipe.output_dir) / pipe.name).absolute()
    specs = [
        (spec, path.parent / spec.config if spec.config is not None else None)
        for spec in pipe.stages
    ]
    return build_stages(pipe, specs, root, source=str(path))


def stages_of_one_config(config: str | Path, overrides: list[str], kinds: list[str]) -> list[Stage]:
    """``--stage train --stage eval`` on one config: a pipeline named after its run_name."""
    from pt_slurm.config import load_run_config

    run, _data = load_run_config(config, overrides)
    for kind in kinds:
        if kind not in STAGES:
            raise ConfigError(f"unknown stage {kind!r}", hint=f"use one of {', '.join(STAGES)}")
    if len(set(kinds)) != len(kinds):
        raise ConfigError(f"--stage {' --stage '.join(kinds)}: a stage is named twice")
    pipe = PipelineFile(
        name=run.run_name,
        output_dir=run.output_dir,
        # each kind is checked against STAGES above
        stages=[
            StageSpec(name=k, stage=cast(StageKind, k), config=str(config), overrides=overrides)
            for k in kinds
        ],
    )
    specs = [(spec, Path(config)) for spec in pipe.stages]
    return build_stages(pipe, specs, run.run_dir.absolute(), source=str(config))


def build_stages(
    pipe: PipelineFile, specs: Sequence[tuple[StageSpec, Path | None]], root: Path, *, source: str
) -> list[Stage]:
    names = [spec.name for spec, _ in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"{source}: two stages share a name ({', '.join(names)})")
    stages: list[Stage] = []
    for spec, config in specs:
        where = f"{source}: stage {spec.name!r}"
        data: dict[str, Any] = {}
        if config is not None:
            data, _ = read_yaml(config)
            apply_overrides(data, list(spec.overrides))
            # the file's own slurm: keys, with its lines in the error
            load_config(config, spec.overrides, _SlurmKeys)
        elif spec.overrides:
            raise ConfigError(f"{where}: overrides without a config file")
        run_dir = root / spec.name
        slurm = _merged(
            pipe.slurm.model_dump(exclude_unset=True),
            data.get("slurm") or {},
            spec.slurm.model_dump(exclude_unset=True),
        )
        slurm.setdefault("job_name", f"{pipe.name}-{spec.name}")
        data.update(run_name=spec.name, output_dir=str(root), slurm=slurm)
        for kind in ("rollout", "eval"):
            options = getattr(spec, kind)
            if options is not None:
                data[kind] = dict(options)
        upstream = _input_of(spec, stages, where)
        if spec.stage in ("rollout", "eval") and isinstance(data.get(spec.stage), dict):
            # a stage's outputs go into its own directory unless it says otherwise
            default_out = run_dir / ("rollouts.jsonl" if spec.stage == "rollout" else "out")
            data[spec.stage].setdefault("out", str(default_out))
        data = without_other_options(spec.stage, data)
        run = validate(data, RunFile, source=where)
        check_stage(spec.stage, run, data)
        stage_overrides = [*spec.overrides, f"run_name={spec.name}", f"output_dir={root}"]
        stages.append(
            Stage(
                name=spec.name,
                stage=spec.stage,
                run=run,
                data=data,
                run_dir=run_dir,
                config=config,
                overrides=stage_overrides,
                input=upstream,
            )
        )
    return stages


def without_other_options(stage: str, data: dict) -> dict:
    """The config a stage freezes: without the option mappings of the other stages
    (``eval:`` in a train config, say), which its tool's schema does not know."""
    return {k: v for k, v in data.items() if k not in OPTION_MAPPINGS or k == stage}


def _input_of(spec: StageSpec, earlier: list[Stage], where: str) -> Stage | None:
    takes = INPUT_KINDS.get(spec.stage)
    if "input" in spec.model_fields_set:
        if spec.input is None:
            return None
        upstream = next((s for s in earlier if s.name == spec.input), None)
        if upstream is None:
            raise ConfigError(
                f"{where}: input {spec.input!r} is not a stage before it",
                hint=f"name one of: {', '.join(s.name for s in earlier) or '(none)'}",
            )
        if takes is None and upstream.run.slurm.command is None:
            raise ConfigError(f"{where}: a {spec.stage} stage takes no input", hint="drop input:")
        made = OUTPUT_KIND[upstream.stage] if upstream.run.slurm.command is None else None
        if takes is not None and made is not None and made not in takes:
            raise ConfigError(
                f"{where}: a {spec.stage} stage takes a {' or '.join(takes)}, and stage "
                f"{upstream.name!r} makes a {made}",
                hint="name another stage as input, or set input: null",
            )
        return upstream
    if not earlier or takes is None:
        return None
    previous = earlier[-1]
    if previous.run.slurm.command is None and OUTPUT_KIND[previous.stage] in takes:
        return previous
    return None


class _SlurmKeys(Section):
    """A stage config file's own ``slurm:`` section, checked with its file and lines."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)


def _merged(*layers: dict) -> dict:
    out: dict = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = _merged(out[key], value)
            else:
                out[key] = value
    return out
