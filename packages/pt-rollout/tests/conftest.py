"""pt-rollout's tests: the suite imports test modules by path (--import-mode=importlib); the
helpers beside them (rollout_commands.py) are imported by name from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
