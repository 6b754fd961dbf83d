"""pt_rollout."""

from importlib.metadata import version

__version__ = version("pt-rollout")  # written once, in pyproject.toml
