"""Tools a model may call: schemas from Python functions (:mod:`.schema`), calls read out of
generated text (:mod:`.calls`), and run with a time limit (:mod:`.toolbox`); the built-in
``python`` tool runs code in the sandbox (:mod:`.python`)."""

from pt_rollout.tools.calls import (
    TOOL_FORMATS,
    ParsedReply,
    ParseFailure,
    ToolCall,
    parse_tool_calls,
    resolve_tool_format,
)
from pt_rollout.tools.toolbox import Toolbox, ToolResult

__all__ = [
    "TOOL_FORMATS",
    "ParseFailure",
    "ParsedReply",
    "ToolCall",
    "ToolResult",
    "Toolbox",
    "parse_tool_calls",
    "resolve_tool_format",
]
