"""One sbatch script per run, from the ``slurm:`` section and the stage.

Every node runs one task (``srun --ntasks-per-node=1``); in it the launcher
(torchrun, deepspeed or accelerate) starts the node's ranks and meets the other
nodes at ``MASTER_ADDR`` (the first host of the allocation) on a port derived
from the job id. The script forwards SLURM's early signal to the ranks and books
the outcome in ``slurm/state.json`` before it requeues itself (see state.py).
"""

from __future__ import annotations

import shlex
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_slurm import __version__
from pt_slurm.config import RunFile, SlurmConfig

CONFIG_WORD = "{config}"
_CONFIG_REF = '"$PT_CONFIG"'

STAGE_COMMANDS = {
    "train": ("pt-train", ["run"]),
    "rollout": ("pt-rollout", ["generate"]),
    "eval": ("pt-eval", ["run"]),
}
_IGNORE_USR1 = 'trap "" USR1; exec "$@"'
DEFAULT_LAUNCHER = {"train": "torchrun", "rollout": "none", "eval": "none"}


def quote(value: Any) -> str:
    return shlex.quote(str(value))


def python_bindir(slurm: SlurmConfig) -> str | None:
    """Where the job finds the pt commands: ``python_env`` (a venv or its bin/), else the
    environment running pt-slurm now; inside a container, the container's PATH."""
    if slurm.python_env is not None:
        env = Path(slurm.python_env)
        return str(env if env.name == "bin" else env / "bin")
    if slurm.container is not None:
        return None
    return str(Path(sys.executable).parent)


def _tool(bindir: str | None, name: str) -> str:
    return quote(f"{bindir}/{name}" if bindir else name)


def _word(word: str) -> str:
    """Quote one word of a command, letting ``{config}`` become the frozen config's path."""
    if CONFIG_WORD not in word:
        return quote(word)
    parts = word.split(CONFIG_WORD)
    return _CONFIG_REF.join(quote(p) if p else "" for p in parts)


def _flags(options: dict[str, Any]) -> list[str]:
    """``{n: 8, stop: [a, b], logprobs: true}`` -> ``--n 8 --stop a --stop b --logprobs``."""
    words: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, str(value)]
    return words


def stage_command(stage: str, run: RunFile, data: dict, bindir: str | None) -> str:
    """The stage's command line, as shell words (the same on every rank)."""
    if run.slurm.command is not None:
        return " ".join(_word(w) for w in shlex.split(run.slurm.command))
    tool, sub = STAGE_COMMANDS[stage]
    if stage == "train":
        return " ".join([_tool(bindir, tool), *sub, _CONFIG_REF])
    return " ".join([_tool(bindir, tool), *sub, *(_word(w) for w in _flags(data[stage]))])


def launcher_words(launcher: str, slurm: SlurmConfig, bindir: str | None) -> list[str]:
    """The launcher's command line on each node; "$VAR"s are expanded on that node."""
    nodes, ranks = slurm.nodes, slurm.ranks_per_node
    if launcher == "torchrun":
        return [
            _tool(bindir, "torchrun"),
            f"--nnodes={nodes}",
            f"--nproc-per-node={ranks}",
            "--rdzv-backend=c10d",
            '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
            '--rdzv-id="$SLURM_JOB_ID"',
            "--no-python",
        ]
    if launcher == "deepspeed":
        return [
            _tool(bindir, "deepspeed"),
            '--hostfile="$PT_HOSTFILE"',
            "--no_ssh",
            '--node_rank="$SLURM_NODEID"',
            '--master_addr="$MASTER_ADDR"',
            '--master_port="$MASTER_PORT"',
            f"--num_nodes={nodes}",
            f"--num_gpus={ranks}",
            "--no_python",
            "--no_local_rank",
        ]
    if launcher == "accelerate":
        words = [
            _tool(bindir, "accelerate"),
            "launch",
            f"--num_machines={nodes}",
            f"--num_processes={nodes * ranks}",
            '--machine_rank="$SLURM_NODEID"',
            '--main_process_ip="$MASTER_ADDR"',
            '--main_process_port="$MASTER_PORT"',
            "--rdzv_backend=c10d",
            "--same_network",
        ]
        if slurm.gpus_per_node and nodes * ranks > 1:
            words.append("--multi_gpu")
        return [*words, "--no_python"]
    assert launcher == "none", launcher
    return []


def container_words(slurm: SlurmConfig) -> list[str]:
    c = slurm.container
    if c is None:
        return []
    words = [c.runtime, "exec"]
    if slurm.gpus_per_node:
        words.append("--nv")
    if c.binds:
        words += ["--bind", quote(",".join(c.binds))]
    return [*words, *(quote(o) for o in c.options), quote(c.image)]


def node_command(stage: str, run: RunFile, data: dict) -> str:
    slurm = run.slurm
    bindir = python_bindir(slurm)
    launcher = slurm.launcher or DEFAULT_LAUNCHER[stage]
    words = [*launcher_words(launcher, slurm, bindir), stage_command(stage, run, data, bindir)]
    if slurm.container is not None:
        # The runtime's own signal handling does not keep USR1 ignored for what it
        # starts, so the launcher inside ignores it again before it execs.
        words = [*container_words(slurm), "bash", "-c", quote(_IGNORE_USR1), "pt-node", *words]
    return " ".join(words)


@cache
def _template() -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pt_slurm", "templates"),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = quote
    env.globals["q"] = quote
    return env.get_template("job.sh.j2")


def render_script(run: RunFile, data: dict, *, stage: str, run_dir: Path, workdir: Path) -> str:
    """The sbatch script for ``stage`` of the run in ``run_dir`` (absolute paths)."""
    slurm = run.slurm
    launcher = slurm.launcher or DEFAULT_LAUNCHER[stage]
    env = {key: _env_value(value) for key, value in slurm.env.items()}
    return _template().render(
        s=slurm,
        stage=stage,
        version=__version__,
        run_dir=str(run_dir),
        slurm_dir=str(run_dir / "slurm"),
        workdir=str(workdir),
        job_name=slurm.job_name or run.run_name,
        python=sys.executable,
        bindir=python_bindir(slurm),
        env=sorted(env.items()),
        launcher=launcher,
        ranks=slurm.ranks_per_node,
        requeue_code=REQUEUE_EXIT_CODE,
        node_command=node_command(stage, run, data),
    )


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
