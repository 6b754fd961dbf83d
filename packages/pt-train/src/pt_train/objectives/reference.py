"""The ``reference:`` key shared by the objectives that compare the policy with a frozen
model (DPO's reference, ASFT's anchor)."""

from __future__ import annotations

from pydantic import Field

from pt_core.config import Section


class ReferenceConfig(Section):
    """The frozen model: ``path`` (a local directory or hub name) or, when unset, a copy of
    the policy's starting weights. ``precompute``: compute its log-probs of the training
    data in one pass before training, store them in the run directory and do not load it
    while training (for objectives that need only sequence log-probs)."""

    path: str | None = None
    precompute: bool = False
    dtype: str | None = Field(default=None, description="None: the policy's dtype")
