"""pt_eval."""

from importlib.metadata import version

__version__ = version("pt-eval")  # written once, in pyproject.toml
