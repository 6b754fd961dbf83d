"""The objectives pt-train trains, one module and one config section each.

An objective names the rows it trains on, what it needs from a reference model, and its
loss as a pure function of log-probs (see :mod:`pt_train.objectives.base`). To add one:
write ``objectives/<name>.py`` with a config section (a :class:`pt_core.config.Section`
whose ``name`` is a one-value ``Literal``) and an :class:`Objective` subclass, and list
the pair here.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from pt_train.objectives.asft import ASFT, ASFTConfig
from pt_train.objectives.base import LossOutput, Objective
from pt_train.objectives.dft import DFT, DFTConfig
from pt_train.objectives.dpo import DPO, DPOConfig
from pt_train.objectives.grpo import GRPO, GRPOConfig
from pt_train.objectives.opd import OPD, OPDConfig
from pt_train.objectives.sft import SFT, SFTConfig

REGISTRY: dict[str, tuple[type, type[Objective]]] = {
    "sft": (SFTConfig, SFT),
    "dft": (DFTConfig, DFT),
    "asft": (ASFTConfig, ASFT),
    "dpo": (DPOConfig, DPO),
    "opd": (OPDConfig, OPD),
    "grpo": (GRPOConfig, GRPO),
}

ObjectiveConfig = Annotated[
    Union[tuple(config for config, _ in REGISTRY.values())],  # noqa: UP007
    Field(discriminator="name"),
]


def build_objective(cfg) -> Objective:
    return REGISTRY[cfg.name][1](cfg)


__all__ = ["REGISTRY", "LossOutput", "Objective", "ObjectiveConfig", "build_objective"]
