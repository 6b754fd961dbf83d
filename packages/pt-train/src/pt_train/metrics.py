"""Step metrics: ``metrics.jsonl`` in the run directory, plus optional TensorBoard, W&B
and MLflow (``logging.*``), where evaluation metrics are ``eval/<name>`` and the rest
``train/<name>``.

One JSON object per logged step: step, loss, lr, grad_norm, tokens_per_s,
tokens (this step, all ranks), trained_tokens (cumulative loss tokens),
peak_memory_gb (CUDA max allocated, or the process's peak RSS on CPU) and mfu
where the accelerator's peak FLOP/s is known.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from pt_core.errors import InputError, RunFailure, first_line
from pt_core.files import atomic_write_text
from pt_core.log import get_logger

if TYPE_CHECKING:  # pt-train plot reads metrics without importing torch
    from pt_train.config import LoggingConfig

log = get_logger(__name__)

# Dense bf16 peak FLOP/s per device, for MFU.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def peak_flops() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def peak_memory_gb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**30
    # ru_maxrss is KiB on Linux, bytes on macOS
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


def training_flops_per_token(model) -> float:
    """~6 x parameters (forward + backward), the usual MFU convention."""
    from pt_train.lora import parameter_numel

    n = sum(parameter_numel(p) for p in model.parameters())
    return 6.0 * n


class MetricsWriter:
    """Rank 0 writes; other ranks hold a writer that does nothing."""

    def __init__(
        self, run_dir: Path, logging_cfg: LoggingConfig, *, enabled: bool, resume_step: int
    ):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = self._wandb = self._mlflow = None
        if not enabled:
            return
        self._truncate_after(resume_step)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        # pt_train.config checked that the packages of the loggers asked for are installed.
        if logging_cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if logging_cfg.wandb:
            self._wandb = _start_wandb(run_dir, logging_cfg)
        if logging_cfg.mlflow:
            self._mlflow = _start_mlflow(run_dir, logging_cfg)

    def _truncate_after(self, step: int) -> None:
        """Drop lines past the checkpoint a resumed run restarts from: those steps run again
        (and a last line torn by a crash)."""
        if not self.path.exists():
            return
        keep = [line for line, r in _read_lines(self.path) if r.get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in keep))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        step = record["step"]
        tagged = logger_tags(record)
        if self._tb is not None:
            for k, v in tagged.items():
                if isinstance(v, int | float):
                    self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(tagged, step=step)
        if self._mlflow is not None:
            numbers = {k: float(v) for k, v in tagged.items() if isinstance(v, int | float)}
            self._mlflow.log_metrics(numbers, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._mlflow is not None:
            self._mlflow.end_run()


def logger_tags(record: dict) -> dict:
    """A metrics record's values under the names TensorBoard, W&B and MLflow show them:
    ``eval/<name>`` for the evaluation's (``eval_loss``, ``eval/<metric>``), ``train/<name>``
    for the rest; the step is their x axis, not a value."""
    tagged = {}
    for key, value in record.items():
        if key == "step":
            continue
        if key.startswith(("eval_", "eval/")):
            tagged[f"eval/{key[5:]}"] = value
        else:
            tagged[f"train/{key}"] = value
    return tagged


def resolved_config(run_dir: Path) -> dict:
    """The run's resolved config, as frozen in ``config.yaml`` (written before the loggers
    start): the hyperparameters W&B and MLflow show beside the curves."""
    import yaml

    return yaml.safe_load((Path(run_dir) / "config.yaml").read_text(encoding="utf-8"))


def _start_wandb(run_dir: Path, logging_cfg: LoggingConfig):
    """A W&B run for ``run_dir`` (resumed with its own id), the resolved config as its
    config. ``logging.wandb_mode`` applies when set; unset, W&B follows WANDB_MODE where the
    user set it, and pt's default is offline."""
    import os

    import wandb

    mode = logging_cfg.wandb_mode
    if mode is None and "WANDB_MODE" not in os.environ:
        mode = "offline"
    return wandb.init(
        project=logging_cfg.wandb_project,
        name=Path(run_dir).name,
        dir=str(run_dir),
        mode=mode,
        resume="allow",
        id=wandb_run_id(run_dir),
        config=resolved_config(run_dir),
    )


MLFLOW_ID_FILE = "mlflow_run_id"


def mlflow_tracking_uri(run_dir: Path, logging_cfg: LoggingConfig) -> str:
    """Where MLflow logs: ``logging.mlflow_tracking_uri``, else MLFLOW_TRACKING_URI, else a
    file store beside the runs, ``<output_dir>/mlruns``. (MLflow 3's own default is a sqlite
    database, which mlflow-skinny cannot open: it has no sqlalchemy.)"""
    uri = logging_cfg.mlflow_tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or (Path(run_dir).resolve().parent / "mlruns").as_uri()


def _start_mlflow(run_dir: Path, logging_cfg: LoggingConfig):
    """An MLflow run for ``run_dir`` in ``logging.mlflow_experiment``; a resumed run goes on
    with the run id stored in ``<run_dir>/mlflow_run_id``. The resolved config is logged as
    the run's parameters (dotted keys), once. Returns the ``mlflow`` module, whose active
    run is this one."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = mlflow_tracking_uri(run_dir, logging_cfg)
    if urlparse(uri).scheme in ("", "file"):
        # MLflow 3 opens its file store only with this opt-in; the store is the one the
        # config asks for (a file: URI or a path), or pt's default
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow.set_tracking_uri(uri)
    stored = Path(run_dir) / MLFLOW_ID_FILE
    try:
        if stored.is_file():
            mlflow.start_run(run_id=stored.read_text(encoding="utf-8").strip())
            return mlflow
        mlflow.set_experiment(logging_cfg.mlflow_experiment)
        run = mlflow.start_run(run_name=Path(run_dir).name)
    except MlflowException as exc:
        raise RunFailure(
            f"MLflow cannot start a run in {uri} (logging.mlflow): {first_line(exc)}",
            hint="check logging.mlflow_tracking_uri (or MLFLOW_TRACKING_URI), or set "
            "logging.mlflow=false",
        ) from None
    atomic_write_text(stored, run.info.run_id + "\n")
    mlflow.log_params(flat_params(resolved_config(run_dir)))
    return mlflow


def flat_params(config: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow parameters: dotted keys, values as text (MLflow keeps 6000
    characters of each)."""
    out = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flat_params(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, default=str)[:6000]
    return out


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: str | Path) -> str:
    """The W&B run id of ``run_dir``: read from ``<run_dir>/wandb_run_id``, or made from the
    run name and a hash of the resolved run directory and stored there on the first call.

    Two runs with the same ``run_name`` in different output directories get different
    ids (so neither resumes the other's W&B run), and a resumed run, even one whose
    directory was moved since, keeps its own.
    """
    run_dir = Path(run_dir)
    stored = run_dir / WANDB_ID_FILE
    if stored.is_file():
        return stored.read_text(encoding="utf-8").strip()
    resolved = str(run_dir.resolve())
    digest = hashlib.blake2b(resolved.encode(), digest_size=6).hexdigest()
    # W&B ids may not hold / \ # ? % : and are shown in URLs: keep the name readable.
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_dir.resolve().name).strip("-.")[:48]
    run_id = f"{name}-{digest}" if name else digest
    atomic_write_text(stored, run_id + "\n")
    return run_id


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of ``<run_dir>/metrics.jsonl``; a malformed line is an InputError naming
    it, except a last line without its newline (a crash mid-write), which is dropped."""
    return [record for _, record in _read_lines(Path(run_dir) / "metrics.jsonl")]


def _read_lines(path: Path) -> list[tuple[str, dict]]:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    records = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"expected a JSON object, got {type(record).__name__}")
        except ValueError as exc:
            if lineno == len(lines) and not text.endswith("\n"):
                log.warning("%s:%d: dropping a torn last line (a crash mid-write)", path, lineno)
                continue
            raise InputError(
                f"{path}:{lineno}: malformed metrics line ({exc})",
                hint="pt-train writes one JSON object per line; remove that line",
            ) from None
        records.append((line, record))
    return records
