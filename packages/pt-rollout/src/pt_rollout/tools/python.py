"""The built-in tool ``python``: a model's program run in the sandbox
(:func:`pt_rollout.sandbox.run_python`, default limits), its output read back.

Offer it as ``python`` in a tool list. For other limits, write a tool of your own that
calls ``run_python(code, limits=SandboxLimits(...)).report()``.
"""

from __future__ import annotations

from pt_rollout.sandbox import run_python


def python(code: str) -> str:
    """Run a Python program and return what it prints (stdout, then stderr).

    The program runs alone in a sandbox: no network, no files but its working directory,
    a few seconds of CPU. Print the values you want to see.

    Args:
        code: the program, as Python 3 source code
    """
    return run_python(code).report()
