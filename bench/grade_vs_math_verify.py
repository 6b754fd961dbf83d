"""pt-eval against Math-Verify as whole processes, as a user runs them: the 3,200 responses
of shared/predictions/math_cot_100.jsonl taken four times, and a one-row file.

    uv run --no-sync python bench/grade_vs_math_verify.py [--repeats 5] [--copies 4]

Each run starts a fresh process: ``pt-eval grade FILE --gold-key gt`` and a Python script
that imports Math-Verify and calls ``verify(parse("$" + gt + "$"), parse(response))`` for
every response (its documented use). The two alternate, several times, and the medians
are compared. Then the answers of both are compared with each other and with the file's
own ``score`` column, and every disagreement is printed. The last stdout line is one JSON
object with the figures.

Both run with Python's bytecode cache, as in a normal installation (this machine sets
PYTHONDONTWRITEBYTECODE, so the cache goes to a temporary PYTHONPYCACHEPREFIX, filled by
one untimed run of each). ``--no-bytecode-cache`` measures without it: every process then
compiles sympy, Math-Verify and pt-eval from source.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MATH_VERIFY_SCRIPT = """\
import json, sys
from math_verify import parse, verify
results = []
for line in open(sys.argv[1], encoding="utf-8"):
    row = json.loads(line)
    gold = parse("$" + str(row["gt"]) + "$")
    for response in row["code"]:
        results.append(bool(verify(gold, parse(response))))
with open(sys.argv[2], "w") as fh:
    json.dump(results, fh)
"""


def write_copies(source: Path, out: Path, copies: int, limit: int | None = None) -> int:
    """``copies`` copies of the rows (each copy with its own ids); returns the responses."""
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    rows = rows[:limit] if limit else rows
    responses = 0
    with open(out, "w", encoding="utf-8") as fh:
        for copy in range(copies):
            for row in rows:
                fh.write(json.dumps({**row, "idx": f"{copy}-{row['idx']}"}) + "\n")
                responses += len(row["code"])
    return responses


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return elapsed


def compare(data: Path, tmp: Path, repeats: int, env: dict, name: str) -> dict:
    bindir = Path(sys.executable).parent
    mv_script = tmp / "math_verify_grade.py"
    mv_script.write_text(MATH_VERIFY_SCRIPT)
    pt_out, mv_out = tmp / f"{name}.grades.jsonl", tmp / f"{name}.mv.json"
    pt_cmd = [str(bindir / "pt-eval"), "-q", "grade", str(data), "--gold-key", "gt",
              "--pred-key", "code", "-o", str(pt_out)]  # fmt: skip
    mv_cmd = [sys.executable, str(mv_script), str(data), str(mv_out)]
    timed(pt_cmd, env), timed(mv_cmd, env)  # untimed: fills the bytecode cache
    pt_times, mv_times = [], []
    for rep in range(repeats):
        # alternate which one goes first, so neither always meets a warmer page cache
        order = (
            [("pt", pt_cmd), ("mv", mv_cmd)] if rep % 2 == 0 else [("mv", mv_cmd), ("pt", pt_cmd)]
        )
        for which, cmd in order:
            (pt_times if which == "pt" else mv_times).append(timed(cmd, env))
    pt_s, mv_s = statistics.median(pt_times), statistics.median(mv_times)
    print(f"{name}: pt-eval {pt_s:.2f}s (runs {', '.join(f'{t:.2f}' for t in pt_times)}), "
          f"math-verify {mv_s:.2f}s (runs {', '.join(f'{t:.2f}' for t in mv_times)}), "
          f"ratio {mv_s / pt_s:.2f}x")  # fmt: skip
    return {"pt_eval_s": round(pt_s, 3), "math_verify_s": round(mv_s, 3),
            "ratio": round(mv_s / pt_s, 2), "pt_out": pt_out, "mv_out": mv_out}  # fmt: skip


def disagreements(data: Path, pt_out: Path, mv_out: Path) -> dict:
    rows = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines()]
    graded = [json.loads(line) for line in pt_out.read_text(encoding="utf-8").splitlines()]
    mv = json.loads(mv_out.read_text())
    pt, extracted, scores, golds = [], [], [], []
    for row, g in zip(rows, graded, strict=True):
        pt += g["correct"]
        extracted += g["extracted"]
        scores += [bool(s) for s in row["score"]]
        golds += [row["gt"]] * len(row["code"])
    n = len(pt)
    print(f"\naccuracy on {n}: pt-eval {sum(pt) / n:.4f}, math-verify {sum(mv) / n:.4f}, "
          f"file score {sum(scores) / n:.4f}")  # fmt: skip
    print("disagreements (sample | gold | pt-eval extracted | pt-eval | math-verify | score):")
    seen = set()
    for i in range(n):
        if pt[i] == mv[i] == scores[i]:
            continue
        key = (golds[i], extracted[i], pt[i], mv[i], scores[i])
        if key in seen:
            continue
        seen.add(key)
        print(f"  {i} | {golds[i]!r} | {extracted[i]!r} | {pt[i]} | {mv[i]} | {scores[i]}")
    return {
        "agree_math_verify": sum(a == b for a, b in zip(pt, mv, strict=True)),
        "agree_score": sum(a == b for a, b in zip(pt, scores, strict=True)),
        "responses": n,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=None)
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="compile every module from source in every process")  # fmt: skip
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/pt-eval/src"))
    from pt_eval.benchmarks import shared_dir

    source = args.file or shared_dir() / "predictions" / "math_cot_100.jsonl"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{cores} CPU cores, load average {os.getloadavg()[0]:.1f} at the start")
    with tempfile.TemporaryDirectory(prefix="grade-bench-") as tmp_name:
        tmp = Path(tmp_name)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if args.no_bytecode_cache:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            env.pop("PYTHONPYCACHEPREFIX", None)
        else:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
        big, one = tmp / "responses.jsonl", tmp / "one-row.jsonl"
        responses = write_copies(source, big, args.copies)
        write_copies(source, one, 1, limit=1)
        print(f"{responses} responses ({args.copies} copies of {source.name}); one row of "
              f"{len(json.loads(one.read_text())['code'])} responses")  # fmt: skip
        many = compare(big, tmp, args.repeats, env, "responses")
        single = compare(one, tmp, args.repeats, env, "one-row")
        agreement = disagreements(big, many["pt_out"], many["mv_out"])
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(json.dumps({
        "responses": responses, "repeats": args.repeats,
        "bytecode_cache": not args.no_bytecode_cache,
        "pt_eval_s": many["pt_eval_s"], "math_verify_s": many["math_verify_s"],
        "ratio": many["ratio"],
        "one_row_pt_eval_s": single["pt_eval_s"], "one_row_math_verify_s": single["math_verify_s"],
        "one_row_ratio": single["ratio"],
        "agree_math_verify": agreement["agree_math_verify"],
        "agree_score": agreement["agree_score"],
    }))  # fmt: skip


if __name__ == "__main__":
    main()
