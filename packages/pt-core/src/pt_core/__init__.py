"""pt-core: what every pt stage shares (config, manifests, files, logging)."""

from importlib.metadata import version

from pt_core.errors import ConfigError, InputError, PtError

__version__ = version("pt-core")  # written once, in pyproject.toml
__all__ = ["ConfigError", "InputError", "PtError", "__version__"]
