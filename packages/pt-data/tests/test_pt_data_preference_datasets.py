"""Preference datasets end to end: build with and without a tokenizer, dataset.json and the
manifest, inspect and stats of pairs, and the config errors particular to pairs."""

from __future__ import annotations

import json

import pytest

from pt_core.contracts import IGNORE_INDEX
from pt_core.errors import ConfigError
from pt_core.files import read_rows, split_path
from pt_data.build import build
from pt_data.config import DataConfig

ROWS = [
    {"prompt": "What is 2 + 2?", "chosen": "4", "rejected": "5"},
    {
        "chosen": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
        ],
        "rejected": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "A dog."},
        ],
    },
    {"chosen": "\n\nHuman: Hi\n\nAssistant: Hello!", "rejected": "\n\nHuman: Hi\n\nAssistant: No."},
    {"prompt": "Same?", "chosen": "yes", "rejected": "yes"},  # identical: dropped
    {"prompt": "Long?", "chosen": "1 " * 60, "rejected": "no"},  # over max_seq_length
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path, tokenizer_dir=None, **tokenizer):
    data = {
        "datasets": [{"source": str(write_jsonl(tmp_path / "p.jsonl", ROWS)), "label": "p"}],
        "shuffle": False,
    }
    data["datasets"][0]["transform"] = "preferences"
    if tokenizer_dir is not None:
        data["tokenizer"] = {"name_or_path": str(tokenizer_dir), "max_seq_length": 48, **tokenizer}
    return DataConfig.model_validate(data)


def test_build_with_a_tokenizer_writes_tokenized_pairs_and_counts(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    fields = build(config(tmp_path, tiny_tokenizer_dir), out_dir=tmp_path / "out")
    assert fields["format"] == "preferences" and fields["tokenized"] is True
    assert fields["rows"] == 3 and fields["dropped"] == {"identical": 1, "too_long": 1}
    rows = read_rows(split_path(tmp_path / "out", "train"))
    # the three shapes give the same kind of pair; each side decodes to the conversation
    prompts = ["What is 2 + 2?", "Name a colour.", "Hi"]
    answers = [("4", "5"), ("Blue.", "A dog."), ("Hello!", "No.")]
    for row, prompt, (chosen, rejected) in zip(rows, prompts, answers, strict=True):
        messages = [{"role": "user", "content": prompt}]
        for side, answer in (("chosen", chosen), ("rejected", rejected)):
            whole = tok.apply_chat_template(
                [*messages, {"role": "assistant", "content": answer}], tokenize=False
            )
            ids = row["prompt_input_ids"] + row[f"{side}_input_ids"]
            assert ids == tok(whole, add_special_tokens=False)["input_ids"]
            trained = [
                i
                for i, x in zip(row[f"{side}_input_ids"], row[f"{side}_labels"], strict=True)
                if x != IGNORE_INDEX
            ]
            assert tok.decode(trained) == answer + "<|im_end|>"
    info = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert (info["format"], info["tokenized"], info["pairs"]) == ("preferences", True, 3)
    assert info["dropped"] == {"identical": 1, "too_long": 1} and info["truncated"] == 0
    assert info["tokenizer"]["name_or_path"] == str(tiny_tokenizer_dir)
    assert info["max_seq_length"] == 48 and info["max_prompt_length"] is None
    tokens = sum(
        len(r[k])
        for r in rows
        for k in ("prompt_input_ids", "chosen_input_ids", "rejected_input_ids")
    )
    assert info["counts"]["train"]["tokens"] == fields["tokens"] == tokens

    truncated = build(config(tmp_path, tiny_tokenizer_dir, truncate=True), out_dir=tmp_path / "t")
    assert truncated["rows"] == 4 and truncated["truncated"] == 1
    assert truncated["dropped"] == {"identical": 1}
    long = read_rows(split_path(tmp_path / "t", "train"))[3]
    assert len(long["prompt_input_ids"]) + len(long["chosen_input_ids"]) == 48


def test_build_without_a_tokenizer_writes_the_normalized_rows(tmp_path):
    fields = build(config(tmp_path), out_dir=tmp_path / "out")
    assert fields["format"] == "preferences" and fields["tokenized"] is False
    rows = read_rows(split_path(tmp_path / "out", "train"))
    assert len(rows) == 4 and fields["dropped"] == {"identical": 1}
    assert rows[2]["prompt"] == [{"role": "user", "content": "Hi"}]
    assert rows[2]["chosen"] == [{"role": "assistant", "content": "Hello!"}]
    assert rows[1]["rejected"] == [{"role": "assistant", "content": "A dog."}]


@pytest.mark.parametrize(
    ("transform", "tokenizer", "message"),
    [
        ("preferences", {"packing": True}, "tokenizer.packing does not apply to preferences"),
        ("preferences", {"train_on": "last"}, "tokenizer.train_on does not apply to preferences"),
        ("alpaca", {"max_prompt_length": 8}, "max_prompt_length does not apply to conversations"),
    ],
)
def test_options_that_do_not_apply_are_errors(
    tmp_path, tiny_tokenizer_dir, transform, tokenizer, message
):
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b", "instruction": "q", "output": "a"}]
    cfg = DataConfig.model_validate(
        {
            "datasets": [
                {"source": str(write_jsonl(tmp_path / "r.jsonl", rows)), "transform": transform}
            ],
            "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), **tokenizer},
        }
    )
    with pytest.raises(ConfigError, match=message):
        build(cfg, out_dir=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_inspect_shows_the_prompt_once_and_both_answers(tmp_path, tiny_tokenizer_dir):
    from pt_data.inspect import inspect_config, inspect_dataset

    cfg = config(tmp_path, tiny_tokenizer_dir)
    formatted = inspect_config(cfg, "formatted", n=1)[0]["pair"]
    assert formatted == {
        "prompt": "<|begin_of_text|><|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\n",
        "chosen": "4<|im_end|>\n",
        "rejected": "5<|im_end|>\n",
    }
    tokenized = inspect_config(cfg, "tokenized", n=4)
    assert tokenized[3]["dropped"] == "identical"
    build(cfg, out_dir=tmp_path / "out")
    (record,), _ = inspect_dataset(tmp_path / "out", n=1)
    assert record["pair"] == {**record["pair"], **{k: v for k, v in tokenized[0]["pair"].items()}}


def test_stats_of_pairs_give_prompt_and_answer_lengths(tmp_path, tiny_tokenizer_dir):
    from pt_data.stats import compute_stats

    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text(
        "data:\n  datasets:\n"
        f"    - source: {write_jsonl(tmp_path / 'p.jsonl', ROWS)}\n      transform: preferences\n"
        f"  tokenizer: {{name_or_path: {tiny_tokenizer_dir}, max_seq_length: 48}}\n"
        "  shuffle: false\n"
    )
    build(config(tmp_path, tiny_tokenizer_dir), out_dir=tmp_path / "out")
    rows = read_rows(split_path(tmp_path / "out", "train"))
    built = compute_stats(str(tmp_path / "out"))
    from_config = compute_stats(str(cfg_file))
    for part in ("prompt", "chosen", "rejected"):
        lengths = [len(r[f"{part}_input_ids"]) for r in rows]
        for result in (built, from_config):
            assert result["parts"][part]["tokens"] == sum(lengths)
            assert result["parts"][part]["max"] == max(lengths)
    trained = sum(1 for r in rows for x in r["chosen_labels"] if x != IGNORE_INDEX)
    assert built["parts"]["chosen"]["trained_tokens"] == trained
    longer = [
        len(r["prompt_input_ids"]) + max(len(r["chosen_input_ids"]), len(r["rejected_input_ids"]))
        for r in rows
    ]
    assert built["overall"]["max"] == max(longer) and built["pairs"] == 3
    assert from_config["dropped"] == {"identical": 1, "too_long": 1}
