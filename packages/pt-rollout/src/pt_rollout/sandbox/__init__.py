"""A sandbox for programs a model writes: :func:`run_python` (see :mod:`.run`)."""

from pt_rollout.sandbox.backends import SandboxUnavailable
from pt_rollout.sandbox.run import SandboxLimits, SandboxResult, choose_backend, run_python

__all__ = ["SandboxLimits", "SandboxResult", "SandboxUnavailable", "choose_backend", "run_python"]
