"""pt_rollout."""

from pt_core.version import distribution_version

__version__ = distribution_version("pt-rollout")  # written once, in pyproject.toml
