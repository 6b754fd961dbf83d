"""pt-data's tokenize + pack against TRL's SFT dataset preparation, on the same data.

Both sides get the same conversations (MATH-500 and GSM8K worked solutions from
../shared/benchmarks, as single- and two-turn chats), the same tokenizer (a byte-level
BPE trained here, offline) and chat template, the same max length, assistant-only
loss and best-fit-decreasing packing with truncation of over-long sequences:

* TRL: ``SFTTrainer._prepare_dataset`` with ``assistant_only_loss=True``,
  ``packing=True``, ``packing_strategy="bfd"`` (its tokenization through
  ``apply_chat_template(return_assistant_tokens_mask=True)`` on a template with
  ``{% generation %}`` markers, label building, and ``pack_dataset``), run with its
  default ``dataset_num_proc`` and with as many processes as pt-data uses;
* pt-data: :class:`pt_data.tokenize.ParallelEncoder` (render, tokenize, mask) and
  :func:`pt_data.pack.pack_table` (the path ``pt-data build`` takes).

Prints rows/s and tokens/s of each, the ratio, and the packing efficiency
(real tokens / (rows x max_length)). Also checks that both give the same labels.

    uv run --no-sync python bench/data_vs_trl.py [--rows 10000] [--max-length 2048] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
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

# ChatML with {% generation %} around what the assistant produces (content + <|im_end|>),
# so TRL's assistant mask and pt-data's incremental-rendering mask select the same tokens.
TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def shared_dir() -> Path:
    return Path(os.environ.get("PT_SHARED_DIR", ROOT.parent / "shared"))


def conversations(n_rows: int) -> list[list[dict]]:
    from pt_core.files import read_rows

    bench = shared_dir() / "benchmarks"
    pairs = [(r["problem"], r["solution"]) for r in read_rows(bench / "math_oai" / "test.jsonl")]
    pairs += [(r["question"], r["answer"]) for r in read_rows(bench / "gsm8k" / "test.jsonl")]
    convos = []
    i = 0
    while len(convos) < n_rows:
        q, a = pairs[i % len(pairs)]
        variant = f" (variant {i // len(pairs)})" if i >= len(pairs) else ""
        msgs = [{"role": "user", "content": q + variant}, {"role": "assistant", "content": a}]
        if i % 3 == 2:  # every third row is a two-turn chat
            q2, a2 = pairs[(i * 7 + 1) % len(pairs)]
            msgs += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
        convos.append(msgs)
        i += 1
    return convos


def make_tokenizer(convos, out_dir: Path):
    from pt_data.tokenizer import build_tokenizer

    texts = [m["content"] for c in convos[:3000] for m in c]
    tok = build_tokenizer(out_dir, texts=texts, vocab_size=8000)
    tok.chat_template = TEMPLATE
    return tok


def run_trl(convos, tok, max_length: int, num_proc: int | None):
    import datasets
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_list([{"messages": c} for c in convos])
    args = SFTConfig(
        output_dir=tempfile.mkdtemp(),
        max_length=max_length,
        packing=True,
        packing_strategy="bfd",
        assistant_only_loss=True,
        dataset_num_proc=num_proc,
        shuffle_dataset=False,
        report_to=[],
        use_cpu=True,
        bf16=False,
    )
    # The preparation method only reads these attributes of the trainer.
    trainer = SimpleNamespace(_tokenizer=tok, chat_template=None, completion_only_loss=False)
    t0 = time.perf_counter()
    out = SFTTrainer._prepare_dataset(trainer, ds, tok, args, True, None, "train")
    seconds = time.perf_counter() - t0  # Dataset.map is eager: the work is done here
    return seconds, row_lengths(out.with_format("arrow")[:]["input_ids"]), out


def row_lengths(column) -> list[int]:
    import pyarrow.compute as pc

    return pc.list_value_length(column).to_pylist()


def run_pt(convos, tok, max_length: int, num_proc: int | None):
    from pt_data.pack import pack_table
    from pt_data.tokenize import ConversationTokenizer, ParallelEncoder

    t0 = time.perf_counter()
    ct = ConversationTokenizer(tok)
    with ParallelEncoder(ct, num_proc) as encode:
        batch = encode(convos)
    batch = batch.select(range(len(batch)), max_length)  # truncate over-long, as TRL's bfd does
    table = pack_table(batch.ids, batch.labels, batch.offsets, max_length)
    seconds = time.perf_counter() - t0
    return seconds, row_lengths(table.column("input_ids")), ct


def masks_agree(convos, tok, n: int = 200) -> tuple[int, int]:
    """Labels of pt-data vs TRL's own masking (apply_chat_template assistant masks)."""
    from pt_data.tokenize import tokenize_conversation

    same = 0
    for c in convos[:n]:
        ref = tok.apply_chat_template(
            c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        ref_labels = [
            t if m else -100 for t, m in zip(ref["input_ids"], ref["assistant_masks"], strict=True)
        ]
        ours = tokenize_conversation(tok, c)
        same += ours["input_ids"] == list(ref["input_ids"]) and ours["labels"] == ref_labels
    return same, min(n, len(convos))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10000)
    parser.add_argument("--max-length", type=int, default=2048)
    parser.add_argument("--num-proc", type=int, default=None, help="processes (default: all CPUs)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each; the best counts")
    opts = parser.parse_args()

    from pt_data.tokenize import default_num_proc

    num_proc = opts.num_proc or default_num_proc()
    convos = conversations(opts.rows)
    with tempfile.TemporaryDirectory() as tmp:
        tok = make_tokenizer(convos, Path(tmp))
        same, checked = masks_agree(convos, tok)
        # Best of --repeats runs each, alternating, so a busy shared machine skews neither side.
        runs: dict[str, list] = {}
        trl_procs = [None] + ([num_proc] if num_proc > 1 else [])
        for _ in range(opts.repeats):
            runs.setdefault(f"pt-data (num_proc={num_proc})", []).append(
                run_pt(convos, tok, opts.max_length, num_proc)[:2]
            )
            for procs in trl_procs:
                runs.setdefault(f"trl (dataset_num_proc={procs})", []).append(
                    run_trl(convos, tok, opts.max_length, procs)[:2]
                )

    def figures(seconds, lengths):
        tokens = sum(lengths)
        return {
            "seconds": round(seconds, 2),
            "rows_per_s": round(len(convos) / seconds, 1),
            "tokens_per_s": round(tokens / seconds),
            "packed_rows": len(lengths),
            "tokens": tokens,
            "packing_efficiency": round(tokens / (len(lengths) * opts.max_length), 4),
        }

    results = {label: figures(*min(rs, key=lambda r: r[0])) for label, rs in runs.items()}
    pt = next(iter(results.values()))
    print(
        f"{len(convos)} conversations, max_length {opts.max_length}, {num_proc} CPU(s), "
        f"best of {opts.repeats}; "
        f"labels identical to TRL's assistant masks on {same}/{checked} rows"
    )
    print(f"{'':34} {'rows/s':>10} {'tokens/s':>12} {'packed rows':>12} {'efficiency':>11}")
    for label, r in results.items():
        print(
            f"{label:34} {r['rows_per_s']:>10.1f} {r['tokens_per_s']:>12,} "
            f"{r['packed_rows']:>12} {r['packing_efficiency']:>11.4f}"
        )
    for label, r in list(results.items())[1:]:
        print(f"pt-data / {label}: {pt['rows_per_s'] / r['rows_per_s']:.2f}x rows/s")
    json.dump(results, sys.stderr)
    sys.stderr.write("\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
