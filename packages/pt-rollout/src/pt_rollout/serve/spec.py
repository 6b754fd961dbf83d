"""Every setting of a generator process, defined once.

:class:`GeneratorSpec` is what a generator process is started with. From it the process
loads its engines (:meth:`GeneratorSpec.load`), a trainer builds the process's command
line (:meth:`GeneratorSpec.argv`), ``pt-rollout serve`` declares its options
(:func:`spec_parameters`), the process answers ``info`` (:meth:`GeneratorSpec.info`),
and a trainer computes how a process it did not start differs from the one it needs
(:meth:`GeneratorSpec.differences`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from pt_core.errors import ConfigError
from pt_rollout.serve.protocol import local_path

ENGINES = ("hf", "vllm")
LOGPROBS_MODES = ("raw", "processed")
DECODERS = ("auto", "lean", "hf")
WEIGHT_TRANSFERS = ("gloo", "ipc", "nccl")


def _setting(default, option: str, help: str, label: str, *, kind: type = str,
             choices: tuple = (), compare: str = "equal", short: str | None = None):  # fmt: skip
    """A field of the spec with what the command line and the messages say of it:
    ``label`` names it in a difference ("its engine is vllm"), ``compare`` is how a
    process's value is checked against the wanted one (``equal``, ``at_least``, or
    ``path``: equal as local paths)."""
    metadata = {"option": option, "help": help, "label": label, "kind": kind,
                "choices": choices, "compare": compare, "short": short}  # fmt: skip
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class GeneratorSpec:
    """What a generator process is: its model and engine, its teacher, and how it samples
    and takes new weights."""

    model: str = _setting(
        "", "--model", "Model directory or hub name (a trainer pushes its weights).",
        "model", compare="path", short="-m",
    )  # fmt: skip
    engine: str = _setting("hf", "--engine", "hf or vllm: rollout.engine's.", "engine",
                           choices=ENGINES)  # fmt: skip
    teacher: str | None = _setting(None, "--teacher", "Teacher to score with (OPD).", "teacher",
                                   compare="path")  # fmt: skip
    teacher_engine: str | None = _setting(
        None, "--teacher-engine", "The teacher's engine, hf or vllm (default: --engine's).",
        "teacher engine", choices=ENGINES,
    )  # fmt: skip
    weight_transfer: str | None = _setting(
        None, "--weight-transfer",
        "gloo, nccl or ipc: take weights through vLLM's weight-transfer API "
        "(rollout.weight_transfer's); default: from files.",
        "weight transfer", choices=WEIGHT_TRANSFERS,
    )  # fmt: skip
    in_flight: bool = _setting(False, "--in-flight",
                               "Load weights between two engine steps (rollout.in_flight).",
                               "in-flight setting", kind=bool)  # fmt: skip
    max_logprobs: int = _setting(20, "--max-logprobs",
                                 "Top-k log-probs per position, at most (vLLM).",
                                 "top log-probs limit", kind=int,
                                 compare="at_least")  # fmt: skip
    logprobs_mode: str = _setting(
        "raw", "--logprobs-mode", "raw or processed (vLLM): what the trainer asks for.",
        "log-probs mode", choices=LOGPROBS_MODES,
    )  # fmt: skip
    decoder: str = _setting("auto", "--decoder", "The HF engine's: auto, lean or hf.",
                            "decoder", choices=DECODERS)  # fmt: skip
    dtype: str = _setting("auto", "--dtype", "auto (the checkpoint's), float32, bfloat16.",
                          "dtype")  # fmt: skip
    seed: int = _setting(0, "--seed", "Engine seed (seeding: engine only).", "engine seed",
                         kind=int)  # fmt: skip
    gpu_memory_utilization: float | None = _setting(
        None, "--gpu-memory-utilization", "vLLM's memory share.", "memory share", kind=float
    )  # fmt: skip
    max_model_len: int | None = _setting(None, "--max-model-len", "vLLM's context length cap.",
                                         "context length", kind=int)  # fmt: skip

    def __post_init__(self):
        for f in fields(self):
            value, choices = getattr(self, f.name), f.metadata["choices"]
            if choices and value is not None and value not in choices:
                raise ConfigError(
                    f"{f.metadata['option']} {value!r}",
                    hint=f"use {' or '.join(choices)}",
                )
        if self.engine != "vllm":
            for name in ("weight_transfer", "in_flight"):
                if getattr(self, name):
                    raise ConfigError(
                        f"{option_text(name, getattr(self, name))} is the vLLM engine's",
                        hint="add --engine vllm",
                    )

    @property
    def resolved_teacher_engine(self) -> str | None:
        """The engine the teacher runs on (None: no teacher)."""
        return (self.teacher_engine or self.engine) if self.teacher else None

    def replace(self, **changes) -> GeneratorSpec:
        return dataclasses.replace(self, **changes)

    def argv(self) -> list[str]:
        """The command-line options that start a process with this spec."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata["kind"] is bool:
                out += [f.metadata["option"]] if value else []
            elif value is not None:
                out += [f.metadata["option"], str(value)]
        return out

    def info(self) -> dict:
        """The settings as a process reports them: paths made absolute, the teacher's
        engine resolved."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["model"] = local_path(self.model)
        out["teacher"] = local_path(self.teacher) if self.teacher else None
        out["teacher_engine"] = self.resolved_teacher_engine
        return out

    def differences(self, info: dict, names: Iterable[str]) -> list[Difference]:
        """How a process (its ``info``) differs from this spec in the settings ``names``."""
        found = []
        for name in names:
            f = _field(name)
            wanted, theirs = self.info()[name], info.get(name)
            compare = f.metadata["compare"]
            if compare == "at_least":
                differs = theirs is None or theirs < wanted
            else:
                differs = theirs != wanted
            if differs:
                found.append(Difference(name, theirs, wanted, getattr(self, name)))
        return found

    def load(self):
        """The engines of a process with this spec: ``(generator, teacher or None)``."""
        from pt_rollout.engines import load_engine

        generator = load_engine(
            self.engine, self.model, dtype=self.dtype, seed=self.seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=self.max_model_len, max_logprobs=self.max_logprobs,
            logprobs_mode=self.logprobs_mode, hf_decoder=self.decoder,
            in_flight=self.in_flight, weight_transfer=self.weight_transfer,
        )  # fmt: skip
        teacher = None
        if self.teacher:
            teacher = load_engine(
                self.resolved_teacher_engine or self.engine, self.teacher, dtype=self.dtype,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_model_len=self.max_model_len, max_logprobs=self.max_logprobs,
            )  # fmt: skip
        return generator, teacher


@dataclass(frozen=True)
class Difference:
    """A setting in which a process differs from the spec wanted: its value there, the
    wanted one as a process reports it, and as the spec holds it (for the fix)."""

    name: str
    theirs: Any
    wanted: Any
    value: Any

    @property
    def label(self) -> str:
        return _field(self.name).metadata["label"]

    @property
    def fix(self) -> str:
        """The ``pt-rollout serve`` option that gives the process the wanted value."""
        return option_text(self.name, self.value)


def _field(name: str) -> dataclasses.Field:
    return next(f for f in fields(GeneratorSpec) if f.name == name)


def option_text(name: str, value) -> str:
    """The option that sets setting ``name`` to ``value`` (``--engine vllm``,
    ``--in-flight``), or that leaving it out does (``no --in-flight``)."""
    option = _field(name).metadata["option"]
    if value is None or value is False:
        return f"no {option}"
    return option if value is True else f"{option} {value}"


def spec_parameters() -> list[inspect.Parameter]:
    """The spec's settings as the keyword parameters of a Typer command, each a
    ``typer.Option`` with its flag, help and default (the model required)."""
    import typer

    from pt_core.cli import flag

    params = []
    for f in fields(GeneratorSpec):
        meta = f.metadata
        names = [meta["option"], *([meta["short"]] if meta["short"] else [])]
        if meta["kind"] is bool:
            default = flag(*names, help=meta["help"])
        else:
            default = typer.Option(... if f.name == "model" else f.default, *names,
                                   help=meta["help"])  # fmt: skip
        params.append(
            inspect.Parameter(
                f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=meta["kind"]
            )
        )
    return params


def spec_from(values: dict) -> tuple[GeneratorSpec, dict]:
    """Split a command's keyword arguments into the spec and the rest."""
    names = {f.name for f in fields(GeneratorSpec)}
    spec = GeneratorSpec(**{k: v for k, v in values.items() if k in names})
    return spec, {k: v for k, v in values.items() if k not in names}


def with_spec_options(func):
    """A Typer command whose first parameter, ``spec``, is given the spec built from the
    spec's options (:func:`spec_parameters`), declared after the command's own."""
    import functools

    own = list(inspect.signature(func, eval_str=True).parameters.values())[1:]

    @functools.wraps(func)
    def command(**values):
        spec, rest = spec_from(values)
        return func(spec, **rest)

    # Typer reads the signature below (real types), not the function's own annotations
    del command.__wrapped__
    command.__annotations__ = {}
    command.__signature__ = inspect.Signature(own + spec_parameters())  # pyright: ignore[reportAttributeAccessIssue]
    return command
