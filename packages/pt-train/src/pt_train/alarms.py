"""Alarms: bounds on a run's per-step figures that stop it before it trains on garbage.

    training:
      alarms:
        rollout_kl: {above: 0.05}     # the generator's and the trainer's log-probs disagree
        entropy: {below: 0.05}        # the policy collapsed onto a few tokens
        completion_length: {above: 900}

Any figure the run logs can be bounded. The objective's own figures (``loss``,
``rollout_kl``, ``entropy``, ``clip_low``, ``kl``, ...) are checked once the step's
forward and backward passes are done and before its update: a step that trips an alarm
is logged and its update is not applied. The online loop's round figures
(``completion_length``, ``reward``, ...) are known after the step and checked then, so the
run stops before the next one. Either way the run stops with one line naming the figure,
its value, the bound and the step, and exit code 3 (a run failure, not an input
error); a figure the run never logs is refused at its first step.
"""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from pt_core.config import Section
from pt_core.errors import RunFailure


class AlarmTripped(RunFailure):
    """A figure of the run left its bound (``training.alarms``)."""


class Bound(Section):
    above: float | None = Field(default=None, description="stop when the figure is above this")
    below: float | None = Field(default=None, description="stop when the figure is below this")

    @model_validator(mode="after")
    def _one_side_at_least(self):
        if self.above is None and self.below is None:
            raise ValueError("an alarm needs a bound: give above, below or both")
        return self


class Alarms:
    def __init__(self, bounds: dict[str, Bound]):
        self.bounds = bounds
        self._seen: set[str] = set()  # bounded figures met so far

    def check(self, values: dict, step: int, *, before_update: bool) -> None:
        """Raise :class:`AlarmTripped` for the first bounded figure in ``values`` out of its
        bound (a NaN is out of every bound)."""
        for name, bound in self.bounds.items():
            value = values.get(name)
            if value is None:
                continue
            self._seen.add(name)
            value = float(value)
            side = None
            if bound.above is not None and not value <= bound.above:
                side, limit = "above", bound.above
            elif bound.below is not None and not value >= bound.below:
                side, limit = "below", bound.below
            if side is None:
                continue
            what = "its update was not applied" if before_update else "stopping before the next"
            raise AlarmTripped(
                f"step {step}: {name} = {_show(value)} is {side} training.alarms.{name}."
                f"{side} = {limit}; {what}",
                hint=f"see metrics.jsonl for how {name} got there; the run resumes from its "
                "last full checkpoint once the cause is fixed (or the bound changed)",
            )

    def check_known(self, record: dict) -> None:
        """After the first step: every bounded figure must be one the run logs."""
        unknown = [n for n in self.bounds if n not in self._seen and n not in record]
        if unknown:
            logged = ", ".join(sorted(k for k, v in record.items() if isinstance(v, int | float)))
            raise AlarmTripped(
                f"training.alarms.{unknown[0]}: this run logs no figure {unknown[0]!r}",
                hint=f"bound one of: {logged}",
            )


def _show(value: float) -> str:
    return "nan" if math.isnan(value) else f"{value:.4g}"
