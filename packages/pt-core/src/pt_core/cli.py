"""What every pt command line shares: --version, --quiet/--verbose, and error reporting.

Each tool builds its Typer app with :func:`make_app` and exposes
``main = make_main(app)`` as its console script. Every error a user can cause ends the
process with one ``error:`` line on stderr (and a ``fix:`` line), never a traceback:
:class:`PtError` with its own exit code, a usage error (unknown option, a value of the
wrong type, a missing argument) with exit code 2.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import cast

import typer
from typer.core import TyperGroup

from pt_core.errors import InputError, PtError
from pt_core.log import console, setup_logging

# The options of the command that is running, so shared code can offer a flag in a hint
# only where the command has it (see command_has_option).
_running: dict[str, frozenset[str]] = {"options": frozenset()}


def flag(name: str, *names: str, help: str):
    """An on/off option that takes no value (shown without a value type in --help)."""
    return typer.Option(False, name, *names, help=help, metavar="")


def command_has_option(name: str) -> bool:
    """Whether the command being run accepts the option ``name`` (e.g. ``--skip-bad``)."""
    return name in _running["options"]


class CommandGroup(TyperGroup):
    """A command with subcommands whose help lists each one with its first sentence whole,
    wrapped to the terminal (click cuts it to one line with "...")."""

    def format_commands(self, ctx: typer.Context, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=sys.maxsize)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def new_typer(name: str, help: str, **settings) -> typer.Typer:
    """A Typer app with pt's conventions: -h/--help, help when given no arguments, and
    errors left to :func:`make_main` (no pretty tracebacks). Help is click's plain text:
    it wraps the descriptions to the terminal and gives an option name that does not fit
    its own line, where rich's tables cut long names at 80 columns."""
    return typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        rich_markup_mode=None,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        **{"cls": CommandGroup, **settings},
    )


def version_option(name: str, version: str):
    """``--version``: print ``NAME VERSION`` and exit."""

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{name} {version}")
            raise typer.Exit()

    return typer.Option(
        False,
        "--version",
        callback=show,
        is_eager=True,
        metavar="",
        help="Print the version and exit.",
    )


def make_app(name: str, help: str, version: str) -> typer.Typer:
    app = new_typer(name, help, add_completion=False)

    @app.callback()
    def _root(
        ctx: typer.Context,
        quiet: bool = flag(
            "--quiet", "-q", help="Only warnings and errors on stderr; no progress bars."
        ),
        verbose: bool = flag("--verbose", "-v", help="Debug logging on stderr."),
        version_: bool = version_option(name, version),
    ) -> None:
        setup_logging(quiet=quiet, verbose=verbose)
        _running["options"] = _options_of(ctx)

    _root.__doc__ = help
    return app


def _options_of(ctx: typer.Context) -> frozenset[str]:
    name = ctx.invoked_subcommand
    # only a group (make_app's) has a subcommand to invoke
    command = cast(TyperGroup, ctx.command).get_command(ctx, name) if name else None
    if command is None:
        return frozenset()
    return frozenset(o for p in command.params for o in (*p.opts, *p.secondary_opts))


# sysexits' EX_SOFTWARE: an exception pt did not expect (a bug), not the user's input.
INTERNAL_ERROR_EXIT_CODE = 70


def make_main(app: typer.Typer) -> Callable[[], None]:
    def main() -> None:
        setup_logging()
        try:
            # Without standalone mode click returns, rather than raises, a typer.Exit's code.
            code = app(standalone_mode=False)
            if isinstance(code, int) and code:
                sys.exit(code)
        except PtError as exc:
            report_error(exc)
            sys.exit(exc.exit_code)
        except typer.Exit as exc:
            sys.exit(exc.exit_code)
        except typer.Abort:
            console.print("[red]aborted[/red]")
            sys.exit(130)
        except KeyboardInterrupt:
            console.print("[red]interrupted[/red]")
            sys.exit(130)
        except typer.TyperException as exc:
            # Usage errors (unknown option, bad value, missing argument) from the click
            # that typer bundles.
            report_usage_error(exc)
            sys.exit(exc.exit_code)
        except OSError as exc:  # a path that cannot be read or written: the user's to fix
            report_error(
                InputError(
                    f"{exc.filename if exc.filename is not None else 'a file'}: "
                    f"{exc.strerror or exc}",
                    hint="check the path, that its folder exists and that it may be written",
                )
            )
            sys.exit(InputError.exit_code)
        except Exception as exc:  # a bug in pt: said in one line, the traceback on request
            if os.environ.get("PT_TRACEBACK") == "1":
                raise
            report_error(
                PtError(
                    f"internal error: {type(exc).__name__}: {exc}",
                    hint="this is a bug in pt; run again with PT_TRACEBACK=1 to see where, "
                    "and report it",
                )
            )
            sys.exit(INTERNAL_ERROR_EXIT_CODE)

    return main


def report_error(exc: PtError) -> None:
    """One ``error:`` line (and a ``fix:`` line). In a job of several ranks, a config or
    input error, or a Ctrl-C (where the run resumes), is the same on every rank and is
    printed by rank 0 alone; any other is printed by the rank it happened on, which it
    names."""
    from rich.text import Text

    from pt_core.errors import ConfigError, InputError, Interrupted
    from pt_core.log import current_rank

    rank = current_rank()
    if rank and isinstance(exc, ConfigError | InputError | Interrupted):
        return
    if rank:
        exc.message = f"[rank {rank}] {exc.message}"
    console.print(
        Text.assemble(("error: ", "bold red"), exc.message), highlight=False, soft_wrap=True
    )
    if exc.hint:
        console.print(
            Text.assemble(("  fix: ", "yellow"), exc.hint), highlight=False, soft_wrap=True
        )


def report_usage_error(exc: typer.TyperException) -> None:
    """A usage error as one ``error:`` line naming the command, and where to find the
    options; a command given no arguments shows its help instead."""
    from rich.text import Text

    if type(exc).__name__ == "NoArgsIsHelpError":
        # a click UsageError (click as typer bundles it), which typer types as its base
        exc.show()  # pyright: ignore[reportAttributeAccessIssue]
        return
    ctx = getattr(exc, "ctx", None)
    message = " ".join(exc.format_message().split())
    where = f"{ctx.command_path}: " if ctx is not None else ""
    console.print(
        Text.assemble(("error: ", "bold red"), where, message), highlight=False, soft_wrap=True
    )
    if ctx is not None:
        console.print(
            Text.assemble(("  fix: ", "yellow"), f"see {ctx.command_path} --help"),
            highlight=False,
            soft_wrap=True,
        )


def split_overrides(args: list[str] | None) -> list[str]:
    """Overrides given after the config path as ``key.path=value`` words."""
    return [a for a in (args or []) if a]
