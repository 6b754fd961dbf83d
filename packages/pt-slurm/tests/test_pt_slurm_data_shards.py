"""A data stage on two nodes of the local SLURM: each node builds one shard of the build
(``--shard $SLURM_PROCID/$SLURM_NTASKS``), the last to finish assembles the dataset, and
the dataset is the same, byte for byte, as ``pt-data build`` in one process."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BIN = Path(sys.executable).parent


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_a_data_stage_on_two_nodes_builds_one_shard_each_and_the_same_bytes(
    slurm_cluster, tmp_path, cli, tiny_tokenizer_dir
):
    if len(slurm_cluster.nodes) < 2:
        pytest.skip("the local cluster has one node (this machine's hostname is localhost)")
    rng = random.Random(0)
    words = ["one", "two", "three", "plus", "makes", "and", "so", "the"]
    with open(tmp_path / "chats.jsonl", "w") as fh:
        for i in range(800):
            messages = [
                {"role": "user", "content": f"q{i} " + " ".join(rng.choices(words, k=6))},
                {
                    "role": "assistant",
                    "content": " ".join(rng.choices(words, k=rng.randint(3, 40))),
                },
            ]
            fh.write(json.dumps({"messages": messages}) + "\n")
    config = {
        "run_name": "data-2",
        "output_dir": str(tmp_path / "runs"),
        "data": {
            "datasets": [{"source": str(tmp_path / "chats.jsonl")}],
            "output_dir": str(tmp_path / "sharded"),
            "chunk_rows": 60,
            "shard_rows": 50,
            "validation_split": 0.1,
            "num_proc": 1,
            "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), "max_seq_length": 128},
        },
        "slurm": {"nodes": 2, "env": {"OMP_NUM_THREADS": 1, "HF_HUB_OFFLINE": 1}},
    }
    path = tmp_path / "data.yaml"
    path.write_text(yaml.safe_dump(config))
    manifest = json.loads(cli("pt-slurm", "submit", path, "--stage", "data").stdout)
    run_dir = Path(manifest["path"])
    state = slurm_cluster.wait_final(manifest["job_id"], run_dir, timeout=300)
    assert state["status"] == "completed", state

    result = json.loads((run_dir / "slurm" / "manifest.json").read_text())
    assert result["kind"] == "dataset" and result["path"] == str(tmp_path / "sharded")
    (err,) = (run_dir / "slurm").glob("slurm-*.err")
    log = err.read_text()
    # both nodes built a shard; the one that ended first left the assembly to the other,
    # or, where both ended at once, the one that took the lock second found it assembled
    # (each said in one whole line under srun's "N: " label)
    assert "building shard 0/2" in log and "building shard 1/2" in log
    endings = [
        line
        for line in log.splitlines()
        if "chunks still to build by the other shards" in line
        or "had built the rest by then, and one of them assembled" in line
    ]
    assert len(endings) == 1 and endings[0][:3] in ("0: ", "1: "), log
    assert not (tmp_path / "sharded.build").exists()

    single = subprocess.run(
        [BIN / "pt-data", "build", path, "--out", tmp_path / "single"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(single.stdout)["rows"] == result["rows"]
    assert files(tmp_path / "sharded") == files(tmp_path / "single")
