"""One rank of a job that saves the same training state twice: synchronously into
OUT/sync and through a BackgroundSaver into OUT/async, then trains one more step while
the background write may still be going on (test_pt_train_async_save.py starts it on
every rank with pt_train.distributed.spawn_local_ranks).

    python save_twice.py CONFIG OUT [key=value ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from pt_train import checkpoint as ckpt
from pt_train.config import load_train_config
from pt_train.trainer import Trainer

STEPS = 3


def main() -> None:
    config, out, *overrides = sys.argv[1:]
    out = Path(out)
    trainer = Trainer(load_train_config(config, overrides))
    trainer.engine.train()
    for step in range(STEPS):
        trainer.train_step(step)
    state = trainer.trainer_state()
    keep = trainer.cfg.training.save_total_limit
    ckpt.save_full(trainer.engine, out / "sync", STEPS, state, trainer.env, keep)
    saver = ckpt.background_saver(trainer.engine, trainer.env, out / "async")
    assert saver is not None, "this engine saves synchronously"
    ckpt.save_full(trainer.engine, out / "async", STEPS, state, trainer.env, keep, saver)
    trainer.train_step(STEPS)  # changes the weights and the optimizer state in place
    saver.finish()
    trainer.metrics.close()


if __name__ == "__main__":
    main()
