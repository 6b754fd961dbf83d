"""A full disk in `pt-eval grade`: one `error:` line naming the grades file and "no space
left", exit 74, and no grades file or temporary left (grades are written whole)."""

from __future__ import annotations

import json

from pt_core.errors import DiskFull


def test_grading_onto_a_full_disk_names_the_grades_file_and_leaves_nothing(
    tmp_path, small_disk, cli
):
    disk = small_disk(1)
    predictions = tmp_path / "predictions.jsonl"
    with open(predictions, "w") as fh:
        for i in range(50):
            fh.write(json.dumps({"id": i, "completion": f"\\boxed{{{i}}}", "answer": str(i)}))
            fh.write("\n")
    disk.fill()

    grades = disk.path / "grades.jsonl"
    proc = cli("pt-eval", "grade", predictions, "--out", grades, "--workers", "1", check=False)

    err = " ".join(proc.stderr.split())
    assert proc.returncode == DiskFull.exit_code == 74, err
    assert proc.stdout == "" and "Traceback" not in err
    assert err.count("error:") == 1
    assert f"error: {grades}: no space left on the device; no grades written" in err
    assert sorted(p.name for p in disk.path.iterdir()) == ["filler"]
