"""Reading prompts: a prompt that ends with an assistant turn is warned about, once."""

from __future__ import annotations

import logging

from pt_core.files import write_rows
from pt_rollout.prompts import read_prompts


def test_prompts_ending_with_an_assistant_turn_log_one_warning_with_their_count(tmp_path, caplog):
    ask = {"role": "user", "content": "What is 6 * 7?"}
    answered = [ask, {"role": "assistant", "content": "42"}]
    rows = [
        {"id": "a", "prompt": answered},
        {"id": "b", "prompt": [ask]},
        {"id": "c", "prompt": answered},
        {"id": "d", "prompt": "What is 6 * 7?"},
    ]
    path = write_rows(tmp_path / "p.jsonl", rows)
    pt_logger = logging.getLogger("pt")  # as the CLIs set it up: not propagating to the root
    propagate = pt_logger.propagate
    pt_logger.propagate = False
    pt_logger.addHandler(caplog.handler)
    try:
        read_prompts(path)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        assert "2 of 4 prompts end with an assistant turn (the first: id 'a')" in warnings[0]
        caplog.clear()
        read_prompts(write_rows(tmp_path / "ok.jsonl", rows[1:2] + rows[3:]))
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    finally:
        pt_logger.removeHandler(caplog.handler)
        pt_logger.propagate = propagate
