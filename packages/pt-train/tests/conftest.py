"""pt-train's test fixtures beyond the root conftest's."""

from __future__ import annotations

import os

import pytest

# What a plain process's in-process `pt_train.trainer.train()` exports to form its
# process group of one (pt_train.distributed.init_distributed).
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


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
