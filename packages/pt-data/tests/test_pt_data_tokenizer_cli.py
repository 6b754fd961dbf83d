"""`pt-data tokenizer`: a local tokenizer from the text of row files, for runs from scratch."""

from __future__ import annotations

import json

from transformers import AutoTokenizer


def test_tokenizer_learns_the_rows_text_and_keeps_one_bos(cli, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps({"problem": f"What is {a} + {a}?", "solution": f"\\boxed{{{2 * a}}}"})
            for a in range(50)
        )
    )
    proc = cli("pt-data", "tokenizer", "--texts", rows, "--out", tmp_path / "tok")
    manifest = json.loads(proc.stdout)
    assert manifest["kind"] == "tokenizer" and manifest["vocab_size"] > 256
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    # "What" is frequent in the rows, so BPE has merged it into one token
    assert len(tok("What", add_special_tokens=False).input_ids) == 1
    text = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 3?"}], tokenize=False)
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_tokenizer_learns_the_text_a_template_writes_around_tool_calls(cli, tmp_path):
    """Calculator traces hold the factors and results in their columns, but the tool list
    of the opening and the calls' JSON only in their rendering; the tokenizer learns that
    too, so that a trace's opening takes under half the ids it takes with a tokenizer of
    the columns alone (a schema word is one token, not a few bytes)."""
    from pt_data.synth import write_synth
    from pt_data.tokenizer import build_tokenizer, row_texts

    write_synth("calculator", 200, tmp_path / "synth", n_test=1)
    rows = [json.loads(line) for line in (tmp_path / "synth" / "train.jsonl").open()]
    assert row_texts(rows[0])[-1].startswith("<|im_start|>system\n# Tools\n")
    cli("pt-data", "tokenizer", "--texts", tmp_path / "synth" / "train.jsonl", "--out",
        tmp_path / "tok")  # fmt: skip
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    contents = [m["content"] for r in rows for m in r["messages"] if m["content"]]
    columns_only = build_tokenizer(texts=[r["id"] for r in rows] + contents)

    def opening(tokenizer) -> int:
        text = tokenizer.apply_chat_template(rows[0]["messages"][:1], tools=rows[0]["tools"],
                                             tokenize=False, add_generation_prompt=True)  # fmt: skip
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    assert tok.tokenize("description") == ["description"]
    assert columns_only.tokenize("description") != ["description"]
    assert 2 * opening(tok) < opening(columns_only), (opening(tok), opening(columns_only))
