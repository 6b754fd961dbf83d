"""pt_slurm."""

from pt_core.version import distribution_version

__version__ = distribution_version("pt-slurm")  # written once, in pyproject.toml
