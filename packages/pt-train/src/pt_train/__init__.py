"""pt_train."""

from pt_core.version import distribution_version

__version__ = distribution_version("pt-train")  # written once, in pyproject.toml
