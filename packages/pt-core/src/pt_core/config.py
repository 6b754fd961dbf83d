"""One YAML file per run, dot-notation overrides, a typed schema, clear errors.

    cfg = load_config("train.yaml", ["training.learning_rate=5e-6",
                                     "data.datasets.0.weight=2"], TrainConfig)

Schemas are pydantic models deriving from :class:`Section`, which forbids
unknown keys. Every validation problem becomes one :class:`ConfigError` that
names the file, the line, the dotted key, and what would fix it.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails

from pt_core.errors import ConfigError
from pt_core.files import atomic_write_text

S = TypeVar("S", bound=BaseModel)


class Section(BaseModel):
    """Base of every config schema: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


# --------------------------------------------------------------------------- YAML with lines


def _line_map(node: yaml.Node, prefix: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map every dotted key path in a composed YAML document to its 1-based line."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = (*prefix, str(key_node.value))
            out[path] = key_node.start_mark.line + 1
            _line_map(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, i)
            out[path] = item.start_mark.line + 1
            _line_map(item, path, out)
    return out


def read_yaml(path: str | os.PathLike) -> tuple[dict, dict[tuple, int]]:
    """Parse a YAML mapping; return it and its key -> line map."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    if p.is_dir():
        raise ConfigError(f"{p}: is a directory; expected a YAML file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a text file ({exc.reason} at byte {exc.start})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{p}:{mark.line + 1}" if mark else str(p)
        raise ConfigError(f"{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{p}: expected a mapping of keys at the top level, got {type(data).__name__}"
        )
    return data, (_line_map(node) if node is not None else {})


# --------------------------------------------------------------------------- overrides

# Words a user may put after an on/off flag, which then land among the overrides.
BOOLEAN_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})

_FLOAT_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def parse_value(text: str) -> Any:
    """An override value: YAML scalars and flow collections, with ``5e-6`` read as a float
    (plain YAML 1.1 would keep it a string)."""
    if _FLOAT_RE.match(text) and not re.fullmatch(r"[+-]?\d+", text):
        return float(text)
    try:
        return yaml.safe_load(text) if text != "" else ""
    except yaml.YAMLError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides in place; list items by index (``datasets.0.weight=2``)."""
    for item in overrides:
        if "=" not in item:
            hint = "write overrides as key.path=value, e.g. training.lr=1e-5"
            if item.lower() in BOOLEAN_WORDS:
                hint = "flags take no value: give the flag alone to turn it on"
            raise ConfigError(f"override {item!r} has no '='", hint=hint)
        dotted, raw = item.split("=", 1)
        keys = dotted.strip().split(".")
        if not all(keys):
            raise ConfigError(f"override {item!r}: empty key in {dotted!r}")
        node: Any = data
        for depth, key in enumerate(keys[:-1]):
            node = _step(node, key, keys[: depth + 1], item, create=True)
        _assign(node, keys[-1], parse_value(raw.strip()), keys, item)
    return data


def _step(node: Any, key: str, path: list[str], item: str, create: bool) -> Any:
    if isinstance(node, list):
        if create and key == str(len(node)):
            node.append({})  # datasets.2.path=... adds a third item to a two-item list
        return node[_index(node, key, path, item)]
    if isinstance(node, dict):
        if key not in node or node[key] is None:
            if not create:
                raise ConfigError(f"override {item!r}: no key {'.'.join(path)!r}")
            node[key] = {}
        return node[key]
    raise ConfigError(
        f"override {item!r}: {'.'.join(path[:-1])!r} is a {type(node).__name__}, not a mapping or list"
    )


def _assign(node: Any, key: str, value: Any, path: list[str], item: str) -> None:
    if isinstance(node, list):
        if key == str(len(node)):
            node.append(value)
        else:
            node[_index(node, key, path, item)] = value
    elif isinstance(node, dict):
        node[key] = value
    else:
        raise ConfigError(f"override {item!r}: cannot set a key inside a {type(node).__name__}")


def _index(node: list, key: str, path: list[str], item: str) -> int:
    if not re.fullmatch(r"-?\d+", key):
        raise ConfigError(
            f"override {item!r}: {'.'.join(path[:-1])!r} is a list; use an index, not {key!r}",
            hint=f"e.g. {'.'.join([*path[:-1], '0'])}",
        )
    index = int(key)
    if not -len(node) <= index < len(node):
        raise ConfigError(
            f"override {item!r}: index {index} is out of range for "
            f"{'.'.join(path[:-1])!r}, which has {len(node)} item(s)"
        )
    return index


# --------------------------------------------------------------------------- validation


_MISSING = object()  # no value given (a key that is not known at all)


def validate(
    data: dict,
    schema: type[S],
    *,
    source: str = "<config>",
    lines: dict[tuple, int] | None = None,
    overridden: set[tuple] | None = None,
    written: dict | None = None,
    overrides: list[str] | None = None,
) -> S:
    """Validate ``data`` against ``schema``; turn pydantic's errors into one clear ConfigError.

    ``written`` (the file's data) and ``overrides`` (what the command line set on it) let
    a section's own check, or its tag, blame the override that made the section invalid
    rather than the file's line of the section."""
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            blamed = _blamed_overrides(err, schema, written, overrides or [])
            where = "override " + ", ".join(blamed) if blamed else None
            problems.append(
                _describe(err, schema, data, source, lines or {}, overridden or set(), where=where)
            )
        header = (
            f"{source}: {len(problems)} problem(s) in the config" if len(problems) > 1 else None
        )
        raise ConfigError("\n".join([header, *problems] if header else problems)) from None


def _raw_loc(err: ErrorDetails) -> tuple:
    return tuple(
        p
        for p in err["loc"]
        if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))
    )


def _loc_of(err: ErrorDetails, schema: type[BaseModel]) -> tuple:
    """The error's place as the keys are written (the union tags pydantic inserts dropped)."""
    return _without_tags(schema, _raw_loc(err))


def _blamed_overrides(
    err: ErrorDetails, schema: type[BaseModel], written: dict | None, overrides: list[str]
) -> list[str]:
    """The overrides at or under a section (or its tag) that make it invalid, where the
    file's section is valid without them: each one whose removal takes the error away (all
    of them when no one alone does). Empty when the file itself is at fault, or the error
    is at a key an override set (that override is named already)."""
    loc = list(_loc_of(err, schema))
    kind = err["type"]
    section_check = kind == "value_error" and isinstance(err.get("input"), dict)
    if written is None or not (section_check or kind.startswith("union_tag")):
        return []
    under = [o for o in overrides if "=" in o and _as_loc(o.split("=", 1)[0])[: len(loc)] == loc]
    if not under:
        return []
    key = (tuple(err["loc"]), err["msg"])
    others = [o for o in overrides if o not in under]
    if key in _errors(schema, written, others):
        return []  # the file's section is invalid as written
    blamed = [
        o for o in under if key not in _errors(schema, written, [p for p in overrides if p != o])
    ]
    return [o.split("=", 1)[0].strip() for o in blamed or under]


def _errors(schema: type[BaseModel], written: dict, overrides: list[str]) -> set[tuple]:
    """``(loc, msg)`` of every error of ``written`` with ``overrides`` applied (validated
    again quietly: a section's warnings were given once already)."""
    import logging
    import warnings

    data = copy.deepcopy(written)
    try:
        apply_overrides(data, overrides)
    except ConfigError:
        return set()
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            schema.model_validate(data)
    except ValidationError as exc:
        return {(tuple(e["loc"]), e["msg"]) for e in exc.errors()}
    finally:
        logging.disable(previous)
    return set()


def _describe(
    err: ErrorDetails,
    schema: type[BaseModel],
    data: dict,
    source: str,
    lines,
    overridden,
    *,
    where: str | None = None,
) -> str:
    raw = _raw_loc(err)
    loc = _without_tags(schema, raw)  # the keys as written; ``raw`` walks the schema
    dotted = ".".join(map(str, loc)) or "<top level>"
    where = where or _where(loc, source, lines, overridden)
    kind = err["type"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        ctx = err.get("ctx", {})
        node = _model_at(schema, raw)
        key = _tag_key(_union_models(_unwrap(node) if node is not None else None)) or "name"
        expected = ctx.get("expected_tags") or ", ".join(map(repr, _tags(_model_at(schema, raw))))
        given = f"{key} {ctx['tag']!r} is not known" if "tag" in ctx else f"no {key!r} is given"
        return (
            f"{where}: {dotted!r}: {given}; expected one of {expected}"
            f"\n  fix: set {dotted}.{key} to one of {expected}"
        )
    if kind in ("extra_forbidden", "literal_error"):
        value = _MISSING if kind == "extra_forbidden" else err.get("input")
        note = _other_members_note(schema, raw, loc, where, value)
        if note is not None:
            return note
    if kind == "extra_forbidden":
        valid = _valid_keys(schema, raw[:-1])
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        level = ".".join(map(str, loc[:-1])) or "the top level"
        msg = f"{where}: unknown key {dotted!r}; valid keys at {level}: {', '.join(valid)}"
        if close:
            msg += f"\n  fix: did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?"
        return msg
    if kind == "missing":
        return f"{where}: missing required key {dotted!r}\n  fix: add it to the config or pass {dotted}=..."
    value = err.get("input")
    if kind == "value_error" and isinstance(value, dict):
        # a section's own check (a model validator): its message says it all
        message = err["msg"].removeprefix("Value error, ")
        return f"{where}: {dotted or 'the config'}: {message}"
    expected = _expected_type(schema, raw) or err["msg"]
    shown = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{where}: key {dotted!r} has value {shown}, expected {expected} ({err['msg']})"


def _where(loc: tuple, source: str, lines, overridden) -> str:
    for n in range(len(loc), 0, -1):
        if loc[:n] in overridden:
            return f"override {'.'.join(map(str, loc[:n]))}"
        if loc[:n] in lines:
            return f"{source}:{lines[loc[:n]]}"
    return source


def _model_at(schema: Any, loc: tuple) -> Any:
    """Follow a location through nested models, lists and dicts to the annotation there.
    A tagged union (``objective: {name: dpo, ...}``) is followed into the member whose
    tag is the next part of ``loc`` when pydantic put the tag there, else left as is."""
    node: Any = schema
    for part in loc:
        node = _unwrap(node)
        members = _tagged_members(node)
        if members and str(part) not in members:
            return None
        if members:
            node = members[str(part)]
            continue
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(str(part))
            if field is None:
                return None
            node = field.annotation
        elif typing.get_origin(node) in (list, tuple, set):
            node = typing.get_args(node)[0] if typing.get_args(node) else Any
        elif typing.get_origin(node) is dict:
            node = typing.get_args(node)[1] if typing.get_args(node) else Any
        else:
            return None
    return _unwrap(node)


def _tagged_members(node: Any) -> dict[str, type[BaseModel]]:
    """The members of a union of models told apart by a literal field (:func:`_tag_key`),
    by their tags."""
    members = _union_models(node)
    key = _tag_key(members)
    if key is None:
        return {}
    return {
        str(tag): member
        for member in members
        for tag in typing.get_args(member.model_fields[key].annotation)
    }


def _union_models(node: Any) -> list[type[BaseModel]]:
    """The models of a union of models (each may be ``Annotated`` with its tag)."""
    if typing.get_origin(node) not in (typing.Union, types.UnionType):
        return []
    members = []
    for member in typing.get_args(node):
        while typing.get_origin(member) is typing.Annotated:
            member = typing.get_args(member)[0]
        if not (isinstance(member, type) and issubclass(member, BaseModel)):
            return []
        members.append(member)
    return members


def _tag_key(members: list[type[BaseModel]]) -> str | None:
    """The field that tells a union's models apart: a ``Literal`` in each, no two sharing
    a value (``name`` where that is one)."""
    if not members:
        return None
    candidates = [k for k in members[0].model_fields if all(k in m.model_fields for m in members)]
    candidates.sort(key=lambda k: k != "name")
    for key in candidates:
        annotations = [m.model_fields[key].annotation for m in members]
        if any(typing.get_origin(a) is not typing.Literal for a in annotations):
            continue
        values = [v for a in annotations for v in typing.get_args(a)]
        if len(values) == len(set(values)):
            return key
    return None


def _in_union(schema: Any, raw: tuple) -> tuple[tuple, str, str, dict] | None:
    """Where ``raw`` (a location as pydantic gives it) goes through a tagged union: the
    section's keys as written, its tag key, the tag taken, and the union's members."""
    for i in range(len(raw)):
        node = _model_at(schema, raw[:i])
        members = _tagged_members(_unwrap(node) if node is not None else None)
        if members and str(raw[i]) in members:
            key = _tag_key(_union_models(_unwrap(node)))
            assert key is not None  # members were found by it
            return _without_tags(schema, raw[:i]), key, str(raw[i]), members
    return None


def _other_members_note(
    schema: Any, raw: tuple, loc: tuple, where: str, value=_MISSING
) -> str | None:
    """For a key refused in one member of a tagged union that another member takes (with
    ``value``, where given): the message that says which, and the fix."""
    found = _in_union(schema, raw)
    if found is None:
        return None
    section, key, tag, members = found
    name = str(loc[-1])
    others = []
    for other_tag, member in members.items():
        field = member.model_fields.get(name)
        if other_tag == tag or field is None:
            continue
        literal = typing.get_origin(field.annotation) is typing.Literal
        if value is not _MISSING and literal and value not in typing.get_args(field.annotation):
            continue
        others.append(other_tag)
    if not others:
        return None
    dotted = ".".join(map(str, loc))
    tag_dotted = ".".join([*map(str, section), key])
    what = dotted if value is _MISSING else f"{dotted}={value}"
    kinds = " or ".join(f"{tag_dotted}={t}" for t in others)
    return (
        f"{where}: {what} is for {kinds}; here {tag_dotted} is {tag}"
        f"\n  fix: set {tag_dotted}={others[0]}, or remove {dotted}"
    )


def _tags(node: Any) -> list[str]:
    return list(_tagged_members(_unwrap(node) if node is not None else None))


def _without_tags(schema: Any, loc: tuple) -> tuple:
    """``loc`` as the user wrote the keys: the union tags pydantic inserts are dropped."""
    out = []
    for i, part in enumerate(loc):
        node = _model_at(schema, loc[:i])
        if _tagged_members(_unwrap(node) if node is not None else None):
            continue
        out.append(part)
    return tuple(out)


def _unwrap(annotation: Any) -> Any:
    """Optional[X] / X | None -> X; Annotated[X, ...] -> X."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(args) == 1:
            return _unwrap(args[0])
        if len(models) == 1:
            return models[0]
    return annotation


def _valid_keys(schema: type[BaseModel], loc: tuple) -> list[str]:
    node = _model_at(schema, loc)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return []


def _expected_type(schema: type[BaseModel], loc: tuple) -> str | None:
    node = _model_at(schema, loc)
    if node is None:
        return None
    if typing.get_origin(node) is typing.Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(node)))
    return getattr(node, "__name__", None) or str(node).replace("typing.", "")


# --------------------------------------------------------------------------- entry points


def load_config(path: str | os.PathLike | None, overrides: list[str] | None, schema: type[S]) -> S:
    """Read YAML, apply overrides, validate against ``schema``."""
    data, lines = read_yaml(path) if path is not None else ({}, {})
    overrides = list(overrides or [])
    overridden = {tuple(_as_loc(o.split("=", 1)[0])) for o in overrides if "=" in o}
    written = copy.deepcopy(data)
    apply_overrides(data, overrides)
    return validate(
        data,
        schema,
        source=str(path) if path else "<overrides>",
        lines=lines,
        overridden=overridden,
        written=written,
        overrides=overrides,
    )


def _as_loc(dotted: str) -> list:
    return [int(k) if re.fullmatch(r"\d+", k) else k for k in dotted.strip().split(".")]


def config_to_dict(cfg: BaseModel) -> dict:
    return cfg.model_dump(mode="json")


def config_hash(cfg: BaseModel | dict) -> str:
    """A short stable hash of a config's content (key order does not matter)."""
    data = config_to_dict(cfg) if isinstance(cfg, BaseModel) else cfg
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def freeze_config(
    cfg: BaseModel | dict, run_dir: str | os.PathLike, name: str = "config.yaml"
) -> Path:
    """Write the final config (after overrides) into the run directory, atomically."""
    data = config_to_dict(cfg) if isinstance(cfg, BaseModel) else cfg
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    return atomic_write_text(Path(run_dir) / name, text)


def changed_keys(
    old: dict, new: dict, *, ignore: tuple[str, ...] = (), only_new: bool = False, prefix: str = ""
) -> list[str]:
    """The dotted keys whose values differ between two config dicts, sorted. ``ignore``:
    dotted keys left out, with everything under them; ``only_new``: only ``new``'s keys are
    compared, and one that ``old`` lacks differs (a stage writes its defaults into its own
    frozen copy, so keys only ``old`` has do not count)."""
    out = []
    keys = set(new) if only_new else set(old) | set(new)
    for key in sorted(keys, key=str):
        dotted = f"{prefix}{key}"
        if any(dotted == k or dotted.startswith(k + ".") for k in ignore):
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_keys(a, b, ignore=ignore, only_new=only_new, prefix=dotted + ".")
        elif a != b or (only_new and key not in old):
            out.append(dotted)
    return out
