"""What every pt command line shares: on/off flags that take no value, and usage errors
reported as one line with exit code 2 instead of click's usage block or a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pt_core.config import apply_overrides
from pt_core.errors import ConfigError

TOY = textwrap.dedent(
    """
    import sys
    import typer
    from pt_core.cli import flag, make_app, make_main, split_overrides
    from pt_core.config import apply_overrides
    app = make_app("toy", "A toy tool.", "1.2")
    @app.command()
    def count(
        n: int = typer.Option(1, "--n", help="How many."),
        loud: bool = flag("--loud", help="Shout."),
        overrides: list[str] = typer.Argument(None),
    ):
        apply_overrides({}, split_overrides(overrides))
        print("x" * n if not loud else "X" * n)
    @app.command()
    def other():
        pass
    @app.command()
    def broken():
        {}["missing"]  # a bug: an exception pt does not expect
    @app.command()
    def failing():
        from pt_core.errors import RunFailure
        raise RunFailure("the grading workers fail to start")
    sys.argv[0] = "toy"  # what usage lines name the tool after
    make_main(app)()
    """
)


def toy(*args):
    return subprocess.run([sys.executable, "-c", TOY, *args], capture_output=True, text=True)


def test_flags_show_no_value_type_in_help():
    """A flag listed as `--quiet <bool>` invites `--quiet true`, which then lands where a
    command or an override goes; --help must show flags without a value type."""
    root = toy("--help").stdout
    for line in root.splitlines():
        if "--quiet" in line or "--verbose" in line or "--version" in line:
            assert "<bool>" not in line, line
    count = toy("count", "--help").stdout
    assert "--loud" in count
    assert all("<bool>" not in line for line in count.splitlines() if "--loud" in line)
    assert any("<int>" in line for line in count.splitlines() if "--n" in line)


def test_a_flag_takes_no_value():
    assert toy("--quiet", "count", "--loud", "--n", "3").stdout == "XXX\n"
    after_flag = toy("--quiet", "true", "count")
    assert after_flag.returncode == 2
    assert "No such command 'true'" in after_flag.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["count", "--n", "abc"], "error: toy count: Invalid value for '--n'"),
        (["count", "--nn", "3"], "error: toy count: No such option: --nn"),
        (["nope"], "error: toy: No such command 'nope'"),
        (["count", "--loud", "true"], "error: override 'true' has no '='"),
        (["count", "lr:1"], "error: override 'lr:1' has no '='"),
    ],
)
def test_usage_errors_are_one_error_line_and_exit_2(args, message):
    proc = toy(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == [lines[0]]
    assert lines[0].startswith(message), proc.stderr
    assert len(lines) <= 2 and all(line.startswith("  fix: ") for line in lines[1:])


def test_no_arguments_still_shows_the_help():
    proc = toy()
    assert proc.returncode == 2
    assert "A toy tool." in proc.stderr + proc.stdout and "error:" not in proc.stderr


def test_a_boolean_word_among_overrides_is_told_that_flags_take_no_value():
    with pytest.raises(ConfigError) as err:
        apply_overrides({}, ["true"])
    assert err.value.hint == "flags take no value: give the flag alone to turn it on"
    with pytest.raises(ConfigError) as err:
        apply_overrides({}, ["lr"])
    assert "key.path=value" in err.value.hint


def test_a_run_failure_is_one_line_and_exit_3():
    done = toy("failing")
    assert done.returncode == 3
    assert done.stderr.strip() == "error: the grading workers fail to start"


def test_an_unexpected_exception_is_one_internal_error_line_and_exit_70(monkeypatch):
    """A bug in pt reaches the user as one line saying so and how to see the traceback,
    exit 70 (EX_SOFTWARE); with PT_TRACEBACK=1 the traceback is printed."""
    monkeypatch.delenv("PT_TRACEBACK", raising=False)
    done = toy("broken")
    assert done.returncode == 70
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == "error: internal error: KeyError: 'missing'"
    assert "PT_TRACEBACK=1" in done.stderr
    monkeypatch.setenv("PT_TRACEBACK", "1")
    done = toy("broken")
    assert done.returncode == 1 and "Traceback" in done.stderr and "KeyError" in done.stderr
