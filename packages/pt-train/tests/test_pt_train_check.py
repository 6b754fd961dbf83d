"""`pt-train check` shows the gradient clipping that takes effect: at ZeRO stage 0 pt-train
clips the gradient itself and DeepSpeed's own `gradient_clipping` is 0."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.slow  # a pt-train start per case


@pytest.fixture
def config(tmp_path, tiny_run_config):
    # a path longer than the 80 columns rich assumes off a terminal: the line stays whole
    path = (
        tmp_path / ("a-folder-whose-name-makes-the-path-longer-than-eighty-columns" * 2) / "t.yaml"
    )
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(tiny_run_config(tmp_path / "runs", tmp_path, {"name": "sft"})))
    return path


def check(cli, config, *overrides) -> dict:
    proc = cli("pt-train", "check", config, *overrides)
    assert f"ok: {config}" in proc.stderr
    return json.loads(proc.stdout)  # the result, on stdout


@pytest.mark.parametrize(
    ("overrides", "clipping", "deepspeed"),
    [
        ((), {"max_norm": 1.0, "by": "pt-train"}, 0.0),
        (("training.max_grad_norm=0.5",), {"max_norm": 0.5, "by": "pt-train"}, 0.0),
        (("training.max_grad_norm=0",), {"max_norm": 0.0, "by": "off"}, 0.0),
        (("deepspeed.zero_stage=2",), {"max_norm": 1.0, "by": "DeepSpeed"}, 1.0),
    ],
)
def test_check_shows_the_clipping_that_takes_effect(cli, config, overrides, clipping, deepspeed):
    shown = check(cli, config, *overrides)
    assert shown["gradient_clipping"] == clipping
    assert shown["deepspeed"]["gradient_clipping"] == deepspeed  # what DeepSpeed is given
