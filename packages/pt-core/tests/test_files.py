"""Row files and atomic writes: malformed input is named by file and line, and an output
is either complete or absent."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap

import pytest

from pt_core.errors import InputError
from pt_core.files import (
    JsonlAppender,
    atomic_path,
    atomic_write_text,
    count_rows,
    iter_rows,
    process_umask,
    read_rows,
    require_columns,
    write_rows,
)

ROWS = [{"id": "a", "messages": [{"role": "user", "content": "hi"}]}, {"id": "b", "messages": []}]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_rows_round_trip(tmp_path, suffix):
    path = write_rows(tmp_path / f"rows{suffix}", ROWS)
    assert read_rows(path) == ROWS
    assert count_rows(path) == 2


def test_json_array_and_shard_directory(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(ROWS))
    assert read_rows(tmp_path / "a.json") == ROWS
    shards = tmp_path / "shards"
    write_rows(shards / "part-00000.parquet", ROWS[:1])
    write_rows(shards / "part-00001.parquet", ROWS[1:])
    assert [r["id"] for r in iter_rows(shards)] == ["a", "b"]


def test_malformed_jsonl_line_is_named_or_skipped(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n{"a": 2,\n{"a": 3}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: malformed JSON line"):
        read_rows(p)
    bad = [0]
    assert [r["a"] for r in iter_rows(p, skip_bad=True, bad_counter=bad)] == [1, 3]
    assert bad == [1]


def test_missing_column_names_existing_columns():
    with pytest.raises(InputError) as err:
        require_columns({"question": "q", "answer": "a"}, ["problem"], "gsm8k.jsonl")
    assert "missing column(s) 'problem'" in str(err.value)
    assert "'question', 'answer'" in str(err.value)


def test_failed_atomic_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.jsonl"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash while writing")
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_replaces_old_output_whole(tmp_path):
    target = tmp_path / "dataset"
    for version in ("old", "new"):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / f"{version}.txt").write_text(version)
    assert [p.name for p in target.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["dataset"]


def test_appender_survives_a_torn_last_line(tmp_path):
    out = tmp_path / "rollouts.jsonl"
    app = JsonlAppender(out)
    app.write([{"i": 0}, {"i": 1}])
    app.close()
    with open(app.partial, "a") as fh:  # a crash in the middle of a line
        fh.write('{"i": 2, "compl')
    again = JsonlAppender(out)
    assert [r["i"] for r in again.existing_rows()] == [0, 1]
    again.write([{"i": 2}])
    assert again.finalize() == out
    assert [r["i"] for r in read_rows(out)] == [0, 1, 2]
    assert not app.partial.exists()


def test_split_path_picks_a_split_of_a_dataset_directory(tmp_path):
    from pt_core.files import split_path

    write_rows(tmp_path / "ds" / "train" / "part-00000.parquet", ROWS)
    write_rows(tmp_path / "ds" / "test" / "part-00000.parquet", ROWS[:1])
    assert split_path(tmp_path / "ds") == tmp_path / "ds" / "train"
    assert len(read_rows(split_path(tmp_path / "ds", "test"))) == 1
    with pytest.raises(InputError, match="no split 'validation'; the dataset has: test, train"):
        split_path(tmp_path / "ds", "validation")
    plain = write_rows(tmp_path / "rows.jsonl", ROWS)
    assert split_path(plain, "test") == plain


@pytest.fixture(params=[0o022, 0o077], ids=["umask022", "umask077"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def test_outputs_get_the_modes_of_the_process_umask(tmp_path, umask):
    """An output is as readable as a file the user made with `touch`/`mkdir`: 0644/0755
    under umask 022, 0600/0700 under 077, even where the writer used a private temporary
    file of its own (mkstemp makes 0600, as safetensors' save_file does), and an
    executable keeps its execute bits within the umask."""
    file_mode, dir_mode = 0o666 & ~umask, 0o777 & ~umask
    single = atomic_write_text(tmp_path / "manifest.json", "{}")
    with atomic_path(tmp_path / "checkpoint") as tmp:
        tmp.mkdir()
        (tmp / "sub").mkdir()
        fd, private = tempfile.mkstemp(dir=tmp / "sub")
        os.write(fd, b"weights")
        os.close(fd)
        os.replace(private, tmp / "sub" / "model.safetensors")
        (tmp / "run.sh").write_text("#!/bin/sh\n")
        (tmp / "run.sh").chmod(0o700)
    out = tmp_path / "checkpoint"

    def mode(p):
        return stat.S_IMODE(p.stat().st_mode)

    assert mode(single) == file_mode
    assert mode(out) == dir_mode and mode(out / "sub") == dir_mode
    assert mode(out / "sub" / "model.safetensors") == file_mode
    assert mode(out / "run.sh") == dir_mode  # rwx for whom the umask lets have it


def test_process_umask_reads_without_changing_it(umask):
    assert process_umask() == umask
    assert process_umask() == umask


def test_the_malformed_line_hint_offers_skip_bad_only_to_commands_that_have_it(tmp_path):
    """'pass --skip-bad' is advice only a command with that flag can follow: a tool
    without it (or a caller from Python) is told to fix the line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(InputError) as err:
        read_rows(bad)
    assert err.value.hint == "fix or remove that line"
    code = textwrap.dedent(
        """
        import sys
        import typer
        from pt_core.cli import make_app, make_main
        from pt_core.files import read_rows
        app = make_app("toy", "toy", "0")
        @app.command()
        def lenient(path: str, skip_bad: bool = typer.Option(False, "--skip-bad")):
            read_rows(path, skip_bad=skip_bad)
        @app.command()
        def strict(path: str):
            read_rows(path)
        make_main(app)()
        """
    )
    lenient = subprocess.run(
        [sys.executable, "-c", code, "lenient", str(bad)], capture_output=True, text=True
    )
    strict = subprocess.run(
        [sys.executable, "-c", code, "strict", str(bad)], capture_output=True, text=True
    )
    assert lenient.returncode == strict.returncode == 2
    assert "bad.jsonl:2: malformed JSON line" in lenient.stderr
    assert "pass --skip-bad" in lenient.stderr
    assert "bad.jsonl:2: malformed JSON line" in strict.stderr
    assert "skip-bad" not in strict.stderr
    assert "fix or remove that line" in strict.stderr
