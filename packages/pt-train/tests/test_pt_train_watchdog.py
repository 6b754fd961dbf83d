"""The hang watchdog (pt_train.watchdog) as a user meets it: `pt-train run` with
``training.watchdog_minutes`` on a run that hangs (one of two ranks asleep before a step,
through the PT_TRAIN_TEST_STALL test hook), on one that is slow but keeps stepping, on a
slow first step, and on a hang that holds the GIL."""

from __future__ import annotations

import json
import re

import pytest
import torch
import yaml

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_core.errors import ConfigError
from pt_train.config import load_train_config, resume_changed_keys
from pt_train.watchdog import HANG_EXIT_CODE, STALL_VARIABLE, TestStall, hang_dumps

STEPS = 6


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("pt-train-watchdog")
    g = torch.Generator().manual_seed(0)
    with open(root / "rows.jsonl", "w") as fh:
        for _ in range(24):
            ids = torch.randint(
                5, 300, (int(torch.randint(10, 40, (1,), generator=g)),), generator=g
            )
            fh.write(json.dumps({"input_ids": ids.tolist(), "labels": ids.tolist()}) + "\n")
    config = {
        "run_name": "watchdog",
        "output_dir": str(root / "runs"),
        "model": {
            "init": {
                "tokenizer": str(tiny_tokenizer_dir),
                "hidden_size": 64,
                "num_layers": 1,
                "num_heads": 1,
            }
        },
        "data": {"path": str(root / "rows.jsonl")},
        "training": {
            "learning_rate": 1e-3,
            "global_batch_size": 2,
            "micro_batch_size": 1,
            "max_steps": STEPS,
            "save_steps": 2,
        },
    }
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.fixture
def run(workdir, pt_train_run):
    """``pt-train run`` of the module's config as run NAME, to its end: (exit code, stderr)."""

    def run(name: str, *overrides: str, stall: str | None = None) -> tuple[int, str]:
        code, _, err = pt_train_run(workdir / "train.yaml", name, *overrides, stall=stall).finish()
        return code, err

    return run


@pytest.mark.slow  # pt-train processes that wait out a watchdog window
def test_a_hung_rank_makes_every_rank_dump_its_stacks_and_exit_with_the_hang_code(workdir, run):
    """Rank 1 of 2 sleeps before step 3 (0-based), so rank 0 waits for it in the step's
    first all-reduce: neither completes step 4 within the window. Each rank writes its own
    stacks (rank 1's show the stall, rank 0's the collective), and the job exits 86, which
    is not 0 (done), 2 (bad input) or 85 (requeue asked for)."""
    run_dir = workdir / "runs" / "hung"
    stall = "at=step,rank=1,step=3,seconds=inf"
    code, err = run("hung", "launcher.nproc=2", "training.watchdog_minutes=0.1", stall=stall)
    assert code == HANG_EXIT_CODE and code not in (0, 2, REQUEUE_EXIT_CODE), err
    dumps = {p.name.split("-")[1]: p.read_text() for p in hang_dumps(run_dir)}
    assert sorted(dumps) == ["0", "1"], dumps.keys()
    for rank, text in dumps.items():
        assert text.startswith(f"pt-train watchdog: rank {rank} "), text[:200]
        assert "the optimizer step after step 3" in text
        main = re.search(r"the main thread is (0x[0-9a-f]+)", text).group(1)
        stack = text.split(f"Thread {main} (most recent call first):")[1].split("\n\n")[0]
        if rank == "1":
            assert re.search(r"watchdog\.py\", line \d+ in __call__", stack), stack
        else:
            assert re.search(r"distributed\.py\", line \d+ in all_reduce", stack), stack
    assert "Python stacks of every thread" in err  # the dumps go to stderr as well
    # steps 1-3 were done and logged; step-2 is the last complete checkpoint
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-2"


@pytest.mark.slow  # pt-train processes that wait out a watchdog window
def test_a_slow_run_that_keeps_stepping_is_not_stopped(workdir, run):
    """Every step sleeps 3 s: the run takes 6 x 3 = 18 s, more than the 15 s window, but
    no single step (with its save, 12 s of slack on a loaded machine) reaches it, so the
    watchdog never fires."""
    code, err = run("slow", "training.watchdog_minutes=0.25", stall="at=step,seconds=3")
    assert code == 0, err
    assert err.count(f"{STALL_VARIABLE}: rank 0 stalls 3 s") == STEPS
    assert not hang_dumps(workdir / "runs" / "slow")


@pytest.mark.slow  # pt-train processes that wait out a watchdog window
def test_the_first_step_has_its_own_window(workdir, run):
    """A 6 s window, and a first step that sleeps 8 s after the model load: within the
    first-step window (30 min by default) the run finishes; with that window set to the
    6 s of the others, the watchdog fires during the first step."""
    stall = "at=step,step=0,seconds=8"
    code, err = run("first-ok", "training.watchdog_minutes=0.1", stall=stall)
    assert code == 0, err
    assert not hang_dumps(workdir / "runs" / "first-ok")

    short = ("training.watchdog_minutes=0.1", "training.watchdog_first_step_minutes=0.1")
    code, err = run("first-short", *short, stall=stall)
    assert code == HANG_EXIT_CODE, err
    (dump,) = hang_dumps(workdir / "runs" / "first-short")
    assert "waited 0.1 min for the first optimizer step of this process" in dump.read_text()


@pytest.mark.slow  # pt-train processes that wait out a watchdog window
def test_a_hang_that_holds_the_gil_is_ended_by_faulthandlers_backstop(workdir, run):
    """The stall sleeps in a C call that keeps the GIL, so the watchdog's Python thread
    cannot run; faulthandler's C thread dumps the stacks to stderr 3 + 3 + 3 s after the
    last step (the window, and the grace and the backstop capped by it) and exits 1 (a
    failure all the same)."""
    code, err = run(
        "gil", "training.watchdog_minutes=0.05", stall="at=step,step=2,seconds=600,gil=1"
    )
    assert code == 1, err
    assert "Timeout (0:00:09)!" in err
    assert re.search(r"watchdog\.py\", line \d+ in __call__", err)
    assert not hang_dumps(workdir / "runs" / "gil")


def test_watchdog_and_async_save_keys_are_validated_and_free_on_resume(workdir):
    path = workdir / "train.yaml"
    cfg = load_train_config(path, ["training.watchdog_minutes=2.5", "training.async_save=true"])
    assert cfg.training.watchdog_minutes == 2.5 and cfg.training.async_save is True
    assert load_train_config(path).training.watchdog_minutes is None  # off by default
    for bad in ("training.watchdog_minutes=0", "training.watchdog_first_step_minutes=-1"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].split(".")[1]):
            load_train_config(path, [bad])
    old = {"training": {"watchdog_minutes": None, "async_save": False, "seed": 0}}
    new = {"training": {"watchdog_minutes": 5, "async_save": True, "seed": 0}}
    assert resume_changed_keys(old, new) == []  # a resume may turn them on or off


def test_a_malformed_stall_hook_is_one_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="PT_TRAIN_TEST_STALL"):
        TestStall("at=nowhere", 0, tmp_path)
    stall = TestStall("at=step,rank=1,step=3,seconds=0", 0, tmp_path)
    stall("step", 3)  # another rank: returns at once
    assert TestStall(None, 0, tmp_path).at is None
