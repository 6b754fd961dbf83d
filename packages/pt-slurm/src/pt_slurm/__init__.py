"""pt_slurm."""

__version__ = "0.1.0"
