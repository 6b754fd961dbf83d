"""A set of tools a model may call: their schemas for the chat template, and their calls,
run in worker processes with a time limit each.

    with Toolbox(["calc.py:add", "python"]) as tools:
        tokenizer.apply_chat_template(messages, tools=tools.schemas, ...)
        results = tools.call_many(parse_tool_calls(reply, "hermes").calls)
        messages += [r.message() for r in results]

A tool is a plain Python function named ``module:function`` or ``path/to/file.py:function``
(or ``python``, the built-in sandboxed Python tool). Its schema comes from its signature
and docstring (:mod:`.schema`). A call never raises: an unknown tool, arguments that do not
fit the schema, an exception in the function, a call past its time limit or a function
that ends its process are each answered with an error text for the model, and
:attr:`ToolResult.error` says which, for counting.

The functions run in worker processes (``python -m pt_rollout.tools.worker``), one call
at a time each: a call past its time limit is stopped by killing its worker (a new one
starts for the next call), and a function that crashes its process takes no part of the
caller's with it. ``workers`` of them answer calls side by side (:meth:`Toolbox.call`
is safe from several threads; :meth:`Toolbox.call_many` uses them all).
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from pt_core.errors import ConfigError, RunFailure
from pt_core.objects import load_object
from pt_rollout.tools.calls import ToolCall
from pt_rollout.tools.schema import argument_problems, function_schema

# Tools pt ships, named by a word instead of module:function.
BUILTIN_TOOLS = {"python": "pt_rollout.tools.python:python"}
WORKER_START_SECONDS = 120.0  # to import the tools' modules in a new worker
# What ToolResult.error can be.
UNKNOWN_TOOL, BAD_ARGUMENTS, RAISED, TIMEOUT, CRASHED = (
    "unknown_tool", "bad_arguments", "raised", "timeout", "crashed",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """The answer to one call: ``content`` is what the model reads (the tool's result as
    text, or the error); ``error`` is None, or what went wrong (unknown_tool,
    bad_arguments, raised, timeout, crashed)."""

    name: str
    content: str
    error: str | None = None

    def message(self) -> dict:
        """The tool message to append to the conversation."""
        return {"role": "tool", "name": self.name, "content": self.content}


def tool_function(spec: str, key: str = "tools") -> Callable:
    """The function ``spec`` names (a built-in tool's name, module:function, file.py:function);
    its name is the tool's. ``key`` is the setting that gave it, for the errors."""
    return load_object(BUILTIN_TOOLS.get(spec, spec), key=key)


def result_text(value: object, max_chars: int) -> str:
    """A tool's return value as the text of a tool message: a string as it is, anything
    else as JSON (or ``str()`` where it is not JSON), cut at ``max_chars``."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}\n[cut: {len(text) - max_chars} more characters]"
    return text


class Toolbox:
    """The tools ``specs`` names, ready to be offered to a model and called; ``key`` is
    the setting that named them, for the errors."""

    def __init__(
        self,
        specs: Sequence[str],
        *,
        key: str = "tools",
        timeout_seconds: float = 30.0,
        workers: int = 1,
        max_result_chars: int = 16384,
    ):
        if timeout_seconds <= 0 or workers < 1 or max_result_chars < 1:
            raise ConfigError(
                f"tools: timeout_seconds={timeout_seconds}, workers={workers}, "
                f"max_result_chars={max_result_chars}: each must be above 0",
                hint="give a positive time limit, at least one worker, a positive length",
            )
        self.timeout_seconds = timeout_seconds
        self.schemas: list[dict] = []
        self._parameters: dict[str, dict] = {}
        specs_of: dict[str, str] = {}
        for spec in specs:
            schema = function_schema(tool_function(spec, key), spec)
            name = schema["function"]["name"]
            if name in specs_of:
                raise ConfigError(
                    f"tools {specs_of[name]} and {spec} are both named {name!r}",
                    hint="a model calls a tool by its function's name: rename one function",
                )
            specs_of[name] = spec
            self.schemas.append(schema)
            self._parameters[name] = schema["function"]["parameters"]
        if any(BUILTIN_TOOLS.get(s, s) == BUILTIN_TOOLS["python"] for s in specs):
            from pt_rollout.sandbox import choose_backend

            choose_backend()  # no sandbox here: refused now, with the fix, not at each call
        settings = {"tools": list(specs_of.values()), "sys_path": sys.path,
                    "max_result_chars": max_result_chars}  # fmt: skip
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._workers = [_Worker(settings) for _ in range(workers)]
        for worker in self._workers:
            self._idle.put(worker)

    @property
    def names(self) -> list[str]:
        return list(self._parameters)

    def call(self, call: ToolCall) -> ToolResult:
        """Run one call (on the first idle worker) and answer it; never raises for what
        the call or the tool does."""
        parameters = self._parameters.get(call.name)
        if parameters is None:
            return ToolResult(
                call.name,
                f"Error: there is no tool {call.name!r}; the tools are {', '.join(self.names)}.",
                UNKNOWN_TOOL,
            )
        problems = argument_problems(parameters, call.arguments)
        if problems:
            return ToolResult(
                call.name, f"Error: {call.name} arguments: {'; '.join(problems)}.", BAD_ARGUMENTS
            )
        worker = self._idle.get()
        try:
            return worker.call(call, self.timeout_seconds)
        finally:
            self._idle.put(worker)

    def call_many(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Answer ``calls``, up to ``workers`` at once, in their order."""
        if len(calls) <= 1 or len(self._workers) == 1:
            return [self.call(c) for c in calls]
        with ThreadPoolExecutor(min(len(calls), len(self._workers))) as pool:
            return list(pool.map(self.call, calls))

    def close(self) -> None:
        """Stop the workers."""
        for worker in self._workers:
            worker.stop()

    def __enter__(self) -> Toolbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Worker:
    """One worker process, started at its first call and again after one that killed it.
    Requests and replies are JSON lines on its stdin and stdout."""

    def __init__(self, settings: dict):
        self.settings = settings
        self.process: subprocess.Popen | None = None
        self.pending = b""  # read from the worker, after the last full line

    def call(self, call: ToolCall, timeout: float) -> ToolResult:
        if self.process is None:
            self._start()
        assert self.process is not None and self.process.stdin is not None
        request = {"name": call.name, "arguments": call.arguments}
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            line = self._read_line(time.monotonic() + timeout)
        except BrokenPipeError:
            line = b""
        if line is None:
            self.stop()
            message = f"Error: {call.name} did not finish within {timeout:g} s and was stopped."
            return ToolResult(call.name, message, TIMEOUT)
        if not line:
            status = self.stop()
            return ToolResult(
                call.name, f"Error: {call.name} ended its process ({_status(status)}).", CRASHED
            )
        reply = json.loads(line)
        return ToolResult(call.name, reply["content"], reply["error"])

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pt_rollout.tools.worker", json.dumps(self.settings)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        self.pending = b""
        line = self._read_line(time.monotonic() + WORKER_START_SECONDS)
        ready = json.loads(line) if line else {"failed": f"it ended ({_status(self.stop())})"}
        if ready.get("failed"):
            self.stop()
            raise RunFailure(
                f"the tools' worker process could not start: {ready['failed']}",
                hint="the tools import here but not in a new process: check what their "
                "modules need (the working directory, environment variables)",
            )

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the worker; b"" if it ended first; None at the deadline."""
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.pending:
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b""
                self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line

    def stop(self) -> int | None:
        """Kill the worker and what it started (its process group); its exit status."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()
        return process.wait()


def _status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"
