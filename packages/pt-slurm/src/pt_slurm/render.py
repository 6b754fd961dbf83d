"""One sbatch script per run (or per stage of a pipeline), from the ``slurm:`` section.

Every node runs one task (``srun --ntasks-per-node=1``); in it the launcher
(torchrun, deepspeed or accelerate) starts the node's ranks and meets the other
nodes at ``MASTER_ADDR`` (the first host of the allocation) on a port derived
from the job id. The script forwards SLURM's early signal to the ranks and books
every start and end in ``slurm/events.jsonl`` with shell code alone
(``templates/bookkeeping.sh``), then finishes, requeues itself or stops.
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
from pt_slurm.config import ContainerConfig, RunFile, SlurmConfig

CONFIG_WORD = "{config}"
INPUT_WORD = "{input}"
_WORD_REFS = {CONFIG_WORD: '"$PT_CONFIG"', INPUT_WORD: '"$PT_INPUT"'}

STAGE_COMMANDS = {
    "data": ("pt-data", ["build"]),
    "train": ("pt-train", ["run"]),
    "rollout": ("pt-rollout", ["generate"]),
    "eval": ("pt-eval", ["run"]),
}
DEFAULT_LAUNCHER = {"data": "none", "train": "torchrun", "rollout": "none", "eval": "none"}
# The flag through which a stage takes its upstream stage's result, and the manifest
# kinds it accepts there.
INPUT_FLAG = {"train": "--data", "rollout": "--model", "eval": "--model"}
INPUT_KINDS = {"train": ("dataset",), "rollout": ("checkpoint",), "eval": ("checkpoint",)}
OUTPUT_KIND = {"data": "dataset", "train": "checkpoint", "rollout": "rollouts", "eval": "grades"}
# The sections that hold a rollout or eval stage's options: pt-slurm's, not a stage
# tool's, so the other stages' frozen configs go without them.
OPTION_MAPPINGS = ("rollout", "eval")
# pt-train replaces checkpoints/latest only once a checkpoint is complete.
DEFAULT_PROGRESS = {"train": "checkpoints/latest"}
_IGNORE_USR1 = 'trap "" USR1; exec "$@"'
# pt-train's exit code when its hang watchdog ended the run (pt_train.watchdog).
HANG_EXIT_CODE = 86
# A launcher reports a rank's exit 85 or 86 as its own failure (torchrun: exit 1), so
# each rank runs under this wrapper, which leaves the code it exited with in a file the
# job script reads (``INTENT_FILE``). A TERM handler keeps the wrapper alive until the
# rank it waits for has ended (the launcher signals the whole process group).
INTENT_FILE = "$PT_SLURM_DIR/exit-intent-$SLURM_JOB_ID-$SLURM_RESTART_COUNT"
_KEEP_EXIT_INTENT = (
    'trap : TERM; "$@"; code=$?; '
    f"case $code in {REQUEUE_EXIT_CODE}|{HANG_EXIT_CODE}) "
    f'echo "$code" >>"{INTENT_FILE}" ;; esac; exit "$code"'
)


def quote(value: Any) -> str:
    return shlex.quote(str(value))


def double_quote(value: Any) -> str:
    """``value`` in double quotes, nothing in it expanded: for text kept in a variable."""
    text = str(value)
    for char in ("\\", '"', "$", "`"):
        text = text.replace(char, "\\" + char)
    return f'"{text}"'


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
    """Quote one word of a command, letting ``{config}`` and ``{input}`` become the frozen
    config's path and the upstream stage's result."""
    out, rest = "", word
    while rest:
        hits = [(rest.find(ref), ref) for ref in _WORD_REFS if ref in rest]
        if not hits:
            return out + quote(rest)
        at, ref = min(hits)
        out += (quote(rest[:at]) if at else "") + _WORD_REFS[ref]
        rest = rest[at + len(ref) :]
    return out


def stage_flags(options: dict[str, Any]) -> list[str]:
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


def stage_command(
    stage: str, run: RunFile, data: dict, bindir: str | None, *, has_input: bool = False
) -> str:
    """The stage's command line, as shell words (the same on every rank)."""
    if run.slurm.command is not None:
        return " ".join(_word(w) for w in shlex.split(run.slurm.command))
    tool, sub = STAGE_COMMANDS[stage]
    words = [_tool(bindir, tool), *sub]
    if stage in ("data", "train"):
        words.append(_WORD_REFS[CONFIG_WORD])
        if stage == "data" and run.slurm.nodes > 1:
            # a shard of the build on each node; the last to finish assembles the dataset
            # and prints its manifest
            words += ["--shard", '"$SLURM_PROCID/$SLURM_NTASKS"']
    else:
        words += [_word(w) for w in stage_flags(data[stage])]
    if has_input:
        words += [INPUT_FLAG[stage], _WORD_REFS[INPUT_WORD]]
    return " ".join(words)


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
            # one log per rank (stdout.log, stderr.log), and the same lines, prefixed
            # with the rank, in the job's log
            '--log-dir="$PT_SLURM_DIR/ranks/$SLURM_JOB_ID-$SLURM_RESTART_COUNT/node-$SLURM_NODEID"',
            "--redirects=3",
            "--tee=3",
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


def _paths_to_bind(container: ContainerConfig, run_dir: Path, workdir: Path) -> list[str]:
    """The run dir and the working dir (same path inside), then the configured binds."""
    out: list[str] = []
    for bind in [str(run_dir), str(workdir), *container.binds]:
        if bind not in out:
            out.append(bind)
    return out


def container_words(slurm: SlurmConfig, run_dir: Path, workdir: Path) -> list[str]:
    """``apptainer exec ...`` before the node's command (Apptainer and Singularity)."""
    c = slurm.container
    if c is None or c.runtime == "pyxis":
        return []
    words = [c.runtime, "exec"]
    if slurm.gpus_per_node and c.gpu != "none":
        words.append(f"--{c.gpu}")
    words += ["--bind", quote(",".join(_paths_to_bind(c, run_dir, workdir)))]
    if slurm.env_file:
        words += ["--env-file", quote(slurm.env_file)]  # kept under --cleanenv too
    return [*words, *(quote(o) for o in c.options), quote(c.image)]


def srun_container_words(slurm: SlurmConfig, run_dir: Path, workdir: Path) -> list[str]:
    """pyxis's srun options: the step runs in the enroot container of ``image``."""
    c = slurm.container
    if c is None or c.runtime != "pyxis":
        return []
    mounts = [b if ":" in b else f"{b}:{b}" for b in _paths_to_bind(c, run_dir, workdir)]
    image = (
        '--container-image="$PT_IMAGE"'
        if pyxis_import(slurm)
        else quote(f"--container-image={c.image}")
    )
    return [
        image,
        quote(f"--container-mounts={','.join(mounts)}"),
        quote(f"--container-workdir={workdir}"),
        *(quote(o) for o in c.options),
    ]


def node_command(
    stage: str, run: RunFile, data: dict, *, run_dir: Path, workdir: Path, has_input: bool
) -> str:
    slurm = run.slurm
    bindir = python_bindir(slurm)
    launcher = slurm.launcher or DEFAULT_LAUNCHER[stage]
    command = stage_command(stage, run, data, bindir, has_input=has_input)
    if launcher != "none":
        command = f"bash -c {quote(_KEEP_EXIT_INTENT)} pt-rank {command}"
    words = [*launcher_words(launcher, slurm, bindir), command]
    runtime_words = container_words(slurm, run_dir, workdir)
    if runtime_words:
        # The runtime's own signal handling does not keep USR1 ignored for what it
        # starts, so the launcher inside ignores it again before it execs.
        words = [*runtime_words, "bash", "-c", quote(_IGNORE_USR1), "pt-node", *words]
    return " ".join(words)


# Where the module system's shell init usually lives: a batch shell is not a login shell,
# so `module` is often undefined in it.
MODULE_INITS = (
    '"${MODULESHOME:-/usr/share/Modules}/init/bash"',
    "/usr/share/lmod/lmod/init/bash",
    "/etc/profile.d/lmod.sh",
    "/etc/profile.d/modules.sh",
)
# The variables the node's command needs inside an Apptainer container started with
# --cleanenv, which passes only APPTAINERENV_<NAME> (SINGULARITYENV_<NAME>) in.
CONTAINER_ENV = (
    "PT_CONFIG",
    "PT_SLURM_DIR",
    "PT_INPUT",
    "PT_INPUT_MANIFEST",
    "PT_HOSTFILE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODEID",
    "SLURM_RESTART_COUNT",
    "TORCH_ELASTIC_SHUTDOWN_TIMEOUT",
    "HF_HUB_OFFLINE",
    "TORCH_EXTENSIONS_DIR",
    "TRITON_CACHE_DIR",
    "HF_MODULES_CACHE",
)
NODE_CACHES = {
    "TORCH_EXTENSIONS_DIR": "torch_extensions",
    "TRITON_CACHE_DIR": "triton",
    "HF_MODULES_CACHE": "hf_modules",
}


def container_env(slurm: SlurmConfig) -> list[str]:
    """The variables to pass into an Apptainer/Singularity container by name (none for
    pyxis, whose containers get the step's environment)."""
    if slurm.container is None or slurm.container.runtime == "pyxis":
        return []
    return [*CONTAINER_ENV, *(k for k in sorted(slurm.env) if k not in CONTAINER_ENV)]


def pyxis_import(slurm: SlurmConfig) -> bool:
    """A pyxis image named by a registry (not a squashfs file) is imported once per job
    into the run's slurm/ directory, not by every srun of every requeue."""
    c = slurm.container
    return (
        c is not None
        and c.runtime == "pyxis"
        and not c.image.startswith("/")
        and not c.image.endswith(".sqsh")
    )


def setup_items(
    slurm: SlurmConfig, input_manifest: Path | None, input_stage: str | None
) -> list[tuple[str, str]]:
    """(what the log names if it fails, the shell lines) for each piece of the setup, in
    order; each piece books its own failure (``pt_setup_failed``)."""
    items = []
    if slurm.hf_offline:
        items.append(("export HF_HUB_OFFLINE=1", "export HF_HUB_OFFLINE=1"))
    if slurm.node_cache:
        exports = " ".join(f'{k}="$PT_NODE_CACHE/{v}"' for k, v in NODE_CACHES.items())
        items.append(
            (
                f"export {' '.join(NODE_CACHES)} (slurm.node_cache)",
                f'PT_NODE_CACHE="{slurm.node_cache}"\nexport {exports}',
            )
        )
    if input_manifest is not None:
        items.append(
            (
                f"read the manifest of stage {input_stage} ({input_manifest})",
                f"pt_read_input {quote(input_manifest)} || pt_setup_failed 1\n"
                f"export PT_INPUT PT_INPUT_MANIFEST={quote(input_manifest)}",
            )
        )
    bindir = python_bindir(slurm)
    if bindir:
        items.append((f"PATH += {bindir}", f'export PATH={quote(bindir)}:"$PATH"'))
    if slurm.modules:
        load = "module load " + " ".join(quote(m) for m in slurm.modules)
        find_init = (
            "if ! command -v module >/dev/null 2>&1; then\n"
            f"    for init in {' '.join(MODULE_INITS)}; do\n"
            '        if [ -f "$init" ]; then\n'
            "            set +u  # the module systems' init scripts read unset variables\n"
            "            # shellcheck source=/dev/null\n"
            '            source "$init"\n'
            "            set -u\n"
            "            break\n"
            "        fi\n"
            "    done\n"
            "fi\n"
        )
        items.append((load, f"{find_init}{load} || pt_setup_failed"))
    if slurm.env_file:
        items.append(
            (
                f"source {slurm.env_file}",
                "set -a\n# shellcheck source=/dev/null\n"
                f"source {quote(slurm.env_file)} || pt_setup_failed\nset +a",
            )
        )
    for key, value in sorted(slurm.env.items()):
        value = ("1" if value else "0") if isinstance(value, bool) else str(value)
        items.append((f"export {key}", f"export {key}={quote(value)}"))
    for line in slurm.setup:
        items.append((line, "{\n" + line + "\n} || pt_setup_failed"))
    c = slurm.container
    if c is not None and pyxis_import(slurm):  # pyxis_import needs a container
        image = c.image
        items.append(
            (
                f"enroot import docker://{image} (once per job)",
                'PT_IMAGE="$PT_SLURM_DIR/image-$SLURM_JOB_ID.sqsh"\n'
                'if [ ! -f "$PT_IMAGE" ]; then\n'
                '    rm -f "$PT_IMAGE.part"\n'
                f'    enroot import -o "$PT_IMAGE.part" {quote("docker://" + image)} || pt_setup_failed\n'
                '    mv -f "$PT_IMAGE.part" "$PT_IMAGE" || pt_setup_failed\n'
                "fi",
            )
        )
    return items


def completion_rule(slurm: SlurmConfig) -> str:
    """pt stages have finished when they printed their manifest; other commands, exit 0."""
    return slurm.completion or ("exit_code" if slurm.command is not None else "manifest")


def progress_path(stage: str, slurm: SlurmConfig, run_dir: Path) -> str:
    rel = slurm.progress or (DEFAULT_PROGRESS.get(stage) if slurm.command is None else None)
    return str(run_dir / rel) if rel else ""


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
    env.globals["dq"] = double_quote
    return env.get_template("job.sh.j2")


def render_script(
    run: RunFile,
    data: dict,
    *,
    stage: str,
    run_dir: Path,
    workdir: Path,
    input_manifest: Path | None = None,
    input_stage: str | None = None,
) -> str:
    """The sbatch script for ``stage`` of the run in ``run_dir`` (absolute paths); with
    ``input_manifest``, the stage takes the result that manifest names."""
    slurm = run.slurm
    launcher = slurm.launcher or DEFAULT_LAUNCHER[stage]
    return _template().render(
        s=slurm,
        stage=stage,
        version=__version__,
        run_dir=str(run_dir),
        slurm_dir=str(run_dir / "slurm"),
        workdir=str(workdir),
        job_name=slurm.job_name or run.run_name,
        launcher=launcher,
        ranks=slurm.ranks_per_node,
        requeue_code=REQUEUE_EXIT_CODE,
        hang_code=HANG_EXIT_CODE,
        container_env=container_env(slurm),
        intent_file=INTENT_FILE,
        completion=completion_rule(slurm),
        progress_file=progress_path(stage, slurm, run_dir),
        setup=setup_items(slurm, input_manifest, input_stage),
        srun_container=srun_container_words(slurm, run_dir, workdir),
        node_command=node_command(
            stage,
            run,
            data,
            run_dir=run_dir,
            workdir=workdir,
            has_input=input_manifest is not None,
        ),
    )
