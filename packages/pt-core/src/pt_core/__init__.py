"""pt-core: what every pt stage shares (config, manifests, files, logging)."""

from pt_core.errors import ConfigError, InputError, PtError
from pt_core.version import distribution_version

__version__ = distribution_version("pt-core")  # written once, in pyproject.toml
__all__ = ["ConfigError", "InputError", "PtError", "__version__"]
