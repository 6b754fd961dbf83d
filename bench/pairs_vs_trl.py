"""pt-data's preference-pair tokenization against TRL's DPO dataset preparation.

Both sides get the same pairs (MATH-500 and GSM8K problems from ../shared/benchmarks,
every third with an earlier turn in the prompt; chosen = the problem's worked solution,
rejected = another problem's), the same tokenizer (a byte-level BPE trained here,
offline) and chat template, and no length limit:

* TRL: ``DPOTrainer._prepare_dataset`` (``apply_chat_template`` of the prompt and of
  each whole conversation, the completion cut where the prompt's ids stop agreeing with
  both), with its default ``dataset_num_proc`` and with as many processes as pt-data;
* pt-data: :class:`pt_data.preferences.ParallelPairs` (render, one encoding per text,
  mask, cut: the path ``pt-data build`` takes).

Prints pairs/s and tokens/s of each (best of alternating runs) and the ratio, and checks
that both give the same prompt, chosen and rejected ids (pt-data drops pairs whose two
answers are equal; TRL keeps them). ``--template plain`` makes the generation prompt end
in a space that the tokenizer merges into the answer's first token.

    uv run --no-sync python bench/pairs_vs_trl.py [--rows 5000] [--template chatml] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    return Path(os.environ.get("PT_SHARED_DIR", ROOT.parent / "shared"))


def preference_rows(n_rows: int) -> list[dict]:
    from pt_core.files import read_rows

    bench = shared_dir() / "benchmarks"
    qa = [(r["problem"], r["solution"]) for r in read_rows(bench / "math_oai" / "test.jsonl")]
    qa += [(r["question"], r["answer"]) for r in read_rows(bench / "gsm8k" / "test.jsonl")]
    rows = []
    for i in range(n_rows):
        question, chosen = qa[i % len(qa)]
        _, rejected = qa[(i * 7 + 3) % len(qa)]
        variant = f" (variant {i // len(qa)})" if i >= len(qa) else ""
        prompt = [{"role": "user", "content": question + variant}]
        if i % 3 == 2:  # an earlier exchange in the prompt
            q2, a2 = qa[(i * 5 + 1) % len(qa)]
            prompt = [
                {"role": "user", "content": q2},
                {"role": "assistant", "content": a2},
                *prompt,
            ]
        rows.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        )
    return rows


def make_tokenizer(rows, template: str):
    from pt_data.templates import TEMPLATES
    from pt_data.tokenizer import build_tokenizer

    texts = [m["content"] for r in rows[:3000] for k in ("prompt", "chosen") for m in r[k]]
    tok = build_tokenizer(tempfile.mkdtemp(), texts=texts, vocab_size=8000)
    tok.chat_template = TEMPLATES[template]
    return tok


def run_trl(rows, tok, num_proc: int | None):
    import datasets
    from trl import DPOConfig, DPOTrainer

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_list(rows)
    args = DPOConfig(
        output_dir=tempfile.mkdtemp(),
        dataset_num_proc=num_proc,
        max_length=None,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    # The preparation method only reads this attribute of the trainer.
    trainer = SimpleNamespace(_tokenizer=tok)
    t0 = time.perf_counter()
    out = DPOTrainer._prepare_dataset(trainer, ds, tok, args, "train")
    return time.perf_counter() - t0, out  # Dataset.map is eager: the work is done here


def run_pt(rows, tok, num_proc: int | None):
    from pt_data.preferences import PairLimits, ParallelPairs, PreferenceTokenizer

    t0 = time.perf_counter()
    with ParallelPairs(PreferenceTokenizer(tok), PairLimits(), num_proc) as tokenize:
        results = tokenize(rows)
    return time.perf_counter() - t0, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5000)
    parser.add_argument("--template", choices=("chatml", "plain"), default="chatml")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-proc", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    if not (shared_dir() / "benchmarks").is_dir():
        sys.exit(f"no benchmarks under {shared_dir()}; set PT_SHARED_DIR")
    rows = preference_rows(args.rows)
    tok = make_tokenizer(rows, args.template)
    runs = {"TRL (default procs)": [], f"TRL ({args.num_proc} procs)": [], "pt-data": []}
    for _ in range(args.repeats):  # alternating, so machine noise hits both sides alike
        seconds, trl_out = run_trl(rows, tok, None)
        runs["TRL (default procs)"].append(seconds)
        seconds, pt_out = run_pt(rows, tok, args.num_proc)
        runs["pt-data"].append(seconds)
        seconds, _ = run_trl(rows, tok, args.num_proc)
        runs[f"TRL ({args.num_proc} procs)"].append(seconds)

    kept = [(t, p.row) for t, p in zip(trl_out, pt_out, strict=True) if p.row is not None]
    same = sum(
        t["prompt_ids"] == r["prompt_input_ids"]
        and t["chosen_ids"] == r["chosen_input_ids"]
        and t["rejected_ids"] == r["rejected_input_ids"]
        for t, r in kept
    )
    tokens = sum(
        len(r["prompt_input_ids"]) + len(r["chosen_input_ids"]) + len(r["rejected_input_ids"])
        for _, r in kept
    )
    merged = sum(p.boundary_merged for p in pt_out)
    print(f"{args.rows} pairs, template {args.template}, {tokens:,} tokens (pt-data's kept pairs)")
    print(f"same ids as TRL: {same} of {len(kept)} kept pairs ({args.rows - len(kept)} dropped by "
          f"pt-data as identical); boundary_merged: {merged}")  # fmt: skip
    best = {name: min(v) for name, v in runs.items()}
    for name, seconds in best.items():
        print(f"{name:<22} {args.rows / seconds:>8,.0f} pairs/s  {tokens / seconds:>10,.0f} tokens/s"
              f"  (runs: {', '.join(f'{s:.2f}s' for s in runs[name])})")  # fmt: skip
    for name, seconds in best.items():
        if name != "pt-data":
            print(f"pt-data / {name}: {seconds / best['pt-data']:.2f}x")


if __name__ == "__main__":
    main()
