"""pt_data."""

from importlib.metadata import version

__version__ = version("pt-data")  # written once, in pyproject.toml
