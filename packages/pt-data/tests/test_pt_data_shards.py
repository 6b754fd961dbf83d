"""A build in chunks: split into shards run as separate processes, killed (SIGKILL) and
resumed, on one worker or two. Each ends with the same bytes as one uninterrupted build
in one process: every parquet file and dataset.json."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pt_data.mix import SeenKeys

BIN = Path(sys.executable).parent
ROWS = 1200
CHUNK = 100


def chat_rows(n: int, seed: int = 0) -> list[dict]:
    """Conversations of one or two turns, some repeated (de-duplication drops them), some
    too long for max_seq_length (dropped after tokenizing, counted per chunk)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "sum", "of", "is", "the", "answer"]
    rows = []
    for i in range(n):
        if i % 50 == 49:
            rows.append(rows[i // 2])  # a repeat
            continue
        msgs = []
        for _ in range(1 + (i % 3 == 2)):
            long = 300 if i % 37 == 0 else 12
            msgs += [
                {"role": "user", "content": f"q{i} " + " ".join(rng.choices(words, k=8))},
                {"role": "assistant", "content": " ".join(rng.choices(words, k=long))},
            ]
        rows.append({"messages": msgs})
    return rows


@pytest.fixture
def project(tmp_path, tiny_tokenizer_dir):
    """A config over two sources (one weighted 1.5), a validation split, the transform
    ``slow:messages`` (the messages, a millisecond a row: a build that lasts long enough
    to be killed mid-way), and the tiny tokenizer."""
    for name, seed in (("a", 0), ("b", 1)):
        rows = chat_rows(ROWS // 2, seed)
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "slow.py").write_text(
        "import time\n\ndef messages(row):\n    time.sleep(0.001)\n"
        "    return {'messages': row['messages']}\n"
    )
    data = {
        "datasets": [
            {"source": str(tmp_path / "a.jsonl"), "transform": "slow:messages"},
            {"source": str(tmp_path / "b.jsonl"), "transform": "slow:messages", "weight": 1.5},
        ],
        "validation_split": 0.1,
        "chunk_rows": CHUNK,
        "shard_rows": 70,
        "num_proc": 1,
        "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), "max_seq_length": 256},
    }
    (tmp_path / "data.yaml").write_text(yaml.safe_dump({"data": data}))
    return tmp_path


def default_sigint() -> None:
    """SIGINT as a shell's Ctrl-C finds a program: not ignored (a test runner's process
    may ignore it, and what it starts would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def build(project: Path, out: str, *args: str, wait: bool = True, ctrl_c: bool = False):
    env = {**os.environ, "PYTHONPATH": str(project), "COLUMNS": "80"}
    argv = [str(BIN / "pt-data"), "build", "data.yaml", "--out", out, *args]
    proc = subprocess.Popen(
        argv,
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its tokenizer processes are killed with it
        preexec_fn=default_sigint if ctrl_c else None,  # (a plain process, not a fork)
    )
    if not wait:
        return proc
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return stdout, stderr


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def whole(project):
    """The build in one process, uninterrupted: what every other way must equal."""
    stdout, _ = build(project, "whole")
    manifest = json.loads(stdout)
    assert manifest["splits"]["train"] > 0 and manifest["splits"]["validation"] > 0
    assert manifest["dropped"]["duplicate"] > 0 and manifest["dropped"]["too_long"] > 0
    assert not (project / "whole.build").exists()  # the chunks go once assembled
    return files(project / "whole")


def chunks_of(whole: dict[str, bytes]) -> int:
    """How many chunks the mixed rows (after dedup and weights) make."""
    info = json.loads(whole["dataset.json"])
    return -(-sum(s["rows"] for s in info["sources"].values()) // CHUNK)


def test_two_shards_in_two_processes_build_the_same_bytes(project, whole):
    """``--shard 0/2`` and ``--shard 1/2`` at once: each builds its own chunks, the last to
    finish assembles the dataset and prints its manifest; the other prints none."""
    procs = [build(project, "sharded", "--shard", f"{i}/2", wait=False) for i in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    manifests = [json.loads(out) for out, _ in outs if out.strip()]
    assert len(manifests) >= 1 and all(m["path"].endswith("sharded") for m in manifests)
    assert files(project / "sharded") == whole
    assert not (project / "sharded.build").exists()


def test_shards_run_one_after_the_other_and_the_last_assembles(project, whole):
    """A shard that ends first says how many chunks are left, prints no manifest, and
    leaves its chunks; the second one assembles."""
    n = chunks_of(whole)
    assert n > 10
    stdout, stderr = build(project, "seq", "--shard", "1/2")
    assert stdout == ""
    assert f"{(n + 1) // 2} of {n} chunks still to build" in " ".join(stderr.split())
    assert sorted(p.name for p in (project / "seq.build" / "chunks").glob("*.json")) == [
        f"{c:05d}.json" for c in range(1, n, 2)
    ]
    assert not (project / "seq").exists()
    stdout, _ = build(project, "seq", "--shard", "0/2")
    assert json.loads(stdout)["path"].endswith("seq")
    assert files(project / "seq") == whole


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "ctrl-c"])
def test_a_build_stopped_mid_way_resumes_at_its_last_complete_chunk(project, whole, sig):
    """SIGKILL, or Ctrl-C (SIGINT to the process group, tokenizer processes included), to
    a build of two workers after its third chunk; Ctrl-C ends it at once with exit 130
    and says what was kept. The same command again keeps the complete chunks, builds the
    rest and ends with the same bytes."""
    proc = build(project, "killed", "data.num_proc=2", wait=False, ctrl_c=sig == signal.SIGINT)
    chunks = project / "killed.build" / "chunks"
    deadline = time.monotonic() + 120
    while len(list(chunks.glob("*.json"))) < 3 and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    os.killpg(proc.pid, sig)
    _, stderr = proc.communicate(timeout=60)  # (a worker that held the task queue's lock
    kept = len(list(chunks.glob("*.json")))  # when interrupted would hang it here)
    assert 3 <= kept < chunks_of(whole) and not (project / "killed").exists()
    if sig == signal.SIGINT:
        assert proc.returncode == 130
        assert f"interrupted: the complete chunks ({kept}) are kept" in " ".join(stderr.split())

    _, stderr = build(project, "killed", "data.num_proc=2")
    assert f"{kept} chunks already complete" in " ".join(stderr.split())
    two = files(project / "killed")
    assert json.loads(two.pop("dataset.json"))["config"]["num_proc"] == 2
    assert two == {k: v for k, v in whole.items() if k != "dataset.json"}
    assert not (project / "killed.build").exists()


def test_chunks_of_another_source_are_not_resumed(project, whole):
    """A source file changed after a build stopped: its chunks are discarded (with a
    warning), and the build is that of the new file."""
    build(project, "changed", "--shard", "0/2")  # half the chunks, then stops
    rows = chat_rows(ROWS // 2, 7)
    (project / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, stderr = build(project, "changed")
    assert "discarding the unfinished build" in " ".join(stderr.split())
    build(project, "fresh")
    assert files(project / "changed") == files(project / "fresh") != whole


def test_two_workers_build_the_same_bytes_as_one(project, whole):
    build(project, "two", "data.num_proc=2")
    two = files(project / "two")
    one_manifest, two_manifest = json.loads(whole["dataset.json"]), json.loads(two["dataset.json"])
    assert two_manifest["config"].pop("num_proc") == 2
    assert one_manifest["config"].pop("num_proc") == 1
    assert one_manifest == two_manifest
    assert {k: v for k, v in two.items() if k != "dataset.json"} == {
        k: v for k, v in whole.items() if k != "dataset.json"
    }


@pytest.mark.parametrize("shard", ["2/2", "0/0", "a/2", "1", "-1/2"])
def test_a_shard_that_is_not_i_of_n_is_refused(project, shard, cli):
    proc = cli("pt-data", "build", project / "data.yaml", "--shard", shard, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "--shard" in proc.stderr and "0 <= i < N" in " ".join(proc.stderr.split())
    assert not list(project.glob("*.build"))


def test_the_dedup_keys_agree_with_a_set_across_merges():
    """The 8-byte keys, merged into the sorted array every 64 keys, answer as a set does."""
    rng = random.Random(0)
    keys = [rng.getrandbits(64) for _ in range(700)]
    stream = [rng.choice(keys) for _ in range(3000)]
    seen, reference = SeenKeys(recent=64), set()
    for key in stream:
        assert seen.add(key) == (key not in reference)
        reference.add(key)
    assert len(seen) == len(reference) and seen.old.size > 0


def test_stats_of_a_built_dataset_count_what_a_loop_over_its_rows_counts(project, whole):
    """The columnar count (Arrow, a batch at a time) of sequence lengths and trained
    tokens equals one worked out row by row and token by token, over several files."""
    from pt_core.files import read_rows, split_path
    from pt_data.stats import lengths_from_dataset

    root = project / "whole"
    rows = read_rows(split_path(root, "train"))
    assert len(list((root / "train").glob("*.parquet"))) > 1
    lengths = [n for r in rows for n in r["seq_lens"]]
    trained = [sum(1 for x in r["labels"] if x != -100) for r in rows]
    got = lengths_from_dataset(root, "train")["train"]
    assert got == {"lengths": lengths, "trained": trained, "rows": [len(rows)]}
    assert sum(trained) == json.loads(whole["dataset.json"])["counts"]["train"]["trained_tokens"]


def test_a_shard_still_reading_when_another_assembles_takes_its_dataset(
    project, whole, monkeypatch, caplog
):
    """Shard 1/2 has built its last chunk and reads on through the rows of the next when
    shard 0/2 assembles the dataset and removes the chunks: it builds nothing again, and
    ends with the dataset the other assembled."""
    import shutil

    from pt_data.build import Builder
    from pt_data.config import load_data_config

    monkeypatch.syspath_prepend(str(project))
    cfg = load_data_config(project / "data.yaml")
    out = project / "raced"
    build(project, "raced", "--shard", "1/2")  # the odd chunks, then it stops
    n = chunks_of(whole)
    builder = Builder(cfg)
    rows = builder.mixer.rows

    def rows_and_the_other_shard_assembles():
        for k, item in enumerate(rows()):
            if k == (n - 1) * CHUNK + 1:  # into the last chunk, which shard 0/2 owns
                shutil.copytree(project / "whole", out)  # what shard 0/2 assembled
                shutil.rmtree(project / "raced.build")
            yield item

    assert n % 2 == 1  # the last chunk is shard 0/2's
    monkeypatch.setattr(builder.mixer, "rows", rows_and_the_other_shard_assembles)
    pt_logger = logging.getLogger("pt")  # pt's logs go to stderr, not to the root logger
    pt_logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("INFO", logger="pt"):
            info = builder.run(out, (1, 2))
    finally:
        pt_logger.removeHandler(caplog.handler)
    assert (
        info is not None and info["config_hash"] == json.loads(whole["dataset.json"])["config_hash"]
    )
    assert files(out) == whole and not (project / "raced.build").exists()
    said = " ".join(caplog.text.split())
    assert "shard 1/2 done; the other shards had built the rest by then, and one of them" in said


def test_shards_with_the_real_shape_tokenizer_build_the_same_bytes(project, qwen_tokenizer_dir):
    """The Qwen vocabulary (151k ids, ``<|im_end|>`` ending a turn, not the EOS): two
    shards one after the other equal one build, and every packed sequence's trained
    tokens end with ``<|im_end|>``."""
    from transformers import AutoTokenizer

    from pt_core.files import read_rows, split_path

    qwen = f"data.tokenizer.name_or_path={qwen_tokenizer_dir}"
    build(project, "qwen-whole", qwen)
    build(project, "qwen-sharded", "--shard", "1/2", qwen)
    build(project, "qwen-sharded", "--shard", "0/2", qwen)
    assert files(project / "qwen-sharded") == files(project / "qwen-whole")
    im_end = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir)).convert_tokens_to_ids(
        "<|im_end|>"
    )
    rows = read_rows(split_path(project / "qwen-whole", "train"))
    assert max(i for r in rows for i in r["input_ids"]) > 100_000 or im_end > 100_000
    for row in rows:
        at = 0
        for n in row["seq_lens"]:
            trained = [x for x in row["labels"][at : at + n] if x != -100]
            assert trained and trained[-1] == im_end
            at += n
