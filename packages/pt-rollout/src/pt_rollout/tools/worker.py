"""The process a :class:`~pt_rollout.tools.toolbox.Toolbox` runs tool calls in.

    python -m pt_rollout.tools.worker SETTINGS

SETTINGS (JSON): the tools' specs, the caller's ``sys.path`` (so that ``module:function``
imports here as it did there), the longest result. It writes ``{"ready": true}`` (or
``{"failed": why}``) once the tools are imported, then answers each request line
(``{"name", "arguments"}``, arguments already checked against the schema) with a reply
line (``{"content", "error"}``). What the tools print goes to stderr, so that it cannot
mix with the replies.
"""

from __future__ import annotations

import json
import os
import sys

from pt_core.errors import PtError
from pt_rollout.tools.toolbox import RAISED, result_text, tool_function


def main() -> None:
    settings = json.loads(sys.argv[1])
    sys.path[:0] = [p for p in settings["sys_path"] if p not in sys.path]
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the tools' prints go to stderr
    try:
        tools = {fn.__name__: fn for fn in map(tool_function, settings["tools"])}
    except PtError as exc:
        replies.write(json.dumps({"failed": exc.message}) + "\n")
        return
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in sys.stdin:
        request = json.loads(line)
        name = request["name"]
        try:
            reply = {
                "content": result_text(tools[name](**request["arguments"]),
                                       settings["max_result_chars"]),
                "error": None,
            }  # fmt: skip
        except BaseException as exc:  # noqa: BLE001  (the model reads what its call raised)
            reply = {
                "content": f"Error: {name} raised {type(exc).__name__}: {exc}",
                "error": RAISED,
            }
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()
