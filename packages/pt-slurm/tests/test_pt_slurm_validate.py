"""A stage's own config is checked at submit, at the job's world size, and a config that
would fail on every retry is refused before sbatch; the check is the job environment's
`pt-train check` / `pt-data check`, run as a command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


def write(tmp_path: Path, training: dict, **slurm) -> Path:
    config = {
        "run_name": "checked",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": "some/model"},
        "training": {"max_steps": 10, "global_batch_size": 8, **training},
        "slurm": {"job_name": "pt-checked", **slurm},
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slurm
def test_a_mistyped_training_key_is_refused_before_sbatch(slurm_cluster, tmp_path, pt_slurm):
    path = write(tmp_path, {"learnin_rate": 1e-5})
    proc = pt_slurm("submit", path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = path.read_text().splitlines().index("  learnin_rate: 1.0e-05") + 1
    assert f"{path}:{line}" in proc.stderr and "training.learning_rate" in proc.stderr
    assert slurm_cluster.job_ids_named("pt-checked") == []  # nothing reached SLURM
    assert not (tmp_path / "runs").exists()  # and nothing was written


@pytest.mark.slurm
def test_a_batch_the_jobs_world_size_does_not_divide_is_refused(slurm_cluster, tmp_path, pt_slurm):
    """2 nodes x 3 ranks = 6 ranks of micro-batch 1 cannot make a global batch of 8; on
    one node of 4 ranks it can (8 = 1 x 4 x 2 accumulation steps)."""
    path = write(tmp_path, {"micro_batch_size": 1}, nodes=2, procs_per_node=3)
    proc = pt_slurm("submit", path, check=False)
    assert proc.returncode == 2
    message = " ".join(proc.stderr.split())
    assert "at the job's world size 6 (2 node(s) x 3 rank(s))" in message
    assert "global_batch_size=8 is not divisible" in message
    assert slurm_cluster.job_ids_named("pt-checked") == []
    ok = pt_slurm("submit", path, "slurm.nodes=1", "slurm.procs_per_node=4", "--dry-run")
    assert "world size 4 (1 node(s) x 4 rank(s)): 2 accumulation step(s)" in " ".join(
        ok.stderr.split()
    )


def test_a_config_for_gpu_nodes_passes_the_check_on_a_login_node_without_one(tmp_path, pt_slurm):
    """This machine has no GPU, as a login node may not: a key that needs the job's GPUs
    (each generator process on a GPU of its own) is the job's pt-train run's to check
    against its node, so submit's check passes it."""
    config = {
        "run_name": "checked",
        "output_dir": str(tmp_path / "runs"),
        "model": {"name_or_path": "some/model"},
        "objective": {"name": "grpo"},
        "rollout": {"prompts": "p.jsonl", "samples_per_prompt": 4, "generator": "server",
                    "servers": 2, "server_devices": [1, 2]},
        "training": {"max_steps": 10, "global_batch_size": 8},
        "slurm": {"job_name": "pt-checked"},
    }  # fmt: skip
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    proc = pt_slurm("submit", path, "--dry-run")
    assert "pt-train config checked at world size 1" in " ".join(proc.stderr.split())
    assert not (tmp_path / "runs").exists()


def _submit_without_pt_train(*args: str) -> subprocess.CompletedProcess:
    """pt-slurm where pt_train and pt_data cannot be imported (a login node without
    them): the check is the job environment's commands either way."""
    code = (
        "import sys; sys.modules['pt_train'] = sys.modules['pt_data'] = None\n"
        "sys.argv[0] = 'pt-slurm'\n"
        "from pt_slurm.cli import main; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )


def test_the_jobs_pt_train_check_does_the_check(tmp_path):
    bad = _submit_without_pt_train(
        "submit", str(write(tmp_path, {"micro_batch_size": 3})), "--dry-run"
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    message = " ".join(bad.stderr.split())
    assert "`pt-train check` at the job's world size 1 (1 node(s) x 1 rank(s)) refused" in message
    assert "not divisible by micro_batch_size x world_size = 3 x 1" in message

    good = _submit_without_pt_train("submit", str(write(tmp_path, {})), "--dry-run")
    assert good.returncode == 0, good.stderr
    said = " ".join(good.stderr.split())
    assert (
        f"checked at world size 1 (1 node(s) x 1 rank(s)): 8 accumulation step(s), by {Path(sys.executable).parent}/pt-train check"
        in said
    )


def test_launcher_none_checks_nodes_times_launcher_nproc(tmp_path, pt_slurm):
    """pt-train's own launcher starts launcher.nproc ranks on each node: 2 nodes x 3 ranks
    of micro-batch 1 cannot make 8; 2 x 2 can, with 2 accumulation steps."""
    path = write(tmp_path, {"micro_batch_size": 1}, nodes=2, launcher="none")
    bad = pt_slurm("submit", path, "launcher.nproc=3", "--dry-run", check=False)
    assert bad.returncode == 2, bad.stderr
    assert "not divisible by micro_batch_size x world_size = 1 x 6" in " ".join(bad.stderr.split())
    ok = pt_slurm("submit", path, "launcher.nproc=2", "--dry-run")
    assert "world size 4 (2 node(s) x launcher.nproc=2): 2 accumulation step(s)" in " ".join(
        ok.stderr.split()
    )


def test_a_data_stage_is_checked_by_pt_data_check(tmp_path):
    path = tmp_path / "data.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "run_name": "d",
                "output_dir": str(tmp_path / "runs"),
                "data": {"datasets": [{"source": "rows.jsonl", "transform": "no_such_transform"}]},
            }
        )
    )
    bad = _submit_without_pt_train("submit", str(path), "--stage", "data", "--dry-run")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "`pt-data check` refused the config" in bad.stderr
    assert "no_such_transform" in bad.stderr
    assert not (tmp_path / "runs").exists()
    fixed = path.read_text().replace("no_such_transform", "messages")
    path.write_text(fixed)
    good = _submit_without_pt_train("submit", str(path), "--stage", "data", "--dry-run")
    assert good.returncode == 0, good.stderr
    assert "pt-data config checked: 1 dataset(s), by" in " ".join(good.stderr.split())


def test_without_a_pt_train_command_the_check_is_said_to_be_skipped(tmp_path):
    """A job environment without pt-train and a pt-slurm installed alone: nothing here
    can tell the config wrong, and the submit says so."""
    empty = tmp_path / "env"
    (empty / "bin").mkdir(parents=True)
    path = write(tmp_path, {"learnin_rate": 1})  # wrong, but nothing here can tell
    venv = Path(sys.prefix)  # the same packages, in an environment without pt-* commands
    alone = tmp_path / "alone"
    (alone / "bin").mkdir(parents=True)
    (alone / "bin" / "python").symlink_to(sys.executable)
    (alone / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (alone / "lib").symlink_to(venv / "lib")
    code = "import sys; sys.argv[0] = 'pt-slurm'\nfrom pt_slurm.cli import main; main()"
    proc = subprocess.run(
        [str(alone / "bin" / "python"), "-c", code, "submit", str(path),
         f"slurm.python_env={empty}", "--dry-run"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not checked: no pt-train command was found in" in " ".join(proc.stderr.split())


def test_pt_slurm_imports_neither_pt_train_nor_pt_data(tmp_path):
    """pt-slurm checks a stage with the stage's own command, in a subprocess."""
    evaluate = tmp_path / "eval.yaml"
    evaluate.write_text(
        yaml.safe_dump({"run_name": "ev", "eval": {"model": "m", "benchmark": "b.jsonl"}})
    )
    code = (
        "import sys; from pt_slurm.submit import prepare; "
        f"prepare({str(evaluate)!r}, [], ['eval']); "
        f"prepare({str(write(tmp_path, {}))!r}, []); "
        "assert not {'pt_train', 'pt_data', 'torch'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"benchmark": "b.jsonl", "n": "many"}, "Invalid value for '--n'"),
        ({"n": 4}, "Missing option '--benchmark'"),
    ],
)
def test_an_eval_stage_whose_options_do_not_parse_is_refused(tmp_path, pt_slurm, options, message):
    path = tmp_path / "eval.yaml"
    path.write_text(
        yaml.safe_dump(
            {"run_name": "ev", "output_dir": str(tmp_path), "eval": {"model": "m", **options}}
        )
    )
    proc = pt_slurm("submit", path, "--stage", "eval", "--dry-run", check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "options do not parse as `pt-eval run` options" in proc.stderr


def test_a_mistyped_option_is_refused_with_the_one_meant(tmp_path, pt_slurm):
    path = tmp_path / "eval.yaml"
    eval_options = {"model": "m", "benchmark": "b.jsonl", "temprature": 0.6}
    path.write_text(
        yaml.safe_dump({"run_name": "ev", "output_dir": str(tmp_path), "eval": eval_options})
    )
    proc = pt_slurm("submit", path, "--stage", "eval", "--dry-run", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "eval.temprature: `pt-eval run` has no option --temprature" in proc.stderr
    assert "did you mean --temperature?" in proc.stderr


def test_an_unknown_option_is_refused_even_when_false(tmp_path, pt_slurm):
    """`last_number: false` would leave the flag out, so the command line alone would never
    show that `pt-eval run` has no such option (it is `pt-eval grade`'s)."""
    path = tmp_path / "eval.yaml"
    eval_options = {"model": "m", "benchmark": "b.jsonl", "last_number": False}
    path.write_text(
        yaml.safe_dump({"run_name": "ev", "output_dir": str(tmp_path), "eval": eval_options})
    )
    proc = pt_slurm("submit", path, "--stage", "eval", "--dry-run", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "eval.last_number: `pt-eval run` has no option --last-number" in proc.stderr


def test_a_data_stage_checks_the_data_config(tmp_path, pt_slurm):
    path = tmp_path / "data.yaml"
    path.write_text(
        "run_name: build\n"
        f"output_dir: {tmp_path}\n"
        "data:\n"
        "  datasets:\n"
        "    - source: rows.jsonl\n"
        "  shufle: false\n"
    )
    proc = pt_slurm("submit", path, "--stage", "data", "--dry-run", check=False)
    assert proc.returncode == 2
    assert f"{path}:6" in proc.stderr and "data.shuffle" in proc.stderr


def test_an_eval_section_beside_the_training_keys_keeps_their_lines_in_errors(tmp_path, pt_slurm):
    """pt-train's schema knows no eval: section; it is checked without it, and a mistake
    after it is still named by its own line in the user's file."""
    path = tmp_path / "train.yaml"
    path.write_text(
        "run_name: both\n"
        f"output_dir: {tmp_path}\n"
        "eval:\n"
        "  benchmark: b.jsonl\n"
        "  n: 2\n"
        "model: {name_or_path: some/model}\n"
        "training: {max_steps: 10, warmup_ratoi: 0.1}\n"
    )
    proc = pt_slurm("submit", path, "--stage", "train", "--stage", "eval", "--dry-run", check=False)
    assert proc.returncode == 2
    assert f"{path}:7" in proc.stderr and "training.warmup_ratio" in proc.stderr


FOREIGN_CHECKS = {
    # an older or foreign pt-train: `check` prints a manifest, not the check's result
    "manifest": 'print(\'{"kind": "checkpoint", "path": "/runs/x/inference/step-1"}\')',
    "list": "print('[1, 2]')",
    "no JSON": "print('checked')",
}


@pytest.mark.parametrize("prints", list(FOREIGN_CHECKS))
@pytest.mark.parametrize("stage", ["train", "data"])
def test_a_check_command_that_answers_another_shape_is_one_error_line(
    tmp_path, pt_slurm, stage, prints
):
    """The job environment's pt-train / pt-data answers `check` with exit 0 but not with
    the check's JSON result (config, grad_accum; datasets): one line naming the command,
    what it printed and the fix, exit 2, nothing submitted or written."""
    env = tmp_path / "old-env"
    (env / "bin").mkdir(parents=True)
    tool = env / "bin" / f"pt-{stage}"
    tool.write_text(f"#!{sys.executable}\n{FOREIGN_CHECKS[prints]}\n")
    tool.chmod(0o755)
    path = write(tmp_path, {})
    if stage == "data":
        config = yaml.safe_load(path.read_text())
        config["data"] = {"datasets": [{"source": "rows.jsonl"}]}
        path.write_text(yaml.safe_dump(config))
    proc = pt_slurm(
        "submit", path, "--stage", stage, f"slurm.python_env={env}", "--dry-run", check=False
    )
    err = " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "Traceback" not in err and "internal error" not in err, err
    assert err.count("error:") == 1
    assert f"`{tool} check {path}` printed no pt-{stage} check result" in err
    assert f"fix: is {tool} the pt-{stage} of this pt-slurm's version?" in err
    assert not (tmp_path / "runs").exists()
