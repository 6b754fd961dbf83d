"""pt_train."""

from pt_core.version import distribution_version

__version__ = distribution_version("pt-train")  # written once, in pyproject.toml

# The objectives pt-train trains, by the name a config gives (``objective: {name: ...}``):
# each is the module of that name in pt_train.objectives. Kept here, where `pt-train --help`
# reads them without importing torch.
OBJECTIVES = ("sft", "dft", "asft", "dpo", "opd", "grpo", "orpo", "kto")
