"""pt_slurm."""

from importlib.metadata import version

__version__ = version("pt-slurm")  # written once, in pyproject.toml
