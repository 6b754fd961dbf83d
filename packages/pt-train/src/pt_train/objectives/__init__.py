"""The objectives pt-train trains, one module and one config section each.

An objective declares what it needs (:class:`Needs`: the rows it trains on, a frozen
model and what it computes, a teacher's scores or rewards in the online loop) and gives
its loss as a pure function of log-probs (see :mod:`pt_train.objectives.base`). To add
one: write ``objectives/<name>.py`` with a config section (a :class:`pt_core.config.Section`
whose ``name`` is a one-value ``Literal``) and an :class:`Objective` subclass, end it with
``OBJECTIVE = (TheConfig, TheObjective)`` and add
its name in ``pt_train.OBJECTIVES`` (``NAMES`` here); nothing else changes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Annotated, Protocol, Union

from pydantic import Field

from pt_train import OBJECTIVES as NAMES
from pt_train.objectives.base import LossOutput, Needs, Objective

# Each name is the module of that name here, which ends with
# ``OBJECTIVE = (ConfigSection, ObjectiveClass)``.

REGISTRY: dict[str, tuple[type, type[Objective]]] = {
    name: importlib.import_module(f"pt_train.objectives.{name}").OBJECTIVE for name in NAMES
}

if TYPE_CHECKING:
    # One of the sections in REGISTRY, whose union is made at import; statically, what
    # they all have: a name.
    class ObjectiveConfig(Protocol):
        @property
        def name(self) -> str: ...

else:
    ObjectiveConfig = Annotated[
        Union[tuple(config for config, _ in REGISTRY.values())],  # noqa: UP007
        Field(discriminator="name"),
    ]


def build_objective(cfg) -> Objective:
    return REGISTRY[cfg.name][1](cfg)


__all__ = ["REGISTRY", "LossOutput", "Needs", "Objective", "ObjectiveConfig", "build_objective"]
