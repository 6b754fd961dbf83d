"""How the code is laid out, held where it was decided: no module of the workspace imports
itself back through others, and the on-policy side stays in parts a reader can hold.

An import circle works in Python only while every import in it is made inside a function,
and then only in the order the modules happen to be first imported; a refactor that moves
one import to the top fails far from where the circle is. The online loop and pt-rollout's
serving were split into one job a module; the size bounds keep them that way.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = REPO / "packages"
# the parts of the on-policy side, and their bounds (lines a module, lines a function)
PARTS = ("pt-train/src/pt_train/producers/online", "pt-rollout/src/pt_rollout/serve")
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 80


def modules() -> dict[str, Path]:
    """Every module of the packages' sources, by its dotted name (a package by its own)."""
    found = {}
    for path in PACKAGES.glob("*/src/**/*.py"):
        parts = path.relative_to(path.parents[len(path.relative_to(PACKAGES).parts) - 3])
        names = parts.with_suffix("").parts
        found[".".join(names[:-1] if names[-1] == "__init__" else names)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The workspace modules ``name`` imports, anywhere in it (in a function too), but for
    imports made for type checkers only (under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    targets: list[str] = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            targets += [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_checker_finds_a_circle_made_of_imports_inside_functions():
    """Three modules importing each other in a ring are one circle; a fourth imported by
    one of them is not in it."""
    edges = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set()}
    assert circles(edges) == [["a", "b", "c"]]


def test_no_module_of_the_workspace_imports_itself_back():
    known = modules()
    assert len(known) > 100  # the whole workspace was read
    edges = {name: imports(name, path, known) for name, path in known.items()}
    assert edges["pt_train.trainer"] >= {"pt_train.config", "pt_train.policy"}
    assert circles(edges) == []


def test_the_on_policy_side_is_in_parts_of_bounded_size():
    """No module of the online loop or of pt-rollout's serving over 400 lines, and no
    function there over 80."""
    too_long = []
    for folder in PARTS:
        for path in sorted((PACKAGES / folder).rglob("*.py")):
            text = path.read_text()
            if len(text.splitlines()) > MAX_MODULE_LINES:
                too_long.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        too_long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: "
                                        f"{lines} lines")  # fmt: skip
    assert too_long == []
