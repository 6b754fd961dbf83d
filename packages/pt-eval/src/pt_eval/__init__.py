"""pt_eval."""

from pt_core.version import distribution_version

__version__ = distribution_version("pt-eval")  # written once, in pyproject.toml
