"""`pt`: every pt tool under one command, with shell completion.

    pt data build data.yaml | pt train run train.yaml --data -
    pt rollout generate --model - --prompts prompts.jsonl
    pt chat runs/sft/inference/step-100      # pt rollout chat, at the top as in trl chat
    pt env                                   # versions, devices, SLURM
    pt --install-completion                  # tab completion for bash, zsh, fish

``pt TOOL ARGS...`` runs the same function as ``pt-TOOL ARGS...``: the tool's console
script, found through its installed entry point and imported only then, so the exit code
(85 for requeue included), stdout (the manifest line) and stderr are the tool's own.
Completing a command line imports the tool being completed and no other.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys

import typer

from pt_core import __version__
from pt_core.cli import CommandGroup, flag, make_main, new_typer, version_option
from pt_core.errors import PtError

# subcommand -> (console script, what it does); the summaries keep `pt --help` from
# importing every tool.
TOOLS = {
    "data": ("pt-data", "Load, transform, mix, template, tokenize, pack and inspect datasets."),
    "train": (
        "pt-train",
        # pt-train's own summary, written here so that `pt --help` imports no tool
        "Train causal language models with DeepSpeed (SFT, DFT, ASFT, DPO, OPD, GRPO, ORPO, KTO).",
    ),
    "rollout": ("pt-rollout", "Generate rollouts and score them with a teacher (vLLM or HF)."),
    "eval": ("pt-eval", "Extract and grade math answers; pass@k and benchmark runs."),
    "slurm": ("pt-slurm", "Render, submit and watch self-requeueing SLURM jobs."),
}
# pt NAME ARGS... runs pt TOOL VERB ARGS...: the verbs users of other tools look for at the
# top (trl chat, llamafactory-cli chat)
ALIASES = {
    "chat": ("rollout", "chat", "Chat with a model in the terminal (pt rollout chat)."),
}


def tool_entry_point(tool: str) -> importlib.metadata.EntryPoint:
    """The console-script entry point of ``pt TOOL``; a clear error when it is not installed."""
    script = TOOLS[tool][0]
    try:
        points = importlib.metadata.distribution(script).entry_points
    except importlib.metadata.PackageNotFoundError:
        points = []
    for point in points:
        if point.group == "console_scripts" and point.name == script:
            return point
    raise PtError(
        f"pt {tool}: {script} is not installed in this environment",
        hint=f"install it (uv pip install ./packages/{script}, or uv sync --all-packages "
        f"in the workspace), then run pt {tool} again",
    )


def run_tool(tool: str, args: list[str]) -> None:
    """Run ``pt-TOOL ARGS`` in this process; the tool's main ends the process."""
    point = tool_entry_point(tool)
    try:
        tool_main = point.load()
    except ImportError as exc:
        raise PtError(
            f"pt {tool}: {point.value} cannot be imported ({exc})",
            hint=f"install what {TOOLS[tool][0]} needs (uv sync --all-packages in the workspace)",
        ) from None
    # The tool parses sys.argv, and names itself after argv[0] in usage lines.
    sys.argv = [f"pt {tool}", *args]
    tool_main()


class _Tools(CommandGroup):
    """pt's subcommands. Each tool is a pass-through command that hands its arguments to the
    tool; while a shell completes a command line, the tool's own commands and options stand
    in for it, imported then."""

    def list_commands(self, ctx: typer.Context) -> list[str]:
        own = [name for name in super().list_commands(ctx) if name not in TOOLS]
        return [*TOOLS, *own]

    def get_command(self, ctx: typer.Context, name: str):
        if (name in TOOLS or name in ALIASES) and ctx.resilient_parsing:
            tool, verb = (name, None) if name in TOOLS else ALIASES[name][:2]
            try:
                module = importlib.import_module(tool_entry_point(tool).module)
            except (PtError, ImportError):
                pass  # not installed: complete nothing under it
            else:
                command = typer.main.get_command(module.app)
                return command if verb is None else command.commands[verb]  # pyright: ignore[reportAttributeAccessIssue]
        return super().get_command(ctx, name)


app = new_typer(
    "pt",
    "pt: small, composable post-training tools under one command (pt TOOL ... runs pt-TOOL ...).",
    cls=_Tools,
)


@app.callback()
def _root(version_: bool = version_option("pt", __version__)) -> None:
    pass


def _add_tool(tool: str, summary: str) -> None:
    def forward(ctx: typer.Context) -> None:
        run_tool(tool, list(ctx.args))

    forward.__doc__ = summary
    app.command(
        tool,
        help=summary,
        add_help_option=False,  # pt TOOL --help is the tool's help
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(forward)


for _tool, (_script, _summary) in TOOLS.items():
    _add_tool(_tool, _summary)


def _add_alias(name: str, tool: str, verb: str, summary: str) -> None:
    def forward(ctx: typer.Context) -> None:
        run_tool(tool, [verb, *ctx.args])

    forward.__doc__ = summary
    app.command(
        name,
        help=summary,
        add_help_option=False,  # pt chat --help is pt rollout chat's help
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(forward)


for _name, (_tool, _verb, _summary) in ALIASES.items():
    _add_alias(_name, _tool, _verb, _summary)


@app.command("env")
def env_cmd(
    as_json: bool = flag("--json", help="One JSON object on stdout instead of the report."),
) -> None:
    """Versions (python, the training libraries, LoRA's and the loggers', pt), devices and
    SLURM."""
    import json

    from pt_core.env import environment, format_environment

    info = environment()
    typer.echo(json.dumps(info) if as_json else format_environment(info))


main = make_main(app)

if __name__ == "__main__":
    main()
