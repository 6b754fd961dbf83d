"""A repeated prompt is dropped by default, by ``pt-data build`` and by ``pt-train run
--data raw.jsonl`` alike, and both say how many and why: 200 hand-made chats whose last
9 ask a question asked earlier (with another answer) leave 191."""

from __future__ import annotations

import json
import logging

import yaml


def chats_with_nine_repeats(path):
    """200 chats: rows 192-200 repeat the prompts of rows 1-9 with other answers."""
    rows = []
    for number in range(200):
        question = number if number < 191 else number - 191
        rows.append(
            {
                "messages": [
                    {"role": "user", "content": f"What is {question} + 1?"},
                    {"role": "assistant", "content": f"{question + 1} (answer {number})"},
                ]
            }
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SAID = "200 read, 9 dropped: 9 duplicate (a repeat of an earlier prompt; "


def test_pt_data_build_says_how_many_repeats_it_dropped_and_how_to_keep_them(tmp_path, cli):
    source = chats_with_nine_repeats(tmp_path / "raw.jsonl")
    config = tmp_path / "data.yaml"
    config.write_text(yaml.safe_dump({"data": {"datasets": [{"source": str(source)}]}}))
    out = cli("pt-data", "build", config, "--out", tmp_path / "ds", env={"COLUMNS": "300"})
    manifest = json.loads(out.stdout)
    assert manifest["rows"] == 191 and manifest["dropped"] == {"duplicate": 9}
    assert SAID + "data.dedup: none keeps them)" in out.stderr

    kept = cli("pt-data", "build", config, "--out", tmp_path / "all", "data.dedup=none")
    assert json.loads(kept.stdout)["rows"] == 200 and "200 read, none dropped" in " ".join(
        kept.stderr.split()
    )


def test_pt_train_drops_the_same_repeats_of_raw_conversations_and_says_so(
    tmp_path, tiny_tokenizer, caplog
):
    from pt_train.config import DataConfig
    from pt_train.data import load_rows

    source = chats_with_nine_repeats(tmp_path / "raw.jsonl")
    logger = logging.getLogger("pt")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="pt"):
            rows = load_rows(DataConfig(path=str(source), packing=False), source, tiny_tokenizer)
    finally:
        logger.removeHandler(caplog.handler)
    # unpacked, one row per kept conversation: the 191 distinct prompts
    assert len(rows) == 191
    said = {r.getMessage() for r in caplog.records if "conversations into" in r.getMessage()}
    assert said == {
        "tokenized 191 conversations into 191 rows; "
        + SAID
        + "pt-data build with data.dedup: none keeps them)"
    }
