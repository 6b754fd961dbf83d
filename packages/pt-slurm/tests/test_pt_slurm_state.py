"""The decision a job makes when its step ends (the job script's own bash, run here as the
job runs it), and the bookkeeping around it: the events file and what it folds into."""

from __future__ import annotations

import json
import shlex
import subprocess
from importlib import resources

import pytest
import yaml

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_core.errors import ConfigError, InputError
from pt_slurm import state
from pt_slurm.render import HANG_EXIT_CODE
from pt_slurm.submit import freeze_config

BOOKKEEPING = resources.files("pt_slurm") / "templates" / "bookkeeping.sh"


def decide(tmp_path, **given) -> dict:
    """Run the job script's ``pt_decide`` in bash with the given inputs; its outputs."""
    inputs = {
        "MAX_FAILURES": 3,
        "MAX_REQUEUES": 5,
        "COMPLETION": "manifest",
        "PROGRESS_FILE": "",
        "REQUEUE_EXIT_CODE": REQUEUE_EXIT_CODE,
        "HANG_EXIT_CODE": HANG_EXIT_CODE,
        "phase": "step",
        "exit_code": 0,
        "signals": "",
        "manifest_found": 0,
        "intent": "",
        "progress_at_start": "",
        "progress_now": "",
        "slurm_requeued": 0,
        "preempted": 0,
        "setup_line": "",
        "failures": 0,
        "requeues": 0,
        "cancelled": 0,
        **given,
    }
    assignments = "\n".join(f"{k}={shlex.quote(str(v))}" for k, v in inputs.items())
    script = (
        f"set -u\nsource {BOOKKEEPING}\n{assignments}\npt_decide\n"
        'printf "%s\\n" "$action" "$status" "$failures" "$requeues" "$reason"\n'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    action, status, failures, requeues, reason = out.stdout.split("\n")[:5]
    return {
        "action": action,
        "status": status,
        "failures": int(failures),
        "requeues": int(requeues),
        "reason": reason,
    }


# A stage that saved a step since its run started (its progress file changed).
SAVED = {
    "PROGRESS_FILE": "/r/checkpoints/latest",
    "progress_at_start": "step-40",
    "progress_now": "step-50",
}


@pytest.mark.parametrize(
    "given, expected",
    [
        # the stage printed its manifest: finished, whatever came before; failures reset
        ({"manifest_found": 1, "failures": 2}, ("done", "completed", 0, 0)),
        ({"manifest_found": 1, "signals": "USR1"}, ("done", "completed", 0, 0)),
        # ... even if srun then reported a failure (the result is there)
        ({"manifest_found": 1, "exit_code": 1}, ("done", "completed", 0, 0)),
        # exit 0 without the manifest is not a finish (srun can exit 0 when a node fails)
        ({"exit_code": 0}, ("requeue", "retrying", 1, 0)),
        # a command judged by its exit code (slurm.command) has finished at exit 0
        ({"COMPLETION": "exit_code", "exit_code": 0}, ("done", "completed", 0, 0)),
        # the stage saved and asked to continue: a requeue, not a failure
        ({"exit_code": REQUEUE_EXIT_CODE, **SAVED}, ("requeue", "requeued", 0, 1)),
        (
            {"exit_code": 1, "signals": "USR1", "requeues": 2, **SAVED},
            ("requeue", "requeued", 0, 3),
        ),
        # a stage of any kind without a progress file cannot show a saved step: a failure
        ({"exit_code": REQUEUE_EXIT_CODE}, ("requeue", "retrying", 1, 0)),
        ({"exit_code": REQUEUE_EXIT_CODE, "failures": 2}, ("stop", "failed", 3, 0)),
        ({"exit_code": 1, "signals": "USR1"}, ("requeue", "retrying", 1, 0)),
        # ... but with no progress since the run started it counts as a failure
        (
            {
                "exit_code": REQUEUE_EXIT_CODE,
                "PROGRESS_FILE": "/r/checkpoints/latest",
                "progress_at_start": "step-40",
                "progress_now": "step-40",
            },
            ("requeue", "retrying", 1, 0),
        ),
        (
            {
                "exit_code": REQUEUE_EXIT_CODE,
                "PROGRESS_FILE": "/r/checkpoints/latest",
                "progress_at_start": "step-40",
                "progress_now": "step-50",
            },
            ("requeue", "requeued", 0, 1),
        ),
        # under torchrun a rank's 85 arrives as exit 1; the rank's own code decides
        ({"exit_code": 1, "intent": REQUEUE_EXIT_CODE, **SAVED}, ("requeue", "requeued", 0, 1)),
        # the hang watchdog's 86 (straight, or through torchrun) is a failure, never a requeue
        ({"exit_code": HANG_EXIT_CODE, **SAVED}, ("requeue", "retrying", 1, 0)),
        (
            {"exit_code": 1, "intent": HANG_EXIT_CODE, "signals": "USR1"},
            ("requeue", "retrying", 1, 0),
        ),
        # and the requeues are bounded: the 6th asked for with max_requeues=5 stops
        ({"exit_code": REQUEUE_EXIT_CODE, "requeues": 5, **SAVED}, ("stop", "failed", 0, 5)),
        # scancel / wall time (SIGTERM) or pt-slurm cancel: stop even if the stage said 85
        ({"exit_code": REQUEUE_EXIT_CODE, "signals": "TERM"}, ("stop", "stopped", 0, 0)),
        ({"exit_code": 1, "signals": "USR1,TERM"}, ("stop", "stopped", 0, 0)),
        ({"exit_code": 143, "signals": "TERM", "cancelled": 1}, ("stop", "cancelled", 0, 0)),
        # SIGTERM because SLURM requeues the job itself (node failure): no second requeue
        (
            {"exit_code": 0, "signals": "TERM", "slurm_requeued": 1},
            ("slurm-requeue", "requeued", 0, 1),
        ),
        # real failures: retried while fewer than max_failures (3) have happened
        ({"exit_code": 1}, ("requeue", "retrying", 1, 0)),
        ({"exit_code": 137, "failures": 1}, ("requeue", "retrying", 2, 0)),
        ({"exit_code": 1, "failures": 2}, ("stop", "failed", 3, 0)),
        # a failed setup is a failure like any other, named by its line
        (
            {"phase": "setup", "exit_code": 127, "setup_line": "module load cuda"},
            ("requeue", "retrying", 1, 0),
        ),
    ],
)
def test_decide(tmp_path, given, expected):
    got = decide(tmp_path, **given)
    assert (got["action"], got["status"], got["failures"], got["requeues"]) == expected
    assert got["reason"]  # the events say why


def test_the_reasons_name_what_happened(tmp_path):
    setup = decide(tmp_path, phase="setup", exit_code=1, setup_line="echo $UNSET")
    assert setup["reason"] == "setup failed (exit 1) at: echo $UNSET: failure 1 of 3, retrying"
    stuck = decide(
        tmp_path,
        exit_code=REQUEUE_EXIT_CODE,
        PROGRESS_FILE="/r/checkpoints/latest",
        progress_at_start="step-40",
        progress_now="step-40",
        failures=2,
    )
    assert stuck["reason"] == (
        "exit 85 without progress (latest still step-40): failure 3 of 3, giving up"
    )
    bound = decide(tmp_path, exit_code=REQUEUE_EXIT_CODE, requeues=5, **SAVED)
    assert "requeued 5 times (max_requeues=5)" in bound["reason"]
    hang = decide(tmp_path, exit_code=1, intent=HANG_EXIT_CODE)
    assert hang["reason"] == (
        "the hang watchdog ended the step: exit 1 (a rank exited 86): failure 1 of 3, retrying"
    )
    preempted = decide(tmp_path, exit_code=REQUEUE_EXIT_CODE, preempted=1, **SAVED)
    assert (preempted["action"], preempted["reason"]) == (
        "requeue",
        "preempted by SLURM, exit 85: latest now step-50, continuing (requeue 1 of at most 5)",
    )
    through = decide(tmp_path, exit_code=1, intent=REQUEUE_EXIT_CODE, **SAVED)
    assert through["reason"].startswith("exit 1 (a rank exited 85): latest now step-50")
    unsaved = decide(tmp_path, exit_code=REQUEUE_EXIT_CODE)
    assert unsaved["reason"] == (
        "exit 85 without a progress file to show a saved step (set slurm.progress): "
        "failure 1 of 3, retrying"
    )


def _events(tmp_path, *lines: dict) -> None:
    path = state.events_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))


def test_the_job_reads_the_counts_its_last_end_left_and_a_cancel(tmp_path):
    """pt_read_counts: counts since the last submission; a cancel of that submission."""
    _events(
        tmp_path,
        {"event": "submit"},
        {"event": "end", "failures": 2, "requeues": 4, "reason": '"failures":9 in a reason'},
        {"event": "submit"},
        {"event": "end", "failures": 1, "requeues": 0},
        {"event": "cancel"},
        {"event": "end", "failures": 1, "requeues": 3},
    )
    script = (
        f"PT_EVENTS={state.events_path(tmp_path)}\nsource {BOOKKEEPING}\npt_read_counts\n"
        'echo "$failures $requeues $cancelled"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "3", "1"]


def test_events_fold_into_the_state(tmp_path):
    state.begin_submission(tmp_path, stage="train", max_failures=3, max_requeues=9, job_name="x")
    state.record_job_id(tmp_path, "7")
    with open(state.events_path(tmp_path), "a") as fh:  # what the job script appends
        for line in (
            {"event": "start", "job_id": "7", "restart": 0, "nodes": "n1"},
            {"event": "end", "exit_code": 85, "signals": "USR1", "action": "requeue",
             "status": "requeued", "failures": 0, "requeues": 1, "reason": "saved"},
            {"event": "start", "job_id": "7", "restart": 1, "nodes": "n2"},
        ):  # fmt: skip
            fh.write(json.dumps(line) + "\n")
    st = state.read_state(tmp_path)
    assert (st["status"], st["job_id"], st["job_ids"], st["requeues"]) == ("running", "7", ["7"], 1)
    assert [r["restart"] for r in st["runs"]] == [0, 1]
    assert st["runs"][0]["signals"] == ["USR1"] and st["runs"][0]["outcome"] == "requeue"
    assert (st["max_failures"], st["max_requeues"]) == (3, 9)


def test_a_new_submission_keeps_the_history_and_starts_the_counts_afresh(tmp_path):
    _events(
        tmp_path,
        {"event": "submit", "max_failures": 1},
        {"event": "job_id", "job_id": "7"},
        {"event": "start", "job_id": "7"},
        {"event": "end", "status": "failed", "failures": 1, "requeues": 2, "action": "stop"},
        {"event": "submit", "max_failures": 1},
        {"event": "job_id", "job_id": "9"},
    )
    st = state.read_state(tmp_path)
    assert st["job_ids"] == ["7", "9"] and st["job_id"] == "9"
    assert (st["failures"], st["requeues"], st["status"]) == (0, 0, "submitted")
    assert len(st["runs"]) == 1


def test_a_job_that_starts_before_sbatch_returns_stays_running(tmp_path):
    """sbatch can return after the job has already begun: its start is booked before the
    job id, and the job id recorded afterwards does not undo it."""
    _events(
        tmp_path,
        {"event": "submit"},
        {"event": "start", "job_id": "11"},
        {"event": "job_id", "job_id": "11"},
    )
    st = state.read_state(tmp_path)
    assert st["status"] == "running" and st["job_ids"] == ["11"] and len(st["runs"]) == 1


def test_cancel_leaves_a_finished_run_as_it_is(tmp_path):
    _events(tmp_path, {"event": "submit"}, {"event": "end", "status": "completed"})
    assert state.mark_cancelled_unless_final(tmp_path) is False
    assert state.read_state(tmp_path)["status"] == "completed"
    _events(tmp_path, {"event": "submit"}, {"event": "start", "job_id": "3"})
    assert state.mark_cancelled_unless_final(tmp_path) is True
    assert state.read_state(tmp_path)["status"] == "cancelled"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no events"),
        ('{"event":"submit"}\nnot json\n{"event":"cancel"}\n', "events.jsonl:2: not an event line"),
        ('[1, 2]\n{"event":"submit"}\n', "events.jsonl:1: not an event line"),
    ],
)
def test_an_empty_or_malformed_events_file_is_a_clear_error(tmp_path, text, message):
    path = state.events_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(InputError, match=message):
        state.read_state(tmp_path)


def test_a_torn_last_line_is_one_still_being_written(tmp_path):
    _events(tmp_path, {"event": "submit"}, {"event": "job_id", "job_id": "5"})
    with open(state.events_path(tmp_path), "a") as fh:
        fh.write('{"event":"start","job_id":"5"')  # no newline yet
    assert state.read_state(tmp_path)["status"] == "submitted"


def test_freeze_keeps_the_stage_copy_and_refuses_changed_values(tmp_path):
    given = {"run_name": "r", "training": {"learning_rate": 1e-5}, "slurm": {"nodes": 1}}
    freeze_config(tmp_path, given)
    # The stage rewrites config.yaml with its defaults filled in.
    stage_copy = {**given, "training": {"learning_rate": 1e-5, "max_grad_norm": 1.0}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(stage_copy))

    # Same values, new resources: the stage's copy stays, only slurm: changes.
    freeze_config(tmp_path, {**given, "slurm": {"nodes": 4}})
    frozen = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert frozen["training"] == {"learning_rate": 1e-5, "max_grad_norm": 1.0}
    assert frozen["slurm"] == {"nodes": 4}

    changed = {**given, "training": {"learning_rate": 3e-5}}
    with pytest.raises(ConfigError, match="training.learning_rate"):
        freeze_config(tmp_path, changed)
    freeze_config(tmp_path, changed, force=True)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["training"] == {
        "learning_rate": 3e-5
    }


def test_a_requeue_says_what_was_saved(tmp_path):
    got = decide(
        tmp_path,
        exit_code=REQUEUE_EXIT_CODE,
        signals="USR1",
        PROGRESS_FILE="/r/checkpoints/latest",
        progress_at_start="step-30",
        progress_now="step-40",
    )
    assert (
        got["reason"] == "SIGUSR1, exit 85: latest now step-40, continuing (requeue 1 of at most 5)"
    )
