"""pt_data."""

from pt_core.version import distribution_version

__version__ = distribution_version("pt-data")  # written once, in pyproject.toml
