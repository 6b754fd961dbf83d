"""What ``--model`` and ``--teacher`` name, checked before an engine starts.

    pt-train run train.yaml | pt-rollout generate --model - --prompts prompts.jsonl

A model is a directory with a ``config.json`` (a pt-train ``inference/step-N``, any
Hugging Face checkpoint), a hub name (``Qwen/Qwen2.5-7B-Instruct``), or ``-``: the
checkpoint manifest of the stage piped in. A pt-train run directory holds several
checkpoints and gains new ones while it trains, so it is refused with the path of its
latest ``inference/step-N`` rather than silently read: the rollouts name the exact weights.
"""

from __future__ import annotations

import os
from pathlib import Path

from pt_core.errors import InputError
from pt_core.hub import looks_like_hub_name, require_local_or_hub
from pt_core.manifest import read_manifest


def one_stdin_input(**inputs: str | os.PathLike | None) -> None:
    """Refuse two inputs that are both ``-``: stdin holds one upstream manifest."""
    piped = [f"--{name.replace('_', '-')}" for name, value in inputs.items() if str(value) == "-"]
    if len(piped) > 1:
        raise InputError(
            f"{' and '.join(piped)} are both '-', but stdin holds the manifest of one "
            "upstream stage",
            hint=f"pipe into one of them and give the other a path "
            f"(e.g. {piped[0]} - {piped[1]} PATH)",
        )


def resolve_model(value: str | os.PathLike, *, option: str = "--model") -> str:
    """The model to load for ``option``: a checkpoint directory or a hub name.

    Raises :class:`InputError` for a path that does not exist, a file, a directory that is
    not a model, and a pt-train run directory (naming its latest ``inference/step-N``).
    """
    text = str(value)
    if text == "-":
        manifest = read_manifest(expected=("checkpoint",))
        return _checkpoint_dir(Path(manifest["path"]), option, "the piped checkpoint")
    path = Path(text).expanduser()
    if path.exists():
        return _checkpoint_dir(path, option, option)
    if looks_like_hub_name(text):
        # offline, or with no route to the hub, a name the cache lacks fails now, not after
        # the engine's ~50 s of retries
        require_local_or_hub(
            text,
            option,
            hint="pass a local checkpoint directory, or download the model once with a network",
        )
        return text
    raise InputError(
        f"{option} {text}: no such directory",
        hint="pass a checkpoint directory (a pt-train run's inference/step-N), a hub name, "
        "or - to read the checkpoint manifest piped in",
    )


def latest_inference_checkpoint(run_dir: Path) -> Path | None:
    """The ``inference/step-N`` of a pt-train run directory with the highest N."""
    steps = [
        (int(p.name.removeprefix("step-")), p)
        for p in (run_dir / "inference").glob("step-*")
        if p.name.removeprefix("step-").isdigit() and (p / "config.json").is_file()
    ]
    return max(steps)[1] if steps else None


def _checkpoint_dir(path: Path, option: str, what: str) -> str:
    if path.is_file():
        parent = path.parent
        hint = (
            f"pass its directory: {option} {parent}"
            if (parent / "config.json").is_file()
            else "pass the model directory that holds config.json and the weights"
        )
        raise InputError(f"{what} {path}: is a file; a model is a directory", hint=hint)
    if not path.is_dir():
        raise InputError(f"{what} {path}: no such directory")
    if (path / "config.json").is_file():
        return str(path)
    latest = latest_inference_checkpoint(path)
    if latest is not None:
        raise InputError(
            f"{what} {path}: a pt-train run directory, not a checkpoint; its latest "
            f"inference checkpoint is {latest}",
            hint=f"pass {option} {latest} (or pipe pt-train run into {option} -)",
        )
    if (path / "checkpoints").is_dir() or (path / "config.yaml").is_file():
        raise InputError(
            f"{what} {path}: a pt-train run directory without an inference checkpoint yet",
            hint="wait for the run to write inference/step-N (training.inference_steps, or "
            "the end of the run), or write the starting model with pt-train init",
        )
    raise InputError(
        f"{what} {path}: not a model directory (no config.json)",
        hint="pass a directory with config.json and weights, such as a pt-train run's "
        "inference/step-N",
    )
