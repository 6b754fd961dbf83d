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
