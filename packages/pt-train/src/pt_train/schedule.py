"""Learning-rate schedules as pure functions of the optimizer step (0-based).

The rate is recomputed from the step every time, so resuming needs only the step.
"""

from __future__ import annotations

import math

from pt_train.config import TrainingConfig


def warmup_steps(training: TrainingConfig, total_steps: int) -> int:
    if training.warmup_steps is not None:
        return training.warmup_steps
    return int(round(training.warmup_ratio * total_steps))


def lr_at(step: int, training: TrainingConfig, total_steps: int) -> float:
    """Linear warmup from ``lr/warmup`` to ``lr``, then cosine or linear decay towards
    ``lr * min_lr_ratio``, or constant."""
    base = training.learning_rate
    warmup = warmup_steps(training, total_steps)
    if step < warmup:
        return base * (step + 1) / warmup
    if training.lr_schedule == "constant":
        return base
    # As Hugging Face's schedules: the floor would be reached one step after the last.
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    if training.lr_schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        shape = 1.0 - progress
    floor = training.min_lr_ratio
    return base * (floor + (1.0 - floor) * shape)
