"""pt-core: what every pt stage shares (config, manifests, files, logging)."""

from pt_core.errors import ConfigError, InputError, PtError

__version__ = "0.1.0"
__all__ = ["ConfigError", "InputError", "PtError", "__version__"]
