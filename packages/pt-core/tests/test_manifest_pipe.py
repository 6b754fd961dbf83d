"""The piping contract, shown with two toy stages: the first writes a file and prints its
manifest; the second, given '-', reads that manifest from stdin and uses its path."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import pytest

from pt_core.errors import InputError
from pt_core.manifest import emit_manifest, read_manifest, resolve_input

PRODUCER = textwrap.dedent(
    """
    import sys
    from pt_core.files import write_rows
    from pt_core.log import get_logger, setup_logging
    from pt_core.manifest import emit_manifest
    setup_logging()
    out = sys.argv[1]
    get_logger("toy").info("writing 3 rows")          # logs go to stderr
    write_rows(out, [{"x": i} for i in range(3)])
    emit_manifest("dataset", out, rows=3)
    """
)

CONSUMER = textwrap.dedent(
    """
    import sys
    from pt_core.cli import report_error
    from pt_core.errors import PtError
    from pt_core.files import read_rows
    from pt_core.manifest import emit_manifest, resolve_input
    try:
        path, upstream = resolve_input(sys.argv[1], expected=("dataset",))
    except PtError as exc:
        report_error(exc)
        sys.exit(exc.exit_code)
    total = sum(r["x"] for r in read_rows(path))
    emit_manifest("grades", path, total=total, upstream_rows=upstream["rows"] if upstream else None)
    """
)


def _run(code, *args, stdin=None):
    return subprocess.run(
        [sys.executable, "-c", code, *args], stdin=stdin, capture_output=True, text=True
    )


def test_two_stages_pipe_through_a_manifest(tmp_path):
    out = tmp_path / "toy.jsonl"
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    consumer = subprocess.run(
        [sys.executable, "-c", CONSUMER, "-"], stdin=producer.stdout, capture_output=True, text=True
    )
    producer.stdout.close()
    assert producer.wait() == 0
    assert consumer.returncode == 0, consumer.stderr
    lines = consumer.stdout.splitlines()
    assert len(lines) == 1, "a stage prints exactly one line on stdout"
    import json

    manifest = json.loads(lines[0])
    assert manifest == {
        "kind": "grades",
        "path": str(out.resolve()),
        "total": 3,
        "upstream_rows": 3,
    }
    assert "writing 3 rows" in producer.stderr.read().decode()


def test_standalone_path_works_without_a_pipe(tmp_path):
    out = tmp_path / "toy.jsonl"
    assert _run(PRODUCER, str(out)).returncode == 0
    consumer = _run(CONSUMER, str(out), stdin=subprocess.DEVNULL)
    assert consumer.returncode == 0
    assert '"total": 3' in consumer.stdout


def test_empty_stdin_is_a_clear_error(tmp_path):
    consumer = _run(CONSUMER, "-", stdin=subprocess.DEVNULL)
    assert consumer.returncode == 2
    assert "no manifest on stdin" in consumer.stderr
    assert consumer.stdout == ""


def test_terminal_stdin_is_a_clear_error():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    with pytest.raises(InputError, match="stdin is a terminal"):
        read_manifest(Tty(""))


def test_closed_stdin_is_a_clear_error(monkeypatch):
    # A process started with stdin closed (`cmd <&-`) has sys.stdin None.
    monkeypatch.setattr(sys, "stdin", None)
    with pytest.raises(InputError, match="stdin is closed"):
        read_manifest()


def test_wrong_kind_and_noise_lines():
    stream = io.StringIO('loading...\n{"kind": "checkpoint", "path": "/x"}\n')
    with pytest.raises(InputError, match="of kind 'checkpoint'"):
        read_manifest(stream, expected=("dataset",))
    stream = io.StringIO('{"not": "a manifest"}\n{"kind": "dataset", "path": "/d", "rows": 1}\n')
    path, manifest = resolve_input("-", expected=("dataset",), stream=stream)
    assert str(path) == "/d" and manifest["rows"] == 1


def test_emit_writes_one_line_with_absolute_path(tmp_path):
    buf = io.StringIO()
    emit_manifest("dataset", "rel/path", stream=buf, rows=1)
    assert buf.getvalue().count("\n") == 1
    assert '"path": "/' in buf.getvalue()


def test_a_command_exit_code_reaches_the_shell():
    """A stage that exits with a code (pt-train's 85 after a checkpoint on SIGTERM) must
    leave the process with that code, not 0: pt-slurm requeues on it."""
    code = textwrap.dedent(
        """
        import typer
        from pt_core.cli import make_app, make_main
        app = make_app("toy", "toy", "0")
        @app.command()
        def stop():
            raise typer.Exit(85)
        @app.command()
        def other():
            pass
        make_main(app)()
        """
    )
    assert _run(code, "stop").returncode == 85
    assert _run(code, "other").returncode == 0


def test_a_log_file_gets_one_whole_line_per_record():
    """Into a file or a pipe (a SLURM job's log, where srun puts "N: " before each line), a
    long message is one line, not wrapped at 80 columns: a message stays greppable whole."""
    message = "shard 0/2 done; " + "word " * 40 + "/a/long/path"
    code = textwrap.dedent(
        f"""
        from pt_core.log import get_logger, setup_logging
        setup_logging()
        get_logger("toy").info({message!r})
        get_logger("toy").warning("short")
        """
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"INFO     {message}", "WARNING  short"]
