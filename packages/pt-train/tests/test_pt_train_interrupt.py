"""Ctrl-C in `pt-train run`: the first SIGINT saves a checkpoint at the end of the step and
exits 130 with one line naming where the run resumes; a second one stops at once, without
saving, and the run resumes from its last complete checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import yaml

from pt_core.errors import Interrupted

pytestmark = pytest.mark.slow

STEPS = 12


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_run_config):
    root = tmp_path_factory.mktemp("pt-train-interrupt")
    with open(root / "rows.jsonl", "w") as fh:
        for i in range(32):
            ids = [5 + (i * 7 + j) % 250 for j in range(12 + i % 9)]
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * 3 + ids[3:]}) + "\n")
    config = tiny_run_config(
        root / "runs",
        root / "rows.jsonl",
        {"name": "sft"},
        learning_rate=1e-3,
        global_batch_size=4,
        micro_batch_size=2,
        max_steps=STEPS,
        save_steps=2,
    )
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


def losses(run_dir) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def latest(run_dir) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def wait_for(condition, run, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert run.proc.poll() is None, run.stderr()
        assert time.monotonic() < deadline, run.stderr()
        time.sleep(0.05)


def test_ctrl_c_saves_at_the_step_boundary_exits_130_and_the_rerun_resumes_exactly(
    workdir, pt_train_run
):
    """The stop is the SIGTERM stop (the step finishes, a full checkpoint is saved) with
    the shell's code for an interrupt and a line saying where the run goes on; the rerun
    ends with the losses of a run nobody interrupted."""
    code, _, err = pt_train_run(workdir / "train.yaml", "reference").finish()
    assert code == 0, err

    run = pt_train_run(workdir / "train.yaml", "ctrl-c")
    metrics = run.run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, run)
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()

    assert code == Interrupted.exit_code == 130
    assert out == ""  # no manifest: the run is not finished
    assert "Traceback" not in err
    stopped = latest(run.run_dir)
    step = int(stopped.split("-")[1])
    assert 3 <= step < STEPS
    assert (
        f"error: interrupted at step {step}: the same command resumes the run from "
        f"{run.run_dir / 'checkpoints' / stopped}" in err
    )
    assert "Ctrl-C again to stop at once" in err
    assert not list((run.run_dir / "checkpoints").glob(".tmp-*"))

    code, out, err = pt_train_run(workdir / "train.yaml", "ctrl-c").finish()
    assert code == 0, err
    assert json.loads(out)["step"] == STEPS
    assert losses(run.run_dir) == losses(workdir / "runs" / "reference")


def test_a_second_ctrl_c_stops_at_once_and_the_last_complete_checkpoint_stays_the_resume_point(
    workdir, pt_train_run
):
    """Step 5 (0-based) never ends (a test stall): the first SIGINT asks for a checkpoint at
    its end, which never comes; the second stops the run then and there. step-4 (save_steps
    2) is where the same command goes on."""
    run = pt_train_run(workdir / "train.yaml", "twice", stall="at=step,step=5,seconds=inf")
    wait_for(lambda: "stalls inf s at step 5" in run.stderr(), run)
    run.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again" in run.stderr(), run)
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish(timeout=60)

    assert code == 130
    assert "Traceback" not in err
    assert (
        "error: interrupted again, without saving: the same command resumes the run from "
        f"{run.run_dir / 'checkpoints' / 'step-4'}" in err
    )
    assert latest(run.run_dir) == "step-4"


def test_ctrl_c_on_two_local_ranks_saves_on_both_exits_130_and_leaves_no_rank(
    workdir, pt_train_run
):
    """With launcher.nproc=2 the ranks run in a session of their own, so a terminal's
    Ctrl-C reaches `pt-train run` alone (here: SIGINT to it alone); it passes the SIGINT
    on, both ranks save the same step (each its own RNG state) and exit 130, which is a
    stop, not a failed rank, and the job says once where the run resumes."""
    import psutil

    run = pt_train_run(workdir / "train.yaml", "ranks", "launcher.nproc=2", plain=True)
    metrics = run.run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, run)
    ranks = psutil.Process(run.proc.pid).children()
    assert len(ranks) == 2
    assert all(os.getsid(r.pid) != os.getsid(run.proc.pid) for r in ranks)
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish()

    assert code == Interrupted.exit_code == 130, err
    assert out == ""
    assert "Traceback" not in err and "exited with" not in err
    stopped = latest(run.run_dir)
    step = int(stopped.split("-")[1])
    assert 3 <= step < STEPS
    checkpoint = run.run_dir / "checkpoints" / stopped
    assert (checkpoint / "rng-rank0.pt").exists() and (checkpoint / "rng-rank1.pt").exists()
    assert err.count("the same command resumes the run from") == 1
    assert (
        f"error: interrupted at step {step}: the same command resumes the run from {checkpoint}"
        in err
    )
    assert err.count("Ctrl-C again to stop at once") == 1
    assert not list((run.run_dir / "checkpoints").glob(".tmp-*"))
    assert not any(r.is_running() for r in ranks)


def test_a_second_ctrl_c_on_two_local_ranks_stops_both_at_once(workdir, pt_train_run):
    """Both ranks stall at step 5 (0-based): the first SIGINT, passed on, asks for a
    checkpoint at its end, which never comes; the second, passed on too, stops both ranks
    then and there, and step-4 stays where the same command goes on."""
    import psutil

    run = pt_train_run(
        workdir / "train.yaml", "ranks-twice", "launcher.nproc=2",
        stall="at=step,step=5,seconds=inf", plain=True,
    )  # fmt: skip
    wait_for(lambda: "stalls inf s at step 5" in run.stderr(), run)
    ranks = psutil.Process(run.proc.pid).children()
    run.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "Ctrl-C again" in run.stderr(), run)
    run.proc.send_signal(signal.SIGINT)
    code, out, err = run.finish(timeout=60)

    assert code == 130, err
    assert "Traceback" not in err and "exited with" not in err
    assert err.count("the same command resumes the run from") == 1
    assert (
        "error: interrupted again, without saving: the same command resumes the run from "
        f"{run.run_dir / 'checkpoints' / 'step-4'}" in err
    )
    assert latest(run.run_dir) == "step-4"
    assert not any(r.is_running() for r in ranks)


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "forked"])
def test_the_ranks_of_a_killed_parent_save_and_stop_rather_than_run_on(
    workdir, pt_train_run, plain
):
    """kill -9 of `pt-train run launcher.nproc=2` runs nothing of it: the kernel sends each
    rank SIGTERM as its parent ends (they are in a session of their own, which no terminal
    signals), and they stop as on any SIGTERM, with a checkpoint of the step they were at.
    Forked from the suite's zygote (tests/zygote.py), the ranks are the zygote's children,
    which sends them SIGTERM when the launcher ends: the same stop."""
    import psutil

    def ended(proc) -> bool:
        # an orphan's exit status is for its new parent to collect: a zombie has ended
        try:
            return proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    name = "orphans" if plain else "forked-orphans"
    run = pt_train_run(workdir / "train.yaml", name, "launcher.nproc=2", plain=plain)
    assert (run.proc._zygote_conn is None) == plain
    metrics = run.run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3, run)
    launcher = psutil.Process(run.proc.pid)
    if plain:
        ranks = launcher.children()
    else:
        zygote = launcher.parent()
        assert zygote is not None and launcher.children() == []
        ranks = [p for p in zygote.children()
                 if p.pid != launcher.pid and p.create_time() >= launcher.create_time()]  # fmt: skip
    assert len(ranks) == 2
    assert all(os.getsid(r.pid) == r.pid for r in ranks)  # each leads a session of its own
    run.proc.kill()
    run.finish()
    deadline = time.monotonic() + 300
    while not all(ended(r) for r in ranks):
        assert time.monotonic() < deadline, run.stderr()
        time.sleep(0.05)

    err = run.stderr()
    step = int(latest(run.run_dir).split("-")[1])
    assert 3 <= step < STEPS
    assert f"stopped by signal SIGTERM at step {step}; checkpoint saved" in err
    assert "Traceback" not in err
    assert not list((run.run_dir / "checkpoints").glob(".tmp-*"))
