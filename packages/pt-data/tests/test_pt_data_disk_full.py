"""A full disk in `pt-data build`: one `error:` line naming the output directory and "no
space left", exit 74, and nothing left on the disk (the dataset is written whole or not at
all)."""

from __future__ import annotations

import json

from pt_core.errors import DiskFull


def test_building_onto_a_full_disk_names_the_output_and_leaves_nothing(tmp_path, small_disk, cli):
    disk = small_disk(4)
    with open(tmp_path / "raw.jsonl", "w") as fh:
        for i in range(200):
            messages = [
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": f"{i} + {i} = {2 * i}. " * 20},
            ]
            fh.write(json.dumps({"messages": messages}) + "\n")
    (tmp_path / "data.yaml").write_text(
        f"data:\n  datasets:\n    - source: {tmp_path / 'raw.jsonl'}\n"
        f"  output_dir: {disk.path / 'sft'}\n"
    )
    disk.fill()

    proc = cli("pt-data", "build", tmp_path / "data.yaml", check=False)

    err = " ".join(proc.stderr.split())
    assert proc.returncode == DiskFull.exit_code == 74, err
    assert proc.stdout == "" and "Traceback" not in err
    assert err.count("error:") == 1
    assert f"error: {disk.path / 'sft'}: no space left on the device; nothing written there" in err
    assert sorted(p.name for p in disk.path.iterdir()) == ["filler"]
