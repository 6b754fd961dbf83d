"""pt_data."""

__version__ = "0.1.0"
