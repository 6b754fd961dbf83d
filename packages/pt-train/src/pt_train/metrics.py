"""Step metrics: ``metrics.jsonl`` in the run directory, plus optional TensorBoard and W&B.

One JSON object per logged step: step, loss, lr, grad_norm, tokens_per_s,
tokens (this step, all ranks), trained_tokens (cumulative loss tokens),
peak_memory_gb (CUDA max allocated, or the process's peak RSS on CPU) and mfu
where the accelerator's peak FLOP/s is known.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch

from pt_core.errors import ConfigError
from pt_core.log import get_logger
from pt_train.config import LoggingConfig

log = get_logger(__name__)

# Dense bf16 peak FLOP/s per device, for MFU.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12}


def peak_flops() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def peak_memory_gb() -> float:
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
                id=Path(run_dir).name,
            )

    def _truncate_after(self, step: int) -> None:
        """Drop lines past the checkpoint a resumed run restarts from: those steps run again."""
        if not self.path.exists():
            return
        keep = []
        for line in self.path.read_text().splitlines():
            if line.strip() and json.loads(line).get("step", 0) <= step:
                keep.append(line + "\n")
        self.path.write_text("".join(keep))

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


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
