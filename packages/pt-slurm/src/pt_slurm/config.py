"""The ``slurm:`` section of a run config, the only part pt-slurm validates itself.

pt-slurm reads the same YAML as the stage: ``run_name`` and ``output_dir`` name the
run directory, ``slurm:`` says where and how the job runs, and every other key is
passed through to the stage (and checked by the stage's own validation at submit)::

    run_name: sft-8b
    output_dir: runs
    slurm:
      partition: gpu
      nodes: 2
      gpus_per_node: 4
      time: "04:00:00"
      signal_seconds: 300        # SIGUSR1 this long before the wall time
      max_failures: 3            # consecutive real failures before giving up
      max_requeues: 50           # requeues (wall time, signals) before giving up
      env: {NCCL_DEBUG: WARN}
    model: ...                   # pt-train's keys, checked by pt-train's own schema
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pt_core.config import Section, apply_overrides, load_config, read_yaml
from pt_core.errors import ConfigError

STAGES = ("data", "train", "rollout", "eval")
LAUNCHERS = ("torchrun", "deepspeed", "accelerate", "none")

# SLURM's --time forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM_RE = re.compile(r"^\d+[KMGT]?$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WORD_RE = re.compile(r"^[^\s'\"\\`$;&|<>]+$")  # safe inside an #SBATCH line unquoted
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.,:&|!*\[\]()-]+$")  # SLURM's feature expressions
# An absolute path whose $VAR / ${VAR:-default} parts expand on the node.
_NODE_PATH_RE = re.compile(r"^(/|\$)[A-Za-z0-9_./@+=,:{}$-]*$")
_RELATIVE_FILE_RE = re.compile(r"^[A-Za-z0-9_.@+=,-][A-Za-z0-9_./@+=,-]*$")


# #SBATCH options the job script depends on, so extra_sbatch may not change them.
_SBATCH_OWN = {
    **dict.fromkeys(("--output", "-o", "--error", "-e"), "the job reads its own log"),
    **dict.fromkeys(("--open-mode",), "a requeued job appends to its logs"),
    **dict.fromkeys(("--chdir", "-D"), "the working directory of submit"),
    **dict.fromkeys(("--requeue", "--no-requeue"), "the job requeues itself"),
    **dict.fromkeys(("--signal",), "slurm.signal_seconds"),
    **dict.fromkeys(("--nodes", "-N"), "slurm.nodes"),
    **dict.fromkeys(("--ntasks-per-node", "--ntasks", "-n"), "one task per node"),
    **dict.fromkeys(("--dependency", "-d"), "pipelines chain their stages"),
    **dict.fromkeys(("--job-name", "-J"), "slurm.job_name"),
}


def time_limit_seconds(text: str) -> int:
    """Seconds in a SLURM time limit ("30" minutes, "04:00:00", "1-12:00")."""
    m = _TIME_RE.match(text.strip())
    if not m:
        raise ValueError(
            f"{text!r} is not a SLURM time limit; use minutes, MM:SS, HH:MM:SS, D-HH, "
            "D-HH:MM or D-HH:MM:SS"
        )
    days, a, b, c = m.groups()
    fields = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-H[:M[:S]]
        hours, minutes, seconds = (fields + [0, 0])[:3]
        return ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    if len(fields) == 1:  # M
        return fields[0] * 60
    if len(fields) == 2:  # M:S
        return fields[0] * 60 + fields[1]
    hours, minutes, seconds = fields
    return (hours * 60 + minutes) * 60 + seconds


class ContainerConfig(Section):
    """Run the stage in a container: Apptainer/Singularity (``<runtime> exec``) or
    enroot through the pyxis SPANK plugin (``srun --container-image``). The run
    directory and the working directory are bound at the same paths automatically."""

    image: str
    runtime: Literal["apptainer", "singularity", "pyxis"] = "apptainer"
    binds: list[str] = Field(default_factory=list)  # "src[:dst[:flags]]"
    options: list[str] = Field(default_factory=list)  # extra words for `exec` / srun
    # How Apptainer passes GPUs in: --nv (NVIDIA), --rocm (AMD, e.g. LUMI), or none.
    # (pyxis does this through enroot's hooks.)
    gpu: Literal["nv", "rocm", "none"] = "nv"

    @field_validator("binds")
    @classmethod
    def _binds(cls, value: list[str]) -> list[str]:
        for bind in value:
            if not bind or "," in bind or any(c.isspace() for c in bind):
                raise ValueError(
                    f"{bind!r}: give one bind per item, as src[:dst[:flags]] without "
                    "spaces or commas"
                )
        return value


class SlurmConfig(Section):
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nodes: int = Field(default=1, gt=0)
    gpus_per_node: int = Field(default=0, ge=0)
    # ranks per node; default gpus_per_node or 1
    procs_per_node: int | None = Field(default=None, gt=0)
    cpus_per_task: int | None = Field(default=None, gt=0)  # one task per node, so: CPUs per node
    mem: str | None = None  # per node, e.g. "64G"; "0" asks for all of it
    time: str | None = None  # wall time, e.g. "04:00:00"
    constraint: str | None = None  # node features, e.g. "a100" or "a100&ib"
    exclusive: bool = False  # whole nodes, shared with no other job
    job_name: str | None = None  # default: run_name
    modules: list[str] = Field(default_factory=list)  # `module load` before the stage
    env: dict[str, str | int | float | bool] = Field(default_factory=dict)
    env_file: str | None = None  # KEY=value lines, sourced with `set -a`
    setup: list[str] = Field(default_factory=list)  # shell lines run before the stage
    python_env: str | None = None  # venv (or its bin/) with the pt commands; default: this one
    container: ContainerConfig | None = None
    extra_sbatch: list[str] = Field(default_factory=list)  # e.g. "--reservation=x"
    signal_seconds: int = Field(default=120, gt=0, le=65535)
    # How long torchrun waits for the other ranks once one has ended before it kills
    # them (TORCH_ELASTIC_SHUTDOWN_TIMEOUT): ranks that save together end together, and
    # after a hang this is what the hung ranks get, not signal_seconds.
    shutdown_seconds: int = Field(default=60, gt=0)
    # Compute nodes without internet: HF_HUB_OFFLINE=1, so that no rank downloads a
    # model (put it in the HF cache first); false for a stage that must download.
    hf_offline: bool = True
    # Node-local scratch for compiled artefacts (TORCH_EXTENSIONS_DIR, TRITON_CACHE_DIR,
    # HF_MODULES_CACHE), e.g. /local/pt-$USER: a build lock left on a shared filesystem
    # by a killed run would hang every retry. $VARS expand on the node. Unset, those
    # variables stay as the environment has them (a directory per job would rebuild
    # every extension at every start).
    node_cache: str | None = None
    max_failures: int = Field(default=3, gt=0)
    max_requeues: int = Field(default=50, ge=0)
    # A file in the run dir that changes when the stage saves progress (pt-train:
    # checkpoints/latest). A requeue asked for while it has not changed since the run
    # started is counted as a failure.
    progress: str | None = None
    # When the stage has finished: when it printed its manifest (pt stages), or when
    # it exited 0 (default for slurm.command).
    completion: Literal["manifest", "exit_code"] | None = None
    launcher: Literal["torchrun", "deepspeed", "accelerate", "none"] | None = None
    command: str | None = None  # replaces the stage's command; {config}, {input}

    @field_validator("partition", "account", "qos", "job_name", "mem", "time")
    @classmethod
    def _one_word(cls, value: str | None) -> str | None:
        if value is not None and not _WORD_RE.match(value):
            raise ValueError(f"{value!r} must be one word without quotes or shell characters")
        return value

    @field_validator("constraint")
    @classmethod
    def _constraint(cls, value: str | None) -> str | None:
        if value is not None and not _CONSTRAINT_RE.match(value):
            raise ValueError(
                f"{value!r} is not a SLURM feature expression (features joined by & | , "
                "without spaces or quotes)"
            )
        return value

    @field_validator("node_cache")
    @classmethod
    def _node_cache(cls, value: str | None) -> str | None:
        if value is not None and not _NODE_PATH_RE.match(value):
            raise ValueError(
                f"{value!r}: give an absolute path, $VARS allowed, without spaces, quotes "
                "or other shell characters, e.g. /local/scratch/pt-$SLURM_JOB_ID"
            )
        return value

    @field_validator("progress")
    @classmethod
    def _progress(cls, value: str | None) -> str | None:
        if value is not None and (not _RELATIVE_FILE_RE.match(value) or ".." in Path(value).parts):
            raise ValueError(
                f"{value!r}: give a path inside the run directory (relative, no '..', "
                "no spaces), e.g. checkpoints/latest"
            )
        return value

    @field_validator("mem", "time", mode="before")
    @classmethod
    def _number_as_text(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("mem")
    @classmethod
    def _mem(cls, value: str | None) -> str | None:
        if value is not None and not _MEM_RE.match(value):
            raise ValueError(f"{value!r} is not a SLURM memory size; use e.g. 64G, 500M or 0")
        return value

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            time_limit_seconds(value)
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict) -> dict:
        bad = [k for k in value if not _ENV_NAME_RE.match(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(bad)}")
        return value

    @field_validator("extra_sbatch")
    @classmethod
    def _sbatch_lines(cls, value: list[str]) -> list[str]:
        for line in value:
            if not line.startswith("-") or "\n" in line:
                raise ValueError(
                    f"{line!r}: give each extra #SBATCH line as one option, e.g. '--reservation=x'"
                )
            option = re.split(r"[=\s]", line, maxsplit=1)[0]
            if option in _SBATCH_OWN:
                raise ValueError(
                    f"{line!r}: pt-slurm sets {option} itself ({_SBATCH_OWN[option]}); "
                    "use the slurm: keys"
                )
        return value

    @model_validator(mode="after")
    def _signal_before_wall_time(self):
        if self.time is not None and self.signal_seconds >= time_limit_seconds(self.time):
            raise ValueError(
                f"signal_seconds={self.signal_seconds} is not shorter than time={self.time!r}: "
                "the job would be signalled before it starts; lower signal_seconds"
            )
        return self

    @property
    def ranks_per_node(self) -> int:
        return self.procs_per_node or self.gpus_per_node or 1


class RunFile(Section):
    """The keys pt-slurm reads; the rest of the file belongs to the stage."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    run_name: str
    output_dir: str = "runs"
    slurm: SlurmConfig = Field(default_factory=SlurmConfig)

    @field_validator("run_name")
    @classmethod
    def _run_name(cls, value: str) -> str:
        if not value or "/" in value or value in (".", ".."):
            raise ValueError("run_name must be a plain directory name, without '/'")
        return value

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


def load_run_config(
    path: str | Path, overrides: list[str] | None = None
) -> tuple[RunFile, dict[str, Any]]:
    """The validated run keys and the whole config after overrides (to freeze as is)."""
    run = load_config(path, overrides, RunFile)
    data, _lines = read_yaml(path)
    apply_overrides(data, list(overrides or []))
    return run, data


def check_stage(stage: str, run: RunFile, data: dict) -> None:
    """The stage exists, and a stage that takes its options from a mapping has it."""
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}", hint=f"use one of {', '.join(STAGES)}")
    if (
        stage in ("rollout", "eval")
        and run.slurm.command is None
        and not isinstance(data.get(stage), dict)
    ):
        raise ConfigError(
            f"--stage {stage} needs a top-level '{stage}:' mapping of the command's "
            "options (or slurm.command)",
            hint=f"e.g. {stage}: {{model: runs/sft/inference/step-100, prompts: data/p.jsonl}}",
        )
    if stage == "data" and run.slurm.command is None and not isinstance(data.get("data"), dict):
        raise ConfigError(
            "--stage data runs `pt-data build` on this file, which needs its 'data:' section",
            hint="see docs/pt-data.md for the data: section",
        )
