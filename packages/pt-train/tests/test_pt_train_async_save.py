"""Asynchronous full checkpoints (``training.async_save``, pt_train.checkpoint.BackgroundSaver):
the files are those of a synchronous save, byte for byte, for the plain engine and for
DeepSpeed at ZeRO stages 0, 2 and 3 on two ranks; training goes on while they are
written; a kill -9 during the write leaves the previous checkpoint as the resume point;
a second save, a SIGTERM stop and the end of training wait for the write. The writes are
slowed down where a test needs to catch one in flight, with the PT_TRAIN_TEST_STALL hook
(it sleeps before a write starts, or after its first file)."""

from __future__ import annotations

import io
import json
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pt_core.contracts import REQUEUE_EXIT_CODE
from pt_train.checkpoint import cpu_snapshot
from pt_train.distributed import spawn_local_ranks
from pt_train.watchdog import STALL_VARIABLE

STEPS = 12
SAVE_TWICE = Path(__file__).with_name("save_twice.py")


def saved_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_snapshot_saves_to_the_same_bytes_and_does_not_follow_later_changes():
    """Two views of one storage, a parameter, a tensor that requires grad, a list met twice
    and an OrderedDict with attributes (as a module's state dict has): torch.save writes
    the same bytes for the copy, whose tensors no longer share memory with the originals."""
    from collections import OrderedDict

    base = torch.arange(10.0)
    shared = [1, 2]
    module_state = OrderedDict(w=torch.ones(2, 3))
    module_state._metadata = OrderedDict({"": {"version": 1}})
    state = {
        "base": base,
        "view": base[2:6],
        "param": torch.nn.Parameter(torch.full((2,), 3.0)),
        "grad": torch.zeros(3, requires_grad=True),
        "a": shared,
        "b": shared,
        "module": module_state,
        "step": (7, "x"),
    }
    snap = cpu_snapshot(state)
    assert saved_bytes(snap) == saved_bytes(state)
    assert snap["view"].untyped_storage().data_ptr() == snap["base"].untyped_storage().data_ptr()
    assert isinstance(snap["param"], torch.nn.Parameter) and snap["grad"].requires_grad
    assert snap["a"] is snap["b"] and snap["module"]._metadata == {"": {"version": 1}}
    base.add_(100.0)  # a training step after the copy
    state["module"]["w"].mul_(0.0)
    assert snap["view"].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert snap["module"]["w"].sum().item() == 6.0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_tokenizer_dir):
    root = tmp_path_factory.mktemp("pt-train-async-save")
    g = torch.Generator().manual_seed(1)
    with open(root / "rows.jsonl", "w") as fh:
        for i in range(32):
            n = int(torch.randint(10, 48, (1,), generator=g))
            ids = torch.randint(5, 300, (n,), generator=g).tolist()
            fh.write(json.dumps({"input_ids": ids, "labels": [-100] * (i % 3) + ids[i % 3 :]}))
            fh.write("\n")
    config = {
        "run_name": "sync",
        "output_dir": str(root / "runs"),
        "model": {
            "init": {
                "tokenizer": str(tiny_tokenizer_dir),
                "hidden_size": 128,
                "num_layers": 2,
                "num_heads": 2,
            }
        },
        "data": {"path": str(root / "rows.jsonl")},
        "training": {
            "learning_rate": 2e-3,
            "warmup_steps": 2,
            "weight_decay": 0.01,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_steps": STEPS,
            "save_steps": 4,
        },
    }
    (root / "train.yaml").write_text(yaml.safe_dump(config))
    return root


@pytest.mark.slow
@pytest.mark.parametrize(
    "nproc,zero_stage", [(1, 0), (2, 0), (2, 2), (2, 3)], ids=["plain", "zero0", "zero2", "zero3"]
)
def test_a_background_save_writes_the_bytes_of_a_synchronous_one(
    workdir, nproc, zero_stage, monkeypatch
):
    """Each rank trains 3 steps, saves synchronously into sync/, saves the same state in
    the background into async/ and, while that write is held up 2 s before it starts,
    trains a fourth step: the two checkpoint trees are identical, file for file and byte
    for byte (the copy was taken before the fourth step changed the weights)."""
    out = workdir / f"twice-{nproc}-{zero_stage}"
    argv = [
        sys.executable, SAVE_TWICE, workdir / "train.yaml", out, "training.micro_batch_size=1",
        f"run_name=twice-{nproc}-{zero_stage}", f"deepspeed.zero_stage={zero_stage}",
    ]  # fmt: skip
    monkeypatch.setenv(STALL_VARIABLE, "at=write,seconds=2")
    assert spawn_local_ranks(nproc, [str(a) for a in argv]) == 0
    sync, background = out / "sync" / "checkpoints", out / "async" / "checkpoints"
    files = sorted(p.relative_to(sync) for p in sync.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(background) for p in background.rglob("*") if p.is_file())
    assert (sync / "latest").read_text() == "step-3\n"
    expected = {f"rng-rank{r}.pt" for r in range(nproc)} | {"trainer_state.json"}
    assert expected <= {p.name for p in files}
    for name in files:
        assert (sync / name).read_bytes() == (background / name).read_bytes(), name


# ---------------------------------------------------------------- pt-train run


def weights(run_dir: Path) -> dict:
    return load_file(run_dir / "inference" / f"step-{STEPS}" / "model.safetensors")


def losses(run_dir: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def same_as(run_dir: Path, reference: Path) -> bool:
    ref, got = weights(reference), weights(run_dir)
    return ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)


def latest(run_dir: Path) -> str | None:
    path = run_dir / "checkpoints" / "latest"
    return path.read_text().strip() if path.exists() else None


def temporaries(run_dir: Path) -> list[str]:
    """The checkpoints being written (their temporary directories)."""
    return sorted(p.name for p in (run_dir / "checkpoints").glob(".tmp-*"))


@pytest.fixture(scope="module")
def reference(workdir, pt_train_run):
    """The run with synchronous saves; the asynchronous ones must end with its weights."""
    code, out, err = pt_train_run(workdir / "train.yaml", "sync").finish()
    assert code == 0, err
    return workdir / "runs" / "sync"


@pytest.mark.slow
def test_training_goes_on_while_a_checkpoint_is_written_and_the_next_save_waits(
    workdir, reference, pt_train_run
):
    """Every write is held up 3 s before it starts; steps take a fraction of that.
    While step-4 is being written, steps 5 and 6 are trained (`latest` still absent); the
    save at step 8 waits for step-4, so there is never more than one write in flight; when
    the manifest is printed the last checkpoint is complete. The weights are those of the
    synchronous run."""
    run = pt_train_run(
        workdir / "train.yaml", "overlap", "training.async_save=true", stall="at=write,seconds=3"
    )
    at_manifest = []

    def read_manifest():
        line = run.proc.stdout.readline()
        at_manifest.append((line, latest(run.run_dir), temporaries(run.run_dir)))

    reader = threading.Thread(target=read_manifest)
    reader.start()
    trained_during_write, in_flight = False, set()
    while run.proc.poll() is None:
        tmp = temporaries(run.run_dir)
        in_flight.add(tuple(tmp))
        if tmp == [".tmp-step-4"] and latest(run.run_dir) is None:
            metrics = run.run_dir / "metrics.jsonl"
            trained_during_write |= len(metrics.read_text().splitlines()) >= 6
        time.sleep(0.01)
    reader.join()
    code, _, err = run.finish()
    assert code == 0, err
    assert trained_during_write, "never saw step 6 trained while step-4 was being written"
    assert max(len(t) for t in in_flight) == 1, in_flight  # one write at a time
    manifest, latest_then, temporaries_then = at_manifest[0]
    assert json.loads(manifest)["step"] == STEPS
    assert (latest_then, temporaries_then) == (f"step-{STEPS}", [])
    assert "for checkpoint step-4 to be written" in err  # the save at step 8 waited
    assert "checkpoint step-12 written in the background" in err
    assert losses(run.run_dir) == losses(reference)
    assert same_as(run.run_dir, reference)


@pytest.mark.slow
def test_kill_9_during_a_background_write_resumes_bit_exact_from_the_previous_checkpoint(
    workdir, reference, pt_train_run
):
    """The write of step-8 stops for good after its first file: killed then, the run dir
    holds a half-written .tmp-step-8 and `latest` names step-4; the rerun (no stall)
    resumes from step-4 and ends with the weights and losses of the synchronous run."""
    run = pt_train_run(
        workdir / "train.yaml", "kill9", "training.async_save=true", stall="at=half_written,step=8"
    )
    stalled = f"{STALL_VARIABLE}: rank 0 stalls inf s at half_written 8"
    while run.proc.poll() is None and stalled not in run.stderr():
        time.sleep(0.01)
    run.proc.send_signal(signal.SIGKILL)
    code, _, err = run.finish(60)
    assert code == -signal.SIGKILL, err
    ckpts = run.run_dir / "checkpoints"
    assert latest(run.run_dir) == "step-4" and temporaries(run.run_dir) == [".tmp-step-8"]
    assert (ckpts / ".tmp-step-8" / "plain" / "state.pt").exists()  # the half written
    assert not (ckpts / ".tmp-step-8" / "trainer_state.json").exists()

    code, _, err = pt_train_run(
        workdir / "train.yaml", "kill9", "training.async_save=true"
    ).finish()
    assert code == 0, err
    assert "from step-4 (step 4)" in err
    assert temporaries(run.run_dir) == []
    assert losses(run.run_dir) == losses(reference)
    assert same_as(run.run_dir, reference)


@pytest.mark.slow
def test_a_sigterm_stop_waits_for_the_writes_before_exiting_85(workdir, reference, pt_train_run):
    """SIGTERM while step-4 is being written (each write held up 3 s): the run trains on
    to the end of the current step, saves it (after waiting for step-4), waits for that
    write too, and only then exits 85, with `latest` at the stop's checkpoint and nothing
    half written. The rerun ends bit-exact."""
    run = pt_train_run(
        workdir / "train.yaml", "sigterm", "training.async_save=true", stall="at=write,seconds=3"
    )
    while run.proc.poll() is None:
        if temporaries(run.run_dir) == [".tmp-step-4"]:
            run.proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    code, out, err = run.finish()
    assert code == REQUEUE_EXIT_CODE, err
    assert out == ""
    stopped_at = int(latest(run.run_dir).split("-")[1])
    assert 4 < stopped_at < STEPS
    assert temporaries(run.run_dir) == []
    assert f"checkpoint step-{stopped_at} written in the background" in err

    code, _, err = pt_train_run(
        workdir / "train.yaml", "sigterm", "training.async_save=true"
    ).finish()
    assert code == 0, err
    assert losses(run.run_dir) == losses(reference)
    assert same_as(run.run_dir, reference)
