"""A tool's JSON schema, from its Python signature and docstring, and the check of the
arguments a model gives it against that schema.

The schema is the "function" tool format chat templates take in ``tools=``::

    {"type": "function", "function": {"name": "add", "description": "Add two integers.",
     "parameters": {"type": "object", "properties": {"a": {"type": "integer",
     "description": "the first"}, ...}, "required": ["a", "b"]}}}

It is built by transformers' ``get_json_schema`` (the types it maps: str, int, float,
bool, list[...], dict[str, ...], tuple[...], Literal[...], Enum, unions and Optional);
pt checks first what that function would refuse or get wrong, so that each fault is
one error that names the tool, the parameter and the fix.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from pt_core.errors import ConfigError

SUPPORTED_TYPES = "str, int, float, bool, list[...], dict[str, ...], Literal[...], or X | None"
JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}
ARTICLES = {"integer": "an integer", "array": "an array", "object": "an object"}


def function_schema(fn: Callable, spec: str) -> dict:
    """The tool schema of ``fn``, named ``spec`` in the errors. The description is the
    docstring's text before ``Args:``; every parameter needs a type hint and a line under
    ``Args:``."""
    from transformers.utils.chat_template_utils import (
        TypeHintParsingException,
        get_json_schema,
        parse_google_format_docstring,
    )

    def refuse(problem: str, fix: str) -> ConfigError:
        return ConfigError(f"tool {spec}: {problem}", hint=fix)

    if not inspect.isfunction(fn):
        raise refuse(f"is a {type(fn).__name__}, not a function", "name a plain Python function")
    parameters = inspect.signature(fn).parameters.values()
    for p in parameters:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            raise refuse(
                f"takes {star}{p.name}, which the named arguments of a tool call cannot fill",
                f"give each argument a parameter of its own, with a type hint ({p.name}: int)",
            )
        if p.kind is p.POSITIONAL_ONLY:
            raise refuse(
                f"parameter {p.name!r} is positional-only; a tool call names its arguments",
                "remove the / from the signature",
            )
        if p.annotation is p.empty:
            raise refuse(
                f"parameter {p.name!r} has no type hint, so its JSON schema is unknown",
                f"annotate it ({p.name}: int), with {SUPPORTED_TYPES}",
            )
    doc = inspect.getdoc(fn) or ""
    summary, described, _ = parse_google_format_docstring(doc)
    if not summary:
        raise refuse(
            "has no docstring summary, which is the tool's description for the model",
            'start its docstring with a line saying what it does ("""Add two integers.""")',
        )
    for p in parameters:
        if p.name not in (described or {}):
            raise refuse(
                f"its docstring does not describe parameter {p.name!r}",
                f"add a line '{p.name}: what it is' under 'Args:' in the docstring",
            )
    try:
        return get_json_schema(fn)
    except (TypeHintParsingException, NameError, TypeError) as exc:
        raise refuse(
            f"a parameter's type has no JSON schema ({exc})", f"use {SUPPORTED_TYPES}"
        ) from None


def argument_problems(parameters: dict, arguments: dict) -> list[str]:
    """What is wrong with ``arguments`` (a tool call's) for a tool whose ``parameters``
    schema is given: a required one missing, one the tool does not take, a value of
    another type. Empty when they fit."""
    properties = parameters.get("properties", {})
    problems = [f"{name!r} is missing" for name in parameters.get("required", [])
                if name not in arguments]  # fmt: skip
    for name, value in arguments.items():
        if name not in properties:
            problems.append(f"{name!r} is not a parameter (it takes {', '.join(properties)})")
        elif (problem := value_problem(properties[name], value)) is not None:
            problems.append(f"{name!r} {problem}")
    return problems


def value_problem(schema: dict, value: Any) -> str | None:
    """Why ``value`` does not fit ``schema`` (the subset get_json_schema writes), or None."""
    if value is None and schema.get("nullable"):
        return None
    if "anyOf" in schema:
        if any(value_problem(option, value) is None for option in schema["anyOf"]):
            return None
        return f"fits none of its types, not {_shown(value)}"
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(JSON_TYPES[t](value) for t in types if t in JSON_TYPES):
            wanted = " or ".join(ARTICLES.get(t, f"a {t}") for t in types)
            return f"must be {wanted}, not {_shown(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"must be one of {json.dumps(schema['enum'])}, not {_shown(value)}"
    if isinstance(value, list):
        for i, item in enumerate(value):
            items = schema.get("prefixItems", [])
            item_schema = items[i] if i < len(items) else schema.get("items")
            if item_schema is not None and (problem := value_problem(item_schema, item)):
                return f"item {i} {problem}"
    if isinstance(value, dict) and "additionalProperties" in schema:
        for key, item in value.items():
            if problem := value_problem(schema["additionalProperties"], item):
                return f"key {key!r} {problem}"
    return None


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
