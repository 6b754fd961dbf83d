"""The config contract: YAML + dot overrides, validated against a typed schema, with errors
that name the file, line, key and fix."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
import yaml
from pydantic import Field, model_validator

from pt_core.config import (
    Section,
    apply_overrides,
    config_hash,
    freeze_config,
    load_config,
    parse_value,
)
from pt_core.errors import ConfigError


class Dataset(Section):
    path: str
    weight: float = 1.0


class Data(Section):
    datasets: list[Dataset]
    seed: int = 0


class Training(Section):
    learning_rate: float = 1e-5
    max_steps: int | None = None
    loss: Literal["sft", "dft"] = "sft"


class Run(Section):
    name: str
    data: Data
    training: Training = Training()


CONFIG = """\
name: demo
data:
  datasets:
    - path: a.jsonl
    - path: b.jsonl
      weight: 3
training:
  learning_rate: 1.0e-5
"""


@pytest.fixture
def cfg_path(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text(CONFIG)
    return p


def test_overrides_reach_nested_keys_and_list_items(cfg_path):
    cfg = load_config(
        cfg_path,
        ["training.learning_rate=5e-6", "data.datasets.0.weight=2", "training.loss=dft"],
        Run,
    )
    # 5e-6 is a float here although YAML 1.1 alone would read it as a string
    assert cfg.training.learning_rate == 5e-6
    assert cfg.data.datasets[0].weight == 2.0
    assert cfg.data.datasets[1].weight == 3.0
    assert cfg.training.loss == "dft"


def test_override_can_append_to_a_list_and_create_sections(tmp_path):
    data = {"data": {"datasets": [{"path": "a"}]}}
    apply_overrides(data, ["data.datasets.1.path=b", "extra.deep.key=[1, 2]"])
    assert data["data"]["datasets"][1] == {"path": "b"}
    assert data["extra"]["deep"]["key"] == [1, 2]


def test_parse_value_reads_scalars_like_a_user_means_them():
    assert parse_value("5e-6") == 5e-6
    assert parse_value("3") == 3 and isinstance(parse_value("3"), int)
    assert parse_value("true") is True
    assert parse_value("null") is None
    assert parse_value("abc") == "abc"
    assert parse_value("[a, b]") == ["a", "b"]


def test_unknown_key_lists_valid_keys_and_suggests_the_close_one(cfg_path):
    with pytest.raises(ConfigError) as err:
        load_config(cfg_path, ["training.learnin_rate=1"], Run)
    msg = str(err.value)
    assert "unknown key 'training.learnin_rate'" in msg
    assert "learning_rate, max_steps, loss" in msg
    assert "did you mean 'training.learning_rate'" in msg
    assert "override training.learnin_rate" in msg


def test_unknown_key_in_file_names_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text(CONFIG + "  warmup: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, [], Run)
    assert f"{p}:9: unknown key 'training.warmup'" in str(err.value)


def test_type_error_names_key_value_and_expected_type(cfg_path):
    with pytest.raises(ConfigError) as err:
        load_config(cfg_path, ["training.max_steps=lots"], Run)
    msg = str(err.value)
    assert "'training.max_steps'" in msg and "'lots'" in msg and "expected int" in msg


def test_literal_error_lists_choices(cfg_path):
    with pytest.raises(ConfigError) as err:
        load_config(cfg_path, ["training.loss=dpo"], Run)
    assert "one of 'sft', 'dft'" in str(err.value)


def test_missing_required_key_says_which(tmp_path):
    p = tmp_path / "m.yaml"
    p.write_text("data:\n  datasets:\n    - weight: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, [], Run)
    msg = str(err.value)
    assert "missing required key 'name'" in msg
    assert "missing required key 'data.datasets.0.path'" in msg


def test_bad_override_syntax_and_index(cfg_path):
    with pytest.raises(ConfigError, match="has no '='"):
        load_config(cfg_path, ["training.learning_rate"], Run)
    with pytest.raises(ConfigError, match="index 5 is out of range"):
        load_config(cfg_path, ["data.datasets.5.weight=1"], Run)
    with pytest.raises(ConfigError, match="is a list; use an index"):
        load_config(cfg_path, ["data.datasets.first.weight=1"], Run)


def test_invalid_yaml_names_the_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("name: x\ndata: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken.yaml:\d+: invalid YAML"):
        load_config(p, [], Run)


def test_a_directory_or_a_binary_file_given_as_the_config_is_named(tmp_path):
    with pytest.raises(ConfigError, match="is a directory; expected a YAML file"):
        load_config(tmp_path, [], Run)
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(b"\x89\xff\x00weights")
    with pytest.raises(ConfigError, match=r"model.safetensors: not a text file"):
        load_config(binary, [], Run)


def test_frozen_config_holds_the_overrides_and_reloads_identically(cfg_path, tmp_path):
    cfg = load_config(cfg_path, ["training.learning_rate=2e-5"], Run)
    frozen = freeze_config(cfg, tmp_path / "runs" / "demo")
    assert frozen == tmp_path / "runs" / "demo" / "config.yaml"
    assert yaml.safe_load(frozen.read_text())["training"]["learning_rate"] == 2e-5
    again = load_config(frozen, [], Run)
    assert again == cfg
    assert config_hash(again) == config_hash(cfg)
    # no temporary files left beside the frozen config
    assert sorted(p.name for p in frozen.parent.iterdir()) == ["config.yaml"]


def test_config_hash_changes_with_content(cfg_path):
    a = load_config(cfg_path, [], Run)
    b = load_config(cfg_path, ["training.learning_rate=1e-4"], Run)
    assert config_hash(a) != config_hash(b)


class Plain(Section):
    name: Literal["plain"] = "plain"
    loss: Literal["sigmoid", "simpo"] = "sigmoid"
    gamma: float | None = None

    @model_validator(mode="after")
    def _gamma_needs_simpo(self):
        if self.gamma is not None and self.loss != "simpo":
            raise ValueError(f"gamma={self.gamma} has no effect with loss {self.loss}; remove it")
        return self


class Other(Section):
    name: Literal["other"]


class WithObjective(Section):
    name: str
    objective: Annotated[Plain | Other, Field(discriminator="name")] = Plain()


OBJECTIVE_CONFIG = "name: demo\nobjective:\n  name: plain\n  loss: sigmoid\n"


@pytest.mark.parametrize(
    ("overrides", "blamed", "says"),
    [
        (["objective.gamma=1"], "override objective.gamma", "objective: gamma=1.0 has no effect"),
        (["objective.name=nope"], "override objective.name", "'objective': name 'nope' is not known"),
        (["objective.loss=sigmoid", "objective.gamma=2"], "override objective.gamma",
         "gamma=2.0 has no effect"),
    ],
    ids=["section-check", "tag", "two-overrides"],
)  # fmt: skip
def test_a_section_an_override_made_invalid_blames_the_override(tmp_path, overrides, blamed, says):
    """The objective section of the file is valid as written (line 2): the override on the
    command line made it invalid, so the error points there, not at the file's line."""
    path = tmp_path / "run.yaml"
    path.write_text(OBJECTIVE_CONFIG)
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides, WithObjective)
    assert err.value.message.startswith(f"{blamed}: "), err.value.message
    assert says in err.value.message and f"{path}:" not in err.value.message


def test_a_section_the_file_makes_invalid_still_names_its_line(tmp_path):
    """The file's own mistake (gamma without simpo, line 2's section) is the file's, even
    with an unrelated override on the command line."""
    path = tmp_path / "run.yaml"
    path.write_text(OBJECTIVE_CONFIG + "  gamma: 1.0\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["name=other"], WithObjective)
    assert err.value.message.startswith(f"{path}:2: objective: gamma=1.0 has no effect")
