"""The build pipeline as a library: sources, transforms, mixing, packing, dataset.json."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pt_core.errors import ConfigError, InputError
from pt_core.files import read_rows, split_path
from pt_data.build import build
from pt_data.config import DataConfig, load_data_config
from pt_data.pack import pack_examples, pack_table
from pt_data.tokenize import EncodedBatch, tokenize_conversation

REPO = Path(__file__).resolve().parents[3]
SHARED = Path(os.environ.get("PT_SHARED_DIR", REPO.parent / "shared"))


def write_jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(prefix: str, n: int):
    return [
        {"instruction": f"{prefix} question {i}?", "output": f"{prefix} answer {i}."}
        for i in range(n)
    ]


def mix_config(tmp_path, seed: int) -> DataConfig:
    a = write_jsonl(tmp_path / "a.jsonl", qa_rows("A", 6000))
    b = write_jsonl(tmp_path / "b.jsonl", qa_rows("B", 8000))
    return DataConfig.model_validate(
        {
            "datasets": [
                {"source": str(a), "transform": "alpaca", "weight": 1.0, "label": "a"},
                {"source": str(b), "transform": "alpaca", "weight": 0.5, "label": "b"},
            ],
            "seed": seed,
        }
    )


def test_weights_give_the_documented_proportions_deterministically(tmp_path):
    # weight is a sampling factor: a keeps its 6000 rows, b keeps about half of 8000, so
    # b's share of the output is 0.5*8000 / (6000 + 0.5*8000) = 40% of about 10,000 rows.
    def run(seed, name):
        fields = build(mix_config(tmp_path, seed), out_dir=tmp_path / name)
        rows = read_rows(split_path(fields["path"], "train"))
        return fields, [r["id"] for r in rows]

    fields, ids = run(0, "s0")
    share_b = Counter(i.split("-")[0] for i in ids)["b"] / len(ids)
    assert abs(len(ids) - 10_000) < 200
    assert abs(share_b - 0.40) < 0.02
    _, again = run(0, "s0-again")
    _, other = run(1, "s1")
    assert again == ids  # same seed: the same rows in the same order
    assert other != ids  # another seed: another sample and order


def test_dedup_validation_split_and_whole_weights(tmp_path):
    rows = qa_rows("A", 200) + qa_rows("A", 50)  # the last 50 repeat earlier prompts
    src = write_jsonl(tmp_path / "dup.jsonl", rows)
    cfg = DataConfig.model_validate(
        {
            "datasets": [{"source": str(src), "transform": "alpaca", "weight": 2}],
            "validation_split": 0.2,
            "seed": 3,
        }
    )
    fields = build(cfg, out_dir=tmp_path / "out")
    # 200 unique prompts, each emitted twice; both copies land in the same split.
    assert fields["dropped"] == {"duplicate": 50}
    assert sum(fields["splits"].values()) == 400
    train = {r["id"] for r in read_rows(split_path(fields["path"], "train"))}
    val = {r["id"] for r in read_rows(split_path(fields["path"], "validation"))}
    assert not train & val and 0.1 < len(val) / 200 < 0.3


def test_tokenized_build_packs_rows_that_decode_to_the_conversations(tmp_path, tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    src = write_jsonl(
        tmp_path / "math.jsonl",
        [{"problem": f"What is {i} + {i}?", "solution": f"\\boxed{{{2 * i}}}"} for i in range(40)],
    )
    cfg = DataConfig.model_validate(
        {
            "datasets": [{"source": str(src), "transform": {"name": "math", "instruction": None}}],
            "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), "max_seq_length": 128},
            "num_proc": 2,
        }
    )
    fields = build(cfg, out_dir=tmp_path / "tok")
    assert fields["format"] == "tokenized" and fields["rows"] < 40
    info = json.loads((tmp_path / "tok" / "dataset.json").read_text())
    assert info["max_seq_length"] == 128 and info["config_hash"] == fields["config_hash"]
    decoded = []
    tokens = 0
    for row in read_rows(split_path(tmp_path / "tok", "train")):
        assert len(row["input_ids"]) <= 128 == info["max_seq_length"]
        start = 0
        for n in row["seq_lens"]:
            assert row["position_ids"][start : start + n] == list(range(n))
            decoded.append(tok.decode(row["input_ids"][start : start + n]))
            start += n
        tokens += len(row["input_ids"])
    expected = [
        tok.apply_chat_template(
            [
                {"role": "user", "content": f"What is {i} + {i}?"},
                {"role": "assistant", "content": f"\\boxed{{{2 * i}}}"},
            ],
            tokenize=False,
        )
        for i in range(40)
    ]
    assert sorted(decoded) == sorted(expected)
    assert fields["tokens"] == tokens
    assert fields["packing_efficiency"] == pytest.approx(tokens / (128 * fields["rows"]), abs=1e-4)


def test_flat_packing_matches_pack_examples(tiny_tokenizer):
    # pack_table (what build writes) and pack_examples (what pt-train calls) give the same rows.
    convos = [
        [{"role": "user", "content": "x" * (i % 7 + 1)}, {"role": "assistant", "content": str(i)}]
        for i in range(25)
    ]
    examples = [tokenize_conversation(tiny_tokenizer, c) for c in convos]
    batch = EncodedBatch.from_lists([(e["input_ids"], e["labels"]) for e in examples])
    table = pack_table(batch.ids, batch.labels, batch.offsets, 48)
    assert table.to_pylist() == pack_examples(examples, 48)


def test_truncate_keeps_heads_and_drops_rows_left_without_loss(tmp_path, tiny_tokenizer_dir):
    long_answer = "7 " * 200
    src = write_jsonl(
        tmp_path / "long.jsonl",
        [
            {"instruction": "short", "output": "ok"},
            {"instruction": "long", "output": long_answer},
            {"instruction": "w " * 300, "output": "lost"},  # the prompt alone fills the window
        ],
    )
    base = {
        "datasets": [{"source": str(src), "transform": "alpaca"}],
        "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), "max_seq_length": 64},
        "num_proc": 1,
    }
    dropped = build(DataConfig.model_validate(base), out_dir=tmp_path / "drop")
    assert dropped["dropped"] == {"too_long": 2}
    base["tokenizer"]["truncate"] = True
    cut = build(DataConfig.model_validate(base), out_dir=tmp_path / "cut")
    assert cut["dropped"] == {"truncated_to_nothing": 1}
    assert cut["tokens"] == 64 + dropped["tokens"]


def test_local_sources_csv_glob_and_saved_dataset(tmp_path):
    import datasets

    (tmp_path / "c.csv").write_text('prompt,completion\n"Say hi, please",hi\n')
    write_jsonl(tmp_path / "parts" / "p1.jsonl", [{"prompt": "one", "completion": "1"}])
    write_jsonl(tmp_path / "parts" / "p2.jsonl", [{"prompt": "two", "completion": "2"}])
    datasets.Dataset.from_list([{"prompt": "three", "completion": "3"}]).save_to_disk(
        str(tmp_path / "saved")
    )
    cfg = DataConfig.model_validate(
        {
            "datasets": [
                {"source": str(tmp_path / "c.csv"), "transform": "prompt_completion"},
                {"source": str(tmp_path / "parts" / "*.jsonl"), "transform": "prompt_completion"},
                {"source": str(tmp_path / "saved"), "transform": "prompt_completion"},
            ]
        }
    )
    fields = build(cfg, out_dir=tmp_path / "out")
    rows = read_rows(split_path(fields["path"], "train"))
    users = sorted(r["messages"][0]["content"] for r in rows)
    assert users == ["Say hi, please", "one", "three", "two"]


@pytest.mark.parametrize(
    ("transform", "raw", "expected"),
    [
        (
            "sharegpt",
            {
                "conversations": [
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                ]
            },
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        ),
        (
            {"name": "gsm8k", "instruction": None},
            {"question": "2+2?", "answer": "2+2=<<2+2=4>>4\n#### 4"},
            [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "2+2=4\nThe final answer is \\boxed{4}."},
            ],
        ),
    ],
)
def test_conversation_transforms(tmp_path, transform, raw, expected):
    src = write_jsonl(tmp_path / "x.jsonl", [raw])
    cfg = DataConfig.model_validate({"datasets": [{"source": str(src), "transform": transform}]})
    rows = read_rows(split_path(build(cfg, out_dir=tmp_path / "o")["path"], "train"))
    assert rows[0]["messages"] == expected


def test_preferences_and_a_user_transform_by_module_path(tmp_path, monkeypatch):
    (tmp_path / "my_transforms.py").write_text(
        "def qa(row, suffix=''):\n"
        "    return {'messages': [{'role': 'user', 'content': row['q']},\n"
        "                         {'role': 'assistant', 'content': row['a'] + suffix}]}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    src = write_jsonl(tmp_path / "qa.jsonl", [{"q": "why?", "a": "because"}])
    cfg = DataConfig.model_validate(
        {
            "datasets": [
                {"source": str(src), "transform": {"name": "my_transforms:qa", "suffix": "!"}}
            ]
        }
    )
    rows = read_rows(split_path(build(cfg, out_dir=tmp_path / "o")["path"], "train"))
    assert rows[0]["messages"][1]["content"] == "because!"

    pref = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "good", "rejected": "bad"}])
    cfg = DataConfig.model_validate(
        {"datasets": [{"source": str(pref), "transform": "preferences"}]}
    )
    fields = build(cfg, out_dir=tmp_path / "p")
    row = read_rows(split_path(fields["path"], "train"))[0]
    assert fields["format"] == "preferences"
    assert row["chosen"] == [{"role": "assistant", "content": "good"}]


def test_benchmark_files_build_into_prompts_with_gold_answers(tmp_path):
    math_file = SHARED / "benchmarks" / "math_oai" / "test.jsonl"
    gsm_file = SHARED / "benchmarks" / "gsm8k" / "test.jsonl"
    if not (math_file.exists() and gsm_file.exists()):
        pytest.skip(
            f"no shared benchmark data under {SHARED}; "
            "fix: set PT_SHARED_DIR to the directory that holds benchmarks/"
        )
    for src, name in ((math_file, "math"), (gsm_file, "gsm8k")):
        cfg = DataConfig.model_validate(
            {"datasets": [{"source": str(src), "transform": "math_prompts"}], "dedup": "none"}
        )
        fields = build(cfg, out_dir=tmp_path / name)
        rows = read_rows(split_path(fields["path"], "train"))
        raw = {str(r.get("unique_id", r.get("idx"))): r for r in read_rows(src)}
        assert fields["format"] == "prompts" and len(rows) == len(raw)
        assert {r["id"] for r in rows} == set(raw)  # the benchmark's own ids, all of them
        for r in rows:
            original = raw[r["id"]]
            gold = original["answer"]
            if name == "gsm8k":  # the number after '####'
                gold = gold.rsplit("####", 1)[1].strip().replace(",", "")
            assert r["answer"] == gold
            assert r["prompt"][0]["content"].endswith(
                "Please reason step by step, and put your final answer within \\boxed{}."
            )
    assert len(rows) == 1319


def test_errors_name_the_place_and_leave_nothing_behind(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{"instruction": oops}\n')
    out = tmp_path / "out"
    cfg = DataConfig.model_validate({"datasets": [{"source": str(bad), "transform": "alpaca"}]})
    with pytest.raises(InputError, match=r"bad\.jsonl:2: malformed JSON"):
        build(cfg, out_dir=out)
    assert not out.exists() and list(tmp_path.iterdir()) == [bad]
    assert build(cfg, out_dir=out, skip_bad=True)["bad_lines"] == 1

    src = write_jsonl(tmp_path / "cols.jsonl", [{"question": "q", "reply": "r"}])
    cfg = DataConfig.model_validate({"datasets": [{"source": str(src), "transform": "alpaca"}]})
    with pytest.raises(InputError, match=r"missing column\(s\) 'instruction'.*'question', 'reply'"):
        build(cfg, out_dir=tmp_path / "o2")
    cfg = DataConfig.model_validate({"datasets": [{"source": str(src), "transform": "alpacca"}]})
    with pytest.raises(
        ConfigError, match="unknown transform 'alpacca'.*alpaca, conversation_prompts, gsm8k"
    ):
        build(cfg, out_dir=tmp_path / "o3")
    assert not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_config_file_with_other_sections_and_overrides(tmp_path):
    cfg_file = tmp_path / "all.yaml"
    cfg_file.write_text(
        "run_name: x\nmodel: {name_or_path: m}\n"
        "data:\n  datasets:\n    - source: a.jsonl\n      transform: alpaca\n  output_dir: out\n"
    )
    cfg = load_data_config(cfg_file, ["data.datasets.0.weight=2", "seed=5"])
    assert cfg.datasets[0].weight == 2.0 and cfg.seed == 5
    with pytest.raises(ConfigError, match="weigth"):
        load_data_config(cfg_file, ["data.datasets.0.weigth=2"])


def test_hub_dataset_offline_from_the_local_datasets_cache(tmp_path, cli):
    # Populate a datasets cache as a previous online load_dataset("acme/toy") would, then
    # load it by its hub name with the network off.
    import datasets

    repo = tmp_path / "toy"
    write_jsonl(repo / "train.jsonl", [{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    cache = tmp_path / "cache"
    datasets.load_dataset(str(repo), split="train", cache_dir=str(cache))
    (cache / "toy").rename(cache / "acme___toy")
    cfg = tmp_path / "hub.yaml"
    cfg.write_text(
        "data:\n  datasets:\n    - source: acme/toy\n      transform: math_prompts\n"
        f"  output_dir: {tmp_path / 'out'}\n"
    )
    env = {"HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = cli("pt-data", "build", cfg, env=env)
    manifest = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = read_rows(split_path(manifest["path"], "train"))
    assert manifest["format"] == "prompts" and rows[0]["answer"] == "2"
    assert pq.ParquetFile(next((tmp_path / "out" / "train").iterdir())).metadata.num_rows == 1


def test_an_unknown_transform_option_names_the_accepted_ones(tmp_path):
    src = write_jsonl(tmp_path / "m.jsonl", [{"problem": "p", "solution": "s"}])
    cfg = DataConfig.model_validate(
        {"datasets": [{"source": str(src), "transform": {"name": "math", "instructions": "x"}}]}
    )
    with pytest.raises(
        ConfigError, match="(?s)accepts: instruction, system.*did you mean 'instruction'"
    ):
        build(cfg, out_dir=tmp_path / "o")


def test_inspect_shows_every_stage(tmp_path, tiny_tokenizer_dir):
    from pt_data.inspect import inspect_config

    src = write_jsonl(tmp_path / "m.jsonl", [{"problem": "1+1?", "solution": "\\boxed{2}"}])
    cfg = DataConfig.model_validate(
        {
            "datasets": [{"source": str(src), "transform": {"name": "math", "instruction": None}}],
            "tokenizer": {"name_or_path": str(tiny_tokenizer_dir)},
        }
    )
    (raw,) = inspect_config(cfg, "raw", n=1)
    (row,) = inspect_config(cfg, "transformed", n=1)
    (text,) = inspect_config(cfg, "formatted", n=1)
    (tok,) = inspect_config(cfg, "tokenized", n=1)
    assert raw["row"] == {"problem": "1+1?", "solution": "\\boxed{2}"}
    assert row["row"]["answer"] == "2"
    assert text["text"].endswith("<|im_start|>assistant\n\\boxed{2}<|im_end|>\n")
    trained = [i for i, label in zip(tok["input_ids"], tok["labels"], strict=True) if label != -100]
    assert tok["tokenizer"].decode(trained) == "\\boxed{2}<|im_end|>"


def test_streams_in_chunks_and_shards_without_losing_rows(tmp_path, tiny_tokenizer_dir):
    # 1000 rows through chunks of 300 and shards of 250: every row arrives exactly once,
    # and the tokenized build packs each chunk on its own without splitting a sequence.
    src = write_jsonl(tmp_path / "a.jsonl", qa_rows("A", 1000))
    base = {"datasets": [{"source": str(src), "transform": "alpaca"}], "chunk_rows": 300}
    fields = build(DataConfig.model_validate({**base, "shard_rows": 250}), out_dir=tmp_path / "c")
    shards = sorted(p.name for p in (tmp_path / "c" / "train").iterdir())
    assert shards == [f"part-0000{i}.parquet" for i in range(4)] and fields["rows"] == 1000
    ids = [r["id"] for r in read_rows(split_path(tmp_path / "c", "train"))]
    assert len(ids) == len(set(ids)) == 1000

    tok = {"name_or_path": str(tiny_tokenizer_dir), "max_seq_length": 96}
    fields = build(
        DataConfig.model_validate({**base, "tokenizer": tok, "num_proc": 2}), out_dir=tmp_path / "t"
    )
    rows = read_rows(split_path(tmp_path / "t", "train"))
    assert sum(len(r["seq_lens"]) for r in rows) == 1000
    assert all(sum(r["seq_lens"]) == len(r["input_ids"]) <= 96 for r in rows)


def test_without_packing_each_sequence_is_its_own_row(tmp_path, tiny_tokenizer_dir):
    src = write_jsonl(tmp_path / "a.jsonl", qa_rows("A", 30))
    cfg = DataConfig.model_validate(
        {
            "datasets": [{"source": str(src), "transform": "alpaca"}],
            "tokenizer": {"name_or_path": str(tiny_tokenizer_dir), "packing": False},
        }
    )
    fields = build(cfg, out_dir=tmp_path / "o")
    rows = read_rows(split_path(fields["path"], "train"))
    assert fields["rows"] == len(rows) == 30
    assert all(r["seq_lens"] == [len(r["input_ids"])] for r in rows)
    assert all(r["position_ids"] == list(range(len(r["input_ids"]))) for r in rows)


def test_conversations_become_prompts_with_their_gold_answers(tmp_path):
    # The prompt is every turn through the last user turn; the final assistant reply is
    # dropped. The gold answer is the row's own 'answer', else the reply's last \boxed{}.
    system = {"role": "system", "content": "Be brief."}
    ask = {"role": "user", "content": "What is 6 * 7?"}
    reply = {"role": "assistant", "content": "6 * 7 = 42, so \\boxed{42}."}
    rows = [
        {"id": "boxed", "messages": [system, ask, reply], "level": 2},
        {"id": "own", "messages": [ask, reply], "answer": 42.0},
        {"id": "gsm", "messages": [ask, reply], "answer": "6 sevens\n#### 42"},
        {"id": "none", "messages": [ask, {"role": "assistant", "content": "forty-two"}]},
        {"id": "open", "messages": [ask]},  # already a prompt: nothing to drop
        {"id": "mute", "messages": [system, reply]},  # no user turn: dropped, counted
    ]
    src = write_jsonl(tmp_path / "chat.jsonl", rows)
    cfg = DataConfig.model_validate(
        {
            "datasets": [{"source": str(src), "transform": "conversation_prompts"}],
            "shuffle": False,
            "dedup": "none",
        }
    )
    fields = build(cfg, out_dir=tmp_path / "o")
    out = read_rows(split_path(fields["path"], "train"))
    assert fields["format"] == "prompts" and fields["dropped"] == {"no_user_turn": 1}
    assert [r["id"] for r in out] == ["boxed", "own", "gsm", "none", "open"]
    assert out[0]["prompt"] == [system, ask] and out[0]["level"] == 2
    assert [r["prompt"] for r in out[1:]] == [[ask]] * 4
    assert [r["answer"] for r in out] == ["42", "42", "42", None, None]
    assert all("messages" not in r for r in out)
