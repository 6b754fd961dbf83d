"""The data fingerprint a run stores and checks on resume: the same rows give the same
fingerprint wherever they lie, and a dataset changed in place is refused with both
fingerprints, what changed, and --force-resume."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from pt_core.errors import ConfigError
from pt_core.files import write_rows
from pt_train.fingerprint import (
    EDGE_BYTES,
    FINGERPRINT_FILE,
    check_data_fingerprint,
    data_fingerprint,
    read_data_fingerprint,
    write_data_fingerprint,
)

ROWS = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}, {"input_ids": [4], "labels": [4]}]


def dataset_dir(root, *, config_hash="abc123", shards=2):
    """A pt-data dataset directory: dataset.json and train/ and test/ shards."""
    for i in range(shards):
        write_rows(root / "train" / f"part-{i:05d}.parquet", ROWS)
    write_rows(root / "test" / "part-00000.parquet", ROWS[:1])
    info = {"config_hash": config_hash, "splits": {"train": 2 * shards, "test": 1}}
    (root / "dataset.json").write_text(json.dumps(info))
    return root


def test_a_file_keeps_its_fingerprint_when_copied_and_loses_it_when_changed(tmp_path):
    data = write_rows(tmp_path / "rows.jsonl", ROWS)
    first = data_fingerprint(data)
    assert data_fingerprint(data) == first
    copy = tmp_path / "elsewhere" / "rows.jsonl"
    copy.parent.mkdir()
    shutil.copy(data, copy)  # a new file: another path and modification time
    os.utime(copy, (1, 1))
    moved = data_fingerprint(copy)
    assert moved["digest"] == first["digest"] and moved["path"] != first["path"]
    write_rows(data, [*ROWS, {"input_ids": [5], "labels": [5]}])
    assert data_fingerprint(data)["digest"] != first["digest"]


def test_a_file_is_read_at_its_two_ends_only(tmp_path):
    """Cheap by design: a big file's first and last EDGE_BYTES and its size. A byte changed
    at either end is seen; one in the middle, with the size kept, is not."""
    big = tmp_path / "big.jsonl"
    body = bytearray(b"x" * (3 * EDGE_BYTES))
    big.write_bytes(body)
    base = data_fingerprint(big)["digest"]
    for offset, seen in ((10, True), (len(body) - 10, True), (int(1.5 * EDGE_BYTES), False)):
        changed = bytearray(body)
        changed[offset] = ord("y")
        big.write_bytes(changed)
        assert (data_fingerprint(big)["digest"] != base) is seen, offset


def test_a_dataset_directory_is_fingerprinted_by_its_config_rows_and_split_shards(tmp_path):
    ds = dataset_dir(tmp_path / "ds")
    fp = data_fingerprint(ds, "train")
    assert fp["config_hash"] == "abc123" and fp["rows"] == 4
    assert sorted(fp["files"]) == ["part-00000.parquet", "part-00001.parquet"]
    # another split is not what the run reads: changing it changes nothing
    write_rows(ds / "test" / "part-00000.parquet", ROWS)
    assert data_fingerprint(ds, "train")["digest"] == fp["digest"]
    # a rebuild with another config is another dataset, even with the same shards
    info = json.loads((ds / "dataset.json").read_text())
    (ds / "dataset.json").write_text(json.dumps({**info, "config_hash": "def456"}))
    assert data_fingerprint(ds, "train")["digest"] != fp["digest"]


def test_resuming_on_changed_data_is_refused_with_both_fingerprints(tmp_path):
    run = tmp_path / "runs" / "sft"
    run.mkdir(parents=True)
    ds = dataset_dir(tmp_path / "ds")
    started = data_fingerprint(ds)
    check_data_fingerprint(run, started)  # nothing stored yet (a run from before): no check
    assert write_data_fingerprint(run, started) == run / FINGERPRINT_FILE
    assert read_data_fingerprint(run) == started
    check_data_fingerprint(run, data_fingerprint(ds))  # same data: resumes

    write_rows(ds / "train" / "part-00002.parquet", ROWS)  # the dataset grew in place
    now = data_fingerprint(ds)
    with pytest.raises(ConfigError) as err:
        check_data_fingerprint(run, now)
    message = err.value.message
    assert f"has fingerprint {now['digest']} now, {started['digest']} when the run started" in (
        message
    )
    assert "added: part-00002.parquet" in message
    assert "--force-resume" in err.value.hint
    check_data_fingerprint(run, now, force_resume=True)  # forced: goes on


def test_a_missing_path_is_the_usual_input_error(tmp_path):
    from pt_core.errors import InputError

    with pytest.raises(InputError, match="no such file or directory"):
        data_fingerprint(tmp_path / "nope.jsonl")
