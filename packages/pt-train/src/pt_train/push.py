"""`pt-train push`: a Hugging Face model card for a run's inference checkpoint, and its
upload to the hub when asked.

    card = write_model_card("runs/sft")                       # runs/sft/inference/step-N/README.md
    push("runs/sft", repo_id="me/sft-tiny")                   # the card, then the upload

The card (``README.md`` in the checkpoint, which the hub shows as the model's page) says
what the run trained from and how: the base model, the data (its path and fingerprint),
the objective, the run's resolved config (``config.yaml``) and its final metrics (the last
logged step, and the last evaluation). An upload needs the hub: offline
(``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``, or no connection) it stops before any work.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path, PurePath
from typing import Any

import yaml

from pt_core.errors import InputError, PtError
from pt_core.files import atomic_write_text
from pt_core.hub import hub_unreachable, looks_like_hub_name, offline_variable
from pt_core.log import get_logger
from pt_train.fingerprint import read_data_fingerprint
from pt_train.metrics import read_metrics

log = get_logger(__name__)

CARD = "README.md"


def final_checkpoint(run_dir: Path) -> Path:
    """The run's last inference checkpoint, ``inference/step-N`` with the largest N."""
    steps = [
        p
        for p in (Path(run_dir) / "inference").glob("step-*")
        if p.is_dir() and p.name.split("-")[1].isdigit()
    ]
    if not steps:
        _refuse_a_checkpoint(Path(run_dir))
        raise InputError(
            f"{run_dir}: no inference checkpoint (inference/step-N)",
            hint="push a run directory that pt-train run has trained, or wait for it to end",
        )
    return max(steps, key=lambda p: int(p.name.split("-")[1]))


def _refuse_a_checkpoint(path: Path) -> None:
    """A checkpoint of a run given where its run directory belongs (``pt-train run``
    prints the inference checkpoint's path): the command that pushes it."""
    run = path.parent.parent
    if not (run / "config.yaml").is_file() or not path.name.startswith("step-"):
        return
    if path.parent.name == "inference":
        raise InputError(
            f"{path} is an inference checkpoint, not a run directory",
            hint=f"push its run with this checkpoint: pt-train push {run} --checkpoint {path}",
        )
    if path.parent.name == "checkpoints":
        raise InputError(
            f"{path} is a full checkpoint (for resuming), not a run directory",
            hint=f"push its run, whose last inference checkpoint is published: pt-train push {run}",
        )


def check_hub_reachable() -> None:
    """Stop before any work where an upload cannot happen."""
    variable = offline_variable()
    if variable is not None:
        raise PtError(
            f"{variable} is set: the hub is off, nothing can be uploaded",
            hint=f"unset {variable} to upload, or leave out --repo-id to write the card only",
        )
    unreachable = hub_unreachable()
    if unreachable is not None:
        raise PtError(
            f"the hub cannot be reached ({unreachable}): nothing can be uploaded",
            hint="upload from a machine with a network, or leave out --repo-id to write the "
            "card only",
        )


_LOCAL_PATH = re.compile(r"(?:file:(?://)?)?(?:/|~|[A-Za-z]:[\\/])")


def published(value: Any) -> Any:
    """A config value as a card published on the hub shows it: an absolute local path (or
    ``file:`` URI) by its last component, ``.../name``, so that the card names no directory
    of the machine that trained; hub names and relative paths as they are."""
    if isinstance(value, dict):
        return {key: published(item) for key, item in value.items()}
    if isinstance(value, list):
        return [published(item) for item in value]
    if isinstance(value, str) and _LOCAL_PATH.match(value):
        name = PurePath(re.sub(r"^file:(?://)?", "", value).rstrip("/\\")).name
        return f".../{name}" if name else "..."
    return value


def model_card(run_dir: Path, checkpoint: Path) -> str:
    """The model card of ``checkpoint``, from the run directory's frozen config, data
    fingerprint and metrics (local paths by their names, see :func:`published`)."""
    run_dir = Path(run_dir)
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise InputError(f"{run_dir}: not a pt-train run directory (no config.yaml)")
    written = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    config = published(written)
    model = config.get("model") or {}
    objective = (config.get("objective") or {}).get("name", "sft")
    base = model.get("name_or_path")
    hub_base = (written.get("model") or {}).get("name_or_path")
    init = model.get("init")
    records = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
    fingerprint = read_data_fingerprint(run_dir)
    step = json.loads((checkpoint / "pt_train.json").read_text())["step"]

    front: dict[str, str | list[str]] = {
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
    }
    front["tags"] = ["pt", objective] + (["lora"] if model.get("lora") else [])
    if hub_base is not None and looks_like_hub_name(hub_base) and not Path(hub_base).exists():
        front["base_model"] = hub_base
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", ""]
    lines += [f"# {config.get('run_name', run_dir.name)}", ""]
    lines += [f"Trained with pt (`pt-train run`), objective `{objective}`, {step} steps.", ""]
    lines += ["## Base model", ""]
    if base is not None:
        lines.append(f"`{base}`")
    elif init is not None:
        lines.append(f"Randomly initialised ({init.get('architecture', 'llama')}, `model.init`):")
        lines.append("")
        lines += ["```yaml", yaml.safe_dump(init, sort_keys=False).strip(), "```"]
    if model.get("lora"):
        lines += ["", "LoRA adapters (merged into these weights; alone in `adapter/`):"]
        lines += ["", "```yaml", yaml.safe_dump(model["lora"], sort_keys=False).strip(), "```"]
    lines += ["", "## Data", ""]
    data = config.get("data") or {}
    rollout = config.get("rollout") or {}
    source = data.get("path") or rollout.get("prompts")
    lines.append(f"`{source}`" if source else "(given on the command line)")
    if fingerprint is not None:
        lines.append("")
        lines.append(
            f"Fingerprint `{fingerprint['digest']}` (split `{fingerprint.get('split')}`"
            + (f", {fingerprint['rows']} rows" if fingerprint.get("rows") else "")
            + ")."
        )
    lines += ["", "## Objective", ""]
    lines += ["```yaml", yaml.safe_dump(config.get("objective") or {}, sort_keys=False).strip()]
    lines += ["```", "", "## Final metrics", ""]
    lines += _metrics_table(records)
    lines += ["", "## Training config", ""]
    lines += ["The run's resolved config (`config.yaml`):", ""]
    lines += ["```yaml", yaml.safe_dump(config, sort_keys=False).strip(), "```", ""]
    return "\n".join(lines)


def _metrics_table(records: list[dict]) -> list[str]:
    """The last logged step's values, and the last evaluation's."""
    if not records:
        return ["No metrics were logged."]
    last = records[-1]
    rows = [(k, v) for k, v in last.items() if not k.startswith("eval") and v is not None]
    evaluated = [r for r in records if any(k.startswith("eval") for k in r)]
    if evaluated:
        at = evaluated[-1]
        rows += [
            (f"{k} (step {at['step']})", v)
            for k, v in at.items()
            if k.startswith("eval") and v is not None
        ]
    table = ["| metric | value |", "|---|---|"]
    for key, value in rows:
        shown = f"{value:.6g}" if isinstance(value, float) else str(value)
        table.append(f"| {key} | {shown} |")
    return table


def write_model_card(run_dir: str | os.PathLike, checkpoint: Path | None = None) -> Path:
    """Write ``README.md`` (the model card) into the run's last inference checkpoint, or
    ``checkpoint``; return its path."""
    run_dir = Path(run_dir)
    checkpoint = Path(checkpoint) if checkpoint is not None else final_checkpoint(run_dir)
    return atomic_write_text(checkpoint / CARD, model_card(run_dir, checkpoint))


def push(
    run_dir: str | os.PathLike,
    *,
    repo_id: str | None = None,
    private: bool = False,
    checkpoint: Path | None = None,
) -> tuple[Path, str | None]:
    """Write the model card and, with ``repo_id``, upload the checkpoint to the hub (the
    hub is checked first: offline, nothing is written). Returns the card and the repo's
    URL (None without ``repo_id``)."""
    if repo_id is not None:
        if not looks_like_hub_name(repo_id):
            raise InputError(f"--repo-id {repo_id!r}: expected NAMESPACE/NAME")
        check_hub_reachable()
    card = write_model_card(run_dir, checkpoint)
    if repo_id is None:
        return card, None
    from huggingface_hub import HfApi

    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(folder_path=str(card.parent), repo_id=repo_id, repo_type="model")
    log.info("uploaded %s to %s", card.parent, url)
    return card, str(url)
