"""pt-train's test fixtures beyond the root conftest's: a tiny run's config, the launcher
environment put back after each test, and ``pt-train run`` started as a user does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pt_train.watchdog import STALL_VARIABLE

# The suite imports test modules by path (--import-mode=importlib); the helpers beside
# them (preference_data.py) are imported by name from this folder.
sys.path.insert(0, str(Path(__file__).parent))

# What a plain process's in-process `pt_train.trainer.train()` exports to form its
# process group of one (pt_train.distributed.init_distributed).
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(scope="session")
def tiny_run_config(tiny_tokenizer_dir):
    """``build(output_dir, data_path, objective, **training) -> dict``: the config of a run
    of the tiny Llama (``model.init`` with seed 0, i.e. the weights of ``tiny_model_dir``)
    under ``output_dir/run``; lr 0 and one step of 8 rows (or pairs) in one micro-batch
    unless ``training`` says otherwise, so that the logged loss is the loss at the start."""

    def build(output_dir, data_path, objective: dict, **training) -> dict:
        defaults = {
            "seed": 0,
            "lr_schedule": "constant",
            "learning_rate": 0.0,
            "global_batch_size": 8,
            "micro_batch_size": 8,
            "max_steps": 1,
        }
        return {
            "run_name": "run",
            "output_dir": str(output_dir),
            "model": {"init": {"tokenizer": str(tiny_tokenizer_dir)}},  # hidden 128, 2 layers
            "data": {"path": str(data_path)},
            "objective": objective,
            "training": {**defaults, **training},
        }

    return build


@pytest.fixture
def launcher_variables() -> tuple[str, ...]:
    return LAUNCHER_VARIABLES


@pytest.fixture(autouse=True)
def _restore_launcher_environment():
    """Put the launcher variables back as they were after each test: a `pt-train run
    launcher.nproc=N` that a later test starts from this process would otherwise inherit
    RANK=0 WORLD_SIZE=1, take itself for a launched rank of one, and fail to bind the
    MASTER_PORT this process's group holds (see test_pt_train_in_process.py)."""
    saved = {name: os.environ.get(name) for name in LAUNCHER_VARIABLES}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


class PtTrainRun:
    """``pt-train run CONFIG run_name=NAME OVERRIDES...`` started in the background, with
    one thread for torch and, if given, the ``PT_TRAIN_TEST_STALL`` test hook; its stderr
    goes to a file (a pipe nobody reads could fill up and stop it). ``plain=True`` starts
    it, and the ranks it starts, as plain processes rather than forks of the suite's
    zygote (tests/zygote.py): for a test of the process tree itself (the ranks as the
    launcher's children, in their own session, ended by the kernel when it ends)."""

    def __init__(self, config: Path, name: str, *overrides: str, stall: str | None = None,
                 plain: bool = False):  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if plain:
            env["PT_TEST_FORK"] = "0"
        env.pop(STALL_VARIABLE, None)
        if stall is not None:
            env[STALL_VARIABLE] = stall
        root = Path(config).parent
        self.run_dir = root / "runs" / name
        self.log = root / f"{name}-{time.monotonic_ns()}.err"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [shutil.which("pt-train", path=os.path.dirname(sys.executable)), "run",
                 config, f"run_name={name}", *overrides],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
            )  # fmt: skip

    def stderr(self) -> str:
        """What it printed on stderr so far, its lines joined (rich wraps long ones)."""
        return " ".join(self.log.read_text().split())

    def finish(self, timeout: float = 600) -> tuple[int, str, str]:
        """Wait for the end: (exit code, stdout, stderr with its lines joined)."""
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, self.stderr()


@pytest.fixture(scope="session")
def pt_train_run():
    return PtTrainRun


@pytest.fixture
def pt_train_in_process(monkeypatch, capfd):
    """``run(*args) -> (exit code, stdout, stderr)``: ``pt-train ARGS`` in this process, for
    a command that stops before training (a bad config or bad data): a subprocess would
    cost a torch import for the same lines."""
    from pt_core.cli import make_main
    from pt_train.cli import app

    def run(*args) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["pt-train", *map(str, args)])
        capfd.readouterr()
        with pytest.raises(SystemExit) as stop:
            make_main(app)()
        out, err = capfd.readouterr()
        return stop.value.code, out, err

    return run


@pytest.fixture(scope="session")
def pairs_file(tmp_path_factory):
    """preference_data.preference_pairs() as a jsonl file."""
    from preference_data import preference_pairs

    from pt_core.files import write_rows

    return write_rows(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", preference_pairs())
