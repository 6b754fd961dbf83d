"""pt_train."""

from importlib.metadata import version

__version__ = version("pt-train")  # written once, in pyproject.toml
