"""The ``data:`` section of a YAML file: what ``pt-data build`` reads.

    data:
      datasets:
        - source: data/math/train.jsonl     # file, directory, glob, saved dataset, or hub name
          transform: math                   # or {name: math, ...options}, or pkg.module:function
          weight: 1.0
      output_dir: out/data/math-sft
      seed: 0
      validation_split: 0.05
      tokenizer: {name_or_path: out/tok, max_seq_length: 1024, packing: true}

Other top-level keys (``model``, ``training`` ...) belong to other tools and are ignored,
so one file can configure a whole pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pt_core.config import Section, load_config
from pt_core.errors import ConfigError

FORMATS = ("tokenized", "conversations", "prompts", "preferences")


class TransformSpec(Section):
    """A transform by name with keyword options: ``{name: math, answer_key: answer}``."""

    model_config = ConfigDict(extra="allow")
    name: str

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class DatasetSpec(Section):
    source: str = Field(
        description="a local file, directory or glob (jsonl, json, parquet, csv), a directory "
        "written by datasets' save_to_disk, or a Hugging Face dataset name"
    )
    subset: str | None = Field(default=None, description="hub dataset configuration (its 'name')")
    split: str = "train"
    revision: str | None = None
    data_files: str | list[str] | None = None
    label: str | None = Field(default=None, description="name used in per-source stats and rows")
    transform: str | TransformSpec = "messages"
    columns: dict[str, str] = Field(
        default_factory=dict, description="rename raw columns before the transform: {old: new}"
    )
    weight: float = Field(
        default=1.0,
        ge=0,
        description="sampling factor: each row is emitted floor(w) times, plus once more "
        "with probability w - floor(w)",
    )
    max_rows: int | None = Field(default=None, ge=1, description="read at most this many raw rows")

    @property
    def transform_name(self) -> str:
        return self.transform if isinstance(self.transform, str) else self.transform.name

    @property
    def transform_options(self) -> dict[str, Any]:
        return {} if isinstance(self.transform, str) else self.transform.options

    @property
    def display_name(self) -> str:
        if self.label:
            return self.label
        src = self.source.rstrip("/")
        if Path(src).suffix:  # a file: drop the suffix, keep the folder that tells files apart
            src = str(Path(src).with_suffix(""))
        return f"{src}:{self.subset}" if self.subset else src


class TokenizerSpec(Section):
    name_or_path: str
    chat_template: str | None = Field(
        None, description="None: the tokenizer's own; a name (chatml, plain); a .jinja file"
    )
    max_seq_length: int = Field(default=2048, ge=8)
    max_prompt_length: int | None = Field(
        None, ge=1, description="preferences: drop pairs whose prompt has more tokens"
    )
    max_completion_length: int | None = Field(
        None, ge=1, description="preferences: longer answers drop the pair (truncate: cut them)"
    )
    packing: bool = True
    truncate: bool = Field(
        default=False,
        description="false: drop over-long sequences or pairs; true: keep the head of a "
        "sequence, of a pair's answers",
    )
    train_on: Literal["assistant", "last"] = "assistant"


class FilterSpec(Section):
    drop_empty_turns: bool = True
    max_chars: int | None = Field(default=None, ge=1, description="drop rows whose text is longer")
    min_assistant_chars: int = Field(default=0, ge=0)


class DataConfig(Section):
    datasets: list[DatasetSpec] = Field(min_length=1)
    output_dir: str | None = None
    output: str | None = Field(default=None, description="alias of output_dir")
    format: Literal["tokenized", "conversations", "prompts", "preferences"] | None = Field(
        None, description="None: tokenized when a tokenizer is given, else the transforms' kind"
    )
    seed: int = 0
    shuffle: bool = Field(default=True, description="shuffle rows (within chunks of chunk_rows)")
    validation_split: float = Field(default=0.0, ge=0, lt=1)
    dedup: Literal["prompt", "row", "none"] = Field(
        "prompt", description="drop rows whose prompt (or whole row) was seen before"
    )
    filters: FilterSpec = Field(default_factory=FilterSpec)
    tokenizer: TokenizerSpec | None = None
    shard_rows: int = Field(default=100_000, ge=1, description="rows per parquet shard")
    chunk_rows: int = Field(
        200_000, ge=1, description="rows shuffled, tokenized and packed together in memory"
    )
    num_proc: int | None = Field(
        default=None, ge=1, description="tokenizer processes (default: all CPUs)"
    )
    skip_bad: bool = False

    @field_validator("dedup", mode="before")
    @classmethod
    def _dedup_bool(cls, v):
        return {True: "prompt", False: "none"}.get(v, v) if isinstance(v, bool) else v

    @field_validator("output", "output_dir")
    @classmethod
    def _not_empty(cls, v):
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v

    @model_validator(mode="after")
    def _check(self):
        if self.format == "tokenized" and self.tokenizer is None:
            raise ValueError("format 'tokenized' needs a tokenizer section")
        return self

    @property
    def out_dir(self) -> str | None:
        return self.output_dir or self.output


class DataFile(Section):
    """A YAML file with a ``data:`` section; other tools' sections are ignored."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    data: DataConfig


def load_data_config(path: str | os.PathLike, overrides: list[str] | None = None) -> DataConfig:
    """Read ``path``'s ``data:`` section with ``data.x.y=value`` overrides applied.

    Overrides may also be written without the ``data.`` prefix (``seed=3``).
    """
    overrides = [o if o.startswith("data.") else f"data.{o}" for o in (overrides or [])]
    from pt_core.config import read_yaml

    if Path(path).is_dir():
        raise ConfigError(
            f"{path}: is a directory; expected a YAML file with a 'data:' section",
            hint="inspect and stats also take a built dataset directory; build takes a config",
        )
    try:
        raw, _ = read_yaml(path)
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text (YAML) file") from None
    if "data" not in raw:
        raise ConfigError(
            f"{path}: no 'data:' section",
            hint="put the datasets under a top-level 'data:' key (see docs/pt-data.md)",
        )
    return load_config(path, overrides, DataFile).data
