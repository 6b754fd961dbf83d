"""What every pt command line shares: --version, --quiet/--verbose, and error reporting.

Each tool builds its Typer app with :func:`make_app` and exposes
``main = make_main(app)`` as its console script.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

from pt_core.errors import PtError
from pt_core.log import console, setup_logging


def make_app(name: str, help: str, version: str) -> typer.Typer:
    app = typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    def _version(value: bool) -> None:
        if value:
            typer.echo(f"{name} {version}")
            raise typer.Exit()

    @app.callback()
    def _root(
        quiet: bool = typer.Option(
            False, "--quiet", "-q", help="Only warnings and errors on stderr; no progress bars."
        ),
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging on stderr."),
        version_: bool = typer.Option(
            False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ) -> None:
        setup_logging(quiet=quiet, verbose=verbose)

    _root.__doc__ = help
    return app


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
        except Exception as exc:
            # Usage errors (unknown option, missing argument) from the click that typer bundles.
            if callable(getattr(exc, "show", None)) and isinstance(
                getattr(exc, "exit_code", None), int
            ):
                exc.show()
                sys.exit(exc.exit_code)
            raise

    return main


def report_error(exc: PtError) -> None:
    from rich.text import Text

    console.print(
        Text.assemble(("error: ", "bold red"), exc.message), highlight=False, soft_wrap=True
    )
    if exc.hint:
        console.print(
            Text.assemble(("  fix: ", "yellow"), exc.hint), highlight=False, soft_wrap=True
        )


def split_overrides(args: list[str] | None) -> list[str]:
    """Overrides given after the config path as ``key.path=value`` words."""
    return [a for a in (args or []) if a]
