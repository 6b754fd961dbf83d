"""The generator process a run needs (:func:`wanted_spec`), and the check of processes it
did not start (listening at ``rollout.servers``' addresses) against it: what a process
pt-train starts would be given is what a listening one must have, each difference named
with the ``pt-rollout serve`` option that fixes it, in one error for all of them."""

from __future__ import annotations

import json
from pathlib import Path

from pt_core.errors import ConfigError
from pt_rollout.serve.protocol import SHAPE_KEYS
from pt_rollout.serve.spec import Difference, GeneratorSpec


def wanted_spec(context, model: str) -> GeneratorSpec:
    """The spec of a generator process for this run, on the weights at ``model``."""
    r, needs, score = context.rollout, context.needs, context.score
    teacher = needs.teacher.path if needs.teacher is not None else None
    return GeneratorSpec(
        model=model,
        engine=r.engine,
        teacher=teacher,
        teacher_engine="hf" if teacher and score and hf_teacher(score) else None,
        seed=r.seed,
        max_logprobs=context.max_logprobs,
        logprobs_mode=needs.logprobs_mode,
        decoder=r.decoder,
        in_flight=r.in_flight,
        weight_transfer=None if r.weight_transfer == "files" else r.weight_transfer,
        gpu_memory_utilization=r.gpu_memory_utilization,
        max_model_len=r.max_model_len,
    )


def check_early(context) -> None:
    """Ask each listening process what it serves and check it (:func:`check_processes`),
    the model's shape read from ``model.name_or_path``'s config, before the run directory
    is written and the model loaded; the connections are closed after."""
    from pt_rollout.serve import GeneratorPool, shape_of

    r = context.rollout
    with GeneratorPool(
        addresses=r.server_addresses, key_file=r.server_key_file,
        weight_transfer=None if r.weight_transfer == "files" else r.weight_transfer,
    ) as pool:  # fmt: skip
        infos = pool.info()
    config = None
    model = context.cfg.model
    name = model.name_or_path
    if model.init is None and name is not None and (Path(name) / "config.json").is_file():
        config = shape_of(json.loads((Path(name) / "config.json").read_text()))
    check_processes(context, infos, config)


def check_processes(context, infos: dict[int, dict], config: dict | None) -> None:
    """One ConfigError naming every listening process (``infos``: each one's ``info`` by
    its index in ``rollout.servers``) that does not generate what this run needs.
    ``config``: the policy's shape (:func:`~pt_rollout.serve.shape_of`), None to leave it
    unchecked."""
    addresses = context.rollout.server_addresses
    unfit = [
        (addresses[index], wrong)
        for index, info in sorted(infos.items())
        if (wrong := misfits(context, index, info, config))
    ]
    if not unfit:
        return
    if len(unfit) == 1:
        address, wrong = unfit[0]
        raise ConfigError(
            f"rollout.servers: the generator at {address} does not fit this run: "
            + "; ".join(what for what, _ in wrong),
            hint="start pt-rollout serve there with " + ", ".join(fix for _, fix in wrong),
        )
    raise ConfigError(
        f"rollout.servers: {len(unfit)} of the {len(addresses)} generators do not fit "
        "this run. " + " ".join(f"At {a}: {'; '.join(what for what, _ in w)}." for a, w in unfit),
        hint="start pt-rollout serve "
        + "; ".join(f"at {a} with {', '.join(fix for _, fix in w)}" for a, w in unfit),
    )


def misfits(context, index: int, info: dict, config: dict | None) -> list[tuple[str, str]]:
    """How the ``index``-th listening process (``info``) differs from the one the run
    needs, each as (what, the pt-rollout serve option that fixes it)."""
    r, score = context.rollout, context.score
    wanted = wanted_spec(context, info["model"]).replace(seed=r.seed + index)
    names = ["engine", "weight_transfer", "in_flight"]
    if r.engine == "vllm":
        names += ["max_logprobs", "logprobs_mode"]
    if r.seeding == "engine":  # a started process i is seeded rollout.seed + i
        names.append("seed")
    if score and wanted.teacher is not None:
        names.append("teacher")
    differences = wanted.differences(info, names)
    if score and hf_teacher(score) and not any(d.name == "teacher" for d in differences):
        differences += wanted.differences(info, ["teacher_engine"])
    wrong = [(f"its {d.label} is {_shown(d.name, d.theirs)}, {_why(d, r, index)}", d.fix)
             for d in differences]  # fmt: skip
    theirs = info["model_config"]
    differ = [
        f"{k} {theirs[k]} (here {config[k]})"
        for k in SHAPE_KEYS
        if config is not None
        and theirs.get(k) is not None
        and config.get(k) is not None
        and theirs[k] != config[k]
    ]
    if differ:
        name = context.cfg.model.name_or_path
        wrong.append((f"its model ({info['model']}) is not the policy's shape: "
                      f"{', '.join(differ)}",
                      f"--model {name}" if name else "--model of the policy's shape"))  # fmt: skip
    return wrong


def _shown(name: str, value) -> str:
    if name == "weight_transfer" and value is None:
        return "files"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value is None else str(value)


def _why(difference: Difference, r, index: int) -> str:
    """What in the run asks for the wanted value."""
    wanted = difference.wanted
    return {
        "engine": f"rollout.engine is {r.engine}",
        "weight_transfer": f"rollout.weight_transfer is {r.weight_transfer}",
        "in_flight": f"rollout.in_flight is {str(r.in_flight).lower()}",
        "max_logprobs": f"the run needs {wanted}",
        "logprobs_mode": f"the objective reads {wanted}",
        "seed": f"rollout.seeding=engine wants rollout.seed + {index} = {wanted}",
        "teacher": f"objective.teacher.path is {difference.value}",
        "teacher_engine": "the teacher's log-probs at the student's top-k, or at a temperature "
        "other than 1, need the HF engine",
    }[difference.name]


def hf_teacher(score: dict) -> bool:
    """Whether the teacher must score with the HF engine: vLLM gives neither the log-probs
    of given tokens (the student's top-k) nor prompt log-probs at a temperature other
    than 1."""
    return bool(score["at_student_topk"]) or score.get("temperature", 1.0) != 1.0
