"""Step metrics: ``metrics.jsonl`` in the run directory, plus optional TensorBoard and W&B.

One JSON object per logged step: step, loss, lr, grad_norm, tokens_per_s,
tokens (this step, all ranks), trained_tokens (cumulative loss tokens),
peak_memory_gb (CUDA max allocated, or the process's peak RSS on CPU) and mfu
where the accelerator's peak FLOP/s is known.
"""

from __future__ import annotations

import hashlib
import json
import re
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pt_core.errors import ConfigError, InputError
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
    n = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    return 6.0 * n


class MetricsWriter:
    """Rank 0 writes; other ranks hold a writer that does nothing."""

    def __init__(
        self, run_dir: Path, logging_cfg: LoggingConfig, *, enabled: bool, resume_step: int
    ):
        self.enabled = enabled
        self.path = Path(run_dir) / "metrics.jsonl"
        self._tb = self._wandb = None
        if not enabled:
            return
        self._truncate_after(resume_step)
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        if logging_cfg.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError(
                    "logging.tensorboard is on but the tensorboard package is not installed",
                    hint="pip install tensorboard, or set logging.tensorboard=false",
                ) from None
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if logging_cfg.wandb:
            try:
                import wandb
            except ImportError:
                raise ConfigError(
                    "logging.wandb is on but the wandb package is not installed",
                    hint="pip install wandb, or set logging.wandb=false",
                ) from None
            self._wandb = wandb.init(
                project=logging_cfg.wandb_project,
                name=Path(run_dir).name,
                dir=str(run_dir),
                mode=logging_cfg.wandb_mode,
                resume="allow",
                id=wandb_run_id(run_dir),
            )

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
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, int | float):
                    self._tb.add_scalar(f"train/{k}", v, step)
        if self._wandb is not None:
            self._wandb.log({f"train/{k}": v for k, v in record.items() if k != "step"}, step=step)

    def close(self) -> None:
        if not self.enabled:
            return
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


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
