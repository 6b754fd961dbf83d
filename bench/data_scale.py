"""``pt-data build`` at the sizes users bring: rows/s and peak memory at 0.25M, 1M and 4M
chat rows, one worker against two, and TRL's tokenize-and-pack on the same rows.

The rows: synthetic chats in ``messages`` form, 20-360 words a row (a third of them two
turns), words drawn from a vocabulary of 5,000 made-up words, the same for a given row
index at every size. The tokenizer: a byte-level BPE of 512 tokens with ChatML, trained
by ``pt-data tokenizer`` on the first 2,000 rows (as the quickstart makes its own). The
build: ``max_seq_length: 2048``, packing, the default ``chunk_rows`` (200,000) and
``num_proc`` (every CPU).

For each size, ``pt-data build`` runs as its own process; its memory is sampled every
0.2 s as the sum of the resident memory of the process and its tokenizer processes
(pages the forked processes share are counted in each: an upper bound).

* ``--workers-rows N``: the first N rows built with ``num_proc: 1`` and ``num_proc: 2``,
  the ratio of their rows/s, and whether the outputs are the same bytes;
* ``--trl-rows N``: TRL's ``SFTTrainer._prepare_dataset`` (assistant-only loss, BFD
  packing, ``dataset_num_proc`` = the build's processes) on the first N rows, rows/s,
  against the build's rows/s at 1M (or the largest size run).

    uv run --no-sync python bench/data_scale.py [--sizes 250000,1000000,4000000]
        [--workers-rows 100000] [--trl-rows 100000] [--work DIR]

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def vocabulary() -> list[str]:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choices(letters, k=rng.randint(2, 9))) for _ in range(5000)]


def chat(i: int, vocab: list[str]) -> list[dict]:
    """Row ``i``: 20-360 words, a fifth of each turn's words the user's."""
    rng = random.Random(i)
    words = rng.randint(20, 360)
    turns = 2 if i % 3 == 2 else 1
    messages = []
    for t in range(turns):
        share = words // turns if t < turns - 1 else words - (words // turns) * (turns - 1)
        user = max(1, share // 5)
        messages.append({"role": "user", "content": " ".join(rng.choices(vocab, k=user))})
        messages.append(
            {"role": "assistant", "content": " ".join(rng.choices(vocab, k=share - user))}
        )
    return messages


def write_rows(path: Path, n: int) -> Path:
    """The first ``n`` rows, written once (a larger file's prefix is reused)."""
    if path.exists():
        return path
    vocab = vocabulary()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"messages": chat(i, vocab)}) + "\n")
    tmp.rename(path)
    return path


def make_tokenizer(work: Path) -> Path:
    out = work / "tokenizer"
    if not out.exists():
        sample = write_rows(work / "rows-2000.jsonl", 2000)
        subprocess.run(
            [BIN / "pt-data", "tokenizer", "--texts", sample, "--out", out],
            check=True, capture_output=True,
        )  # fmt: skip
    return out


def build(work: Path, rows: Path, tokenizer: Path, out: Path, num_proc: int | None = None):
    """``pt-data build`` of ``rows`` in its own process: seconds, peak RSS (bytes) of the
    process tree and of the main process, and the manifest."""
    import psutil

    data = {
        "datasets": [{"source": str(rows)}],
        "tokenizer": {"name_or_path": str(tokenizer), "max_seq_length": 2048, "packing": True},
    }
    if num_proc is not None:
        data["num_proc"] = num_proc
    config = work / f"{out.name}.yaml"
    config.write_text(json.dumps({"data": data}))  # JSON is YAML
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(out.with_name(out.name + ".build"), ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [BIN / "pt-data", "build", config, "--out", out],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    main = psutil.Process(proc.pid)
    peak_tree = peak_main = 0
    while proc.poll() is None:
        try:
            procs = [main, *main.children(recursive=True)]
            rss = []
            for p in procs:
                try:
                    rss.append(p.memory_info().rss)
                except psutil.Error:
                    rss.append(0)
            peak_tree, peak_main = max(peak_tree, sum(rss)), max(peak_main, rss[0])
        except psutil.Error:
            pass
        time.sleep(0.2)
    stdout = proc.stdout.read() if proc.stdout else ""
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"pt-data build of {rows} failed (exit {proc.returncode})")
    return seconds, peak_tree, peak_main, json.loads(stdout)


def same_bytes(a: Path, b: Path) -> bool:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*.parquet"))
    if names != sorted(str(p.relative_to(b)) for p in b.rglob("*.parquet")):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def run_trl(rows: Path, n: int, tokenizer: Path, num_proc: int) -> float:
    """TRL's tokenize-and-pack of the first ``n`` rows: rows/s."""
    sys.path.insert(0, str(ROOT / "bench"))
    from data_vs_trl import TEMPLATE
    from data_vs_trl import run_trl as trl_prepare
    from transformers import AutoTokenizer

    from pt_core.files import iter_rows

    tok = AutoTokenizer.from_pretrained(str(tokenizer))
    tok.chat_template = TEMPLATE  # ChatML with {% generation %}: TRL's assistant mask
    convos = []
    for row in iter_rows(rows):
        if len(convos) >= n:
            break
        convos.append(row["messages"])
    seconds, _, _ = trl_prepare(convos, tok, 2048, num_proc)
    return n / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="250000,1000000,4000000")
    parser.add_argument("--workers-rows", type=int, default=100000)
    parser.add_argument("--trl-rows", type=int, default=100000)
    parser.add_argument("--work", type=Path, default=None, help="where rows and builds go")
    opts = parser.parse_args()
    sizes = [int(s) for s in opts.sizes.split(",") if s]

    from pt_data.tokenize import default_num_proc

    cpus = default_num_proc()
    work = opts.work or Path(tempfile.mkdtemp(prefix="pt-data-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(work)
    figures: dict = {"cpus": cpus, "sizes": {}}
    for n in sizes:
        rows = write_rows(work / f"rows-{n}.jsonl", n)
        seconds, tree, main_rss, manifest = build(work, rows, tokenizer, work / f"out-{n}")
        figures["sizes"][str(n)] = {
            "seconds": round(seconds, 1),
            "rows_per_s": round(n / seconds, 1),
            "peak_rss_gb": round(tree / 1e9, 2),
            "peak_rss_main_gb": round(main_rss / 1e9, 2),
            "packed_rows": manifest["rows"],
            "tokens": manifest["tokens"],
            "dropped": manifest["dropped"],
        }
        print(f"{n:>9} rows: {n / seconds:8.1f} rows/s, peak RSS {tree / 1e9:.2f} GB "
              f"(main process {main_rss / 1e9:.2f} GB), {seconds:.0f} s", flush=True)  # fmt: skip
        shutil.rmtree(work / f"out-{n}", ignore_errors=True)
    first, last = figures["sizes"][str(sizes[0])], figures["sizes"][str(sizes[-1])]
    figures["rss_ratio_largest_to_smallest"] = round(last["peak_rss_gb"] / first["peak_rss_gb"], 3)
    figures["rows_per_s_ratio_largest_to_smallest"] = round(
        last["rows_per_s"] / first["rows_per_s"], 3
    )
    if opts.workers_rows:
        rows = write_rows(work / f"rows-{opts.workers_rows}.jsonl", opts.workers_rows)
        runs = {}
        for procs in (1, 2):
            seconds, *_ = build(work, rows, tokenizer, work / f"workers-{procs}", num_proc=procs)
            runs[procs] = opts.workers_rows / seconds
        same = same_bytes(work / "workers-1", work / "workers-2")
        figures["workers"] = {
            "rows": opts.workers_rows,
            "one_rows_per_s": round(runs[1], 1),
            "two_rows_per_s": round(runs[2], 1),
            "ratio": round(runs[2] / runs[1], 3),
            "same_bytes": same,
        }
        print(f"{opts.workers_rows} rows: 1 worker {runs[1]:.1f} rows/s, 2 workers "
              f"{runs[2]:.1f} rows/s ({runs[2] / runs[1]:.2f}x), same bytes: {same}", flush=True)  # fmt: skip
    if opts.trl_rows:
        largest = sizes[-1] if 1000000 not in sizes else 1000000
        rows = write_rows(work / f"rows-{largest}.jsonl", largest)
        trl = run_trl(rows, opts.trl_rows, tokenizer, cpus)
        pt = figures["sizes"][str(largest)]["rows_per_s"]
        figures["trl"] = {
            "rows": opts.trl_rows,
            "rows_per_s": round(trl, 1),
            "pt_rows_per_s_at": largest,
            "ratio": round(pt / trl, 3),
        }
        print(f"TRL tokenize-and-pack, first {opts.trl_rows} rows: {trl:.1f} rows/s; "
              f"pt-data build at {largest} rows: {pt:.1f} rows/s ({pt / trl:.2f}x)", flush=True)  # fmt: skip
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
