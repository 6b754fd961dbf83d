"""Every command's --help, as a terminal of 80 and of 120 columns shows it: each option
name whole (never cut to fit a column, nor split at a hyphen where the text mentions
one), no value placeholder on a flag (``<bool>``), no line past the terminal's edge,
and each subcommand's summary whole in its group's list."""

from __future__ import annotations

import importlib
import re

import pytest
import typer
from typer.testing import CliRunner

TOOLS = {
    "pt-data": "pt_data.cli",
    "pt-train": "pt_train.cli",
    "pt-rollout": "pt_rollout.cli",
    "pt-eval": "pt_eval.cli",
    "pt-slurm": "pt_slurm.cli",
}
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*")


def commands():
    """``(words, the tool's Typer app, the click command)`` for pt, pt env and every tool
    and subcommand (pt's tool subcommands hand --help to the tools themselves)."""
    from pt_core.umbrella import app as pt_app

    pt = typer.main.get_command(pt_app)
    yield ["pt"], pt_app, pt
    yield ["pt", "env"], pt_app, pt.commands["env"]

    def walk(app, command, words):
        yield words, app, command
        for name, sub in getattr(command, "commands", {}).items():
            if not sub.hidden:
                yield from walk(app, sub, [*words, name])

    for tool, module in TOOLS.items():
        app = importlib.import_module(module).app
        yield from walk(app, typer.main.get_command(app), [tool])


def all_options(command) -> set[str]:
    names = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    for sub in getattr(command, "commands", {}).values():
        names |= all_options(sub)
    return names


KNOWN = {"--help", "--install-completion", "--show-completion"}
for _words, _app, _command in commands():
    KNOWN |= all_options(_command)


@pytest.mark.parametrize("columns", [80, 120])
@pytest.mark.parametrize(
    "words, app, command",
    list(commands()),
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_help_shows_every_option_whole(words, app, command, columns):
    result = CliRunner().invoke(app, [*words[1:], "--help"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "<bool>" not in text
    assert max(len(line) for line in text.splitlines()) <= columns
    for param in command.params:
        if getattr(param, "hidden", False):  # an option for pt's own processes, not a user's
            continue
        for name in (*param.opts, *param.secondary_opts):
            if name.startswith("--"):
                assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text), name
    # a mention of an option in a description is a whole name of some pt option
    mentioned = {m.rstrip(".,;:)") for m in OPTION.findall(text)}
    assert mentioned <= KNOWN, mentioned - KNOWN
    flat = " ".join(text.split())
    for sub in getattr(command, "commands", {}).values():
        if not sub.hidden:
            assert " ".join(sub.get_short_help_str(limit=10_000).split()) in flat
