"""Grade the 800 responses of shared/predictions/math_cot_100.jsonl with pt-eval and with
Math-Verify in the same run; print both throughputs, their ratio, and every disagreement
(with each other, and with the file's own `score` column).

    uv run --no-sync python bench/grade_vs_math_verify.py [--workers N] [--file PATH]

Throughput is measured twice for each grader: "warm" counts only grading (pt-eval's
worker processes already started, Math-Verify already imported), "cold" includes
starting the workers / importing the package. Math-Verify runs in the main thread, as
its signal-based timeout requires; pt-eval uses its default worker pool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def load(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def run_pt_eval(items, workers):
    from pt_eval.worker import GradingPool

    start = time.perf_counter()
    pool = GradingPool(workers=workers)
    pool.wait_ready()
    ready = time.perf_counter()
    results = pool.grade(items)
    done = time.perf_counter()
    pool.close()
    return results, done - ready, done - start, pool.size


def run_pt_eval_uncached(items):
    """One process, no pool, the (gold, answer) cache cleared before every item: the cost of
    grading itself, with neither parallelism nor repeated answers helping."""
    import pt_eval.item as item

    item.warm_up()
    start = time.perf_counter()
    for prediction, gold in items:
        item._cache.clear()
        item.grade_item(prediction, gold)
    return time.perf_counter() - start


def run_math_verify(rows):
    start = time.perf_counter()
    from math_verify import parse, verify

    ready = time.perf_counter()
    results = []
    for row in rows:
        gold = parse("$" + str(row["gt"]) + "$")
        for response in row["code"]:
            pred = parse(response)
            results.append((bool(verify(gold, pred)), [str(p) for p in pred]))
    done = time.perf_counter()
    return results, done - ready, done - start


def main() -> None:
    from pt_eval.benchmarks import shared_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    path = args.file or shared_dir() / "predictions" / "math_cot_100.jsonl"
    rows = load(path)
    items = [(response, row["gt"]) for row in rows for response in row["code"]]
    scores = [bool(s) for row in rows for s in row["score"]]
    golds = [row["gt"] for row in rows for _ in row["code"]]
    n = len(items)

    # Math-Verify first, so that its cold time includes importing sympy (the pt-eval side
    # never imports sympy in this process: its fork server does)
    mv_results, mv_warm, mv_cold = run_math_verify(rows)
    pt_results, pt_warm, pt_cold, workers = run_pt_eval(items, args.workers)
    pt_single = run_pt_eval_uncached(items)
    pt_correct = [bool(r["correct"]) for r in pt_results]
    mv_correct = [r[0] for r in mv_results]

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"{n} responses, {cores} CPU cores, pt-eval with {workers} worker process(es)")
    print(f"pt-eval     warm {n / pt_warm:8.0f} responses/s ({pt_warm:.2f}s)   "
          f"cold {n / pt_cold:8.0f}/s ({pt_cold:.2f}s incl. starting workers)")  # fmt: skip
    print(f"math-verify warm {n / mv_warm:8.0f} responses/s ({mv_warm:.2f}s)   "
          f"cold {n / mv_cold:8.0f}/s ({mv_cold:.2f}s incl. import)")  # fmt: skip
    print(f"pt-eval in one process, no answer cache: {n / pt_single:8.0f} responses/s")
    print(
        f"ratio pt-eval / math-verify: warm {mv_warm / pt_warm:.2f}x, cold {mv_cold / pt_cold:.2f}x, "
        f"one process uncached {mv_warm / pt_single:.2f}x"
    )
    print()
    print(f"accuracy: pt-eval {sum(pt_correct) / n:.4f}, math-verify {sum(mv_correct) / n:.4f}, "
          f"file score {sum(scores) / n:.4f}")  # fmt: skip
    statuses = {}
    for r in pt_results:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    print(f"pt-eval statuses: {statuses}")
    agree_score = sum(a == b for a, b in zip(pt_correct, scores, strict=True))
    agree_mv = sum(a == b for a, b in zip(pt_correct, mv_correct, strict=True))
    print(f"pt-eval agrees with the file's score on {agree_score}/{n} ({agree_score / n:.2%}), "
          f"with math-verify on {agree_mv}/{n} ({agree_mv / n:.2%})")  # fmt: skip
    print()
    print("disagreements (row.sample | gold | pt-eval extracted | pt-eval | math-verify | score):")
    for i in range(n):
        if pt_correct[i] == scores[i] == mv_correct[i]:
            continue
        row, sample = divmod(i, len(rows[0]["code"]))
        mv_pred = mv_results[i][1][-1] if mv_results[i][1] else None
        print(f"  {row}.{sample} | gold {golds[i]!r} | extracted {pt_results[i]['extracted']!r} | "
              f"pt-eval {pt_correct[i]} | math-verify {mv_correct[i]} (parsed {mv_pred!r}) | "
              f"score {scores[i]}")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
