"""`pt env`: what a bug report needs about this environment.

Versions come from the installed distributions' metadata and devices from nvidia-smi, so
nothing heavy is imported (torch alone takes seconds to import).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

# The libraries a bug report names: the training stack, then what model.lora and the loggers
# pull in. Each is one or more distributions of one library, the first installed named.
LIBRARIES = (
    ("torch",),
    ("transformers",),
    ("deepspeed",),
    ("vllm",),
    ("peft",),
    ("bitsandbytes",),
    ("mlflow", "mlflow-skinny"),  # pt-train[mlflow] installs mlflow-skinny
    ("wandb",),
    ("tensorboard",),
)
PT_PACKAGES = ("pt-core", "pt-data", "pt-train", "pt-rollout", "pt-eval", "pt-slurm")
COMMAND_TIMEOUT_S = 5.0
NVIDIA_DRIVER = Path("/proc/driver/nvidia")


def environment() -> dict:
    """Python, library and pt versions, devices and SLURM, as a JSON-ready dict."""
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "libraries": dict(library_version(names) for names in LIBRARIES),
        "vllm_side_env": _vllm_side_env(),
        "pt": {name: installed_version(name) for name in PT_PACKAGES},
        "devices": devices(),
        "slurm": slurm(),
    }


def library_version(distributions: tuple[str, ...]) -> tuple[str, str | None]:
    """``(distribution, version)`` of the first of ``distributions`` installed, else
    ``(the first, None)``."""
    for name in distributions:
        version = installed_version(name)
        if version is not None:
            return name, version
    return distributions[0], None


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_side_env() -> str | None:
    """The ``.venv-vllm`` that .ci/setup-vllm.sh builds at the root of the workspace:
    looked for in the working directory and its parents, then beside this interpreter's
    environment."""
    candidates = [Path.cwd(), *Path.cwd().parents, Path(sys.prefix).parent]
    for folder in candidates:
        side = folder / ".venv-vllm"
        if (side / "bin" / "python").exists():
            return str(side)
    return None


def devices() -> dict:
    """CUDA devices as nvidia-smi lists them; else the CPU. torch (seconds to import) is
    asked only on a machine with the NVIDIA driver loaded but no nvidia-smi on PATH."""
    cpu = {"kind": "cpu", "count": 0, "names": [], "cpu_count": os.cpu_count()}
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        out = _run([smi, "--query-gpu=name", "--format=csv,noheader"])
        names = [line.strip() for line in out.get("stdout", "").splitlines() if line.strip()]
    elif NVIDIA_DRIVER.exists() and importlib.util.find_spec("torch") is not None:
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        names = [torch.cuda.get_device_name(i) for i in range(count)]
    else:
        names = []
    if not names:
        return cpu
    return {"kind": "cuda", "count": len(names), "names": names, "cpu_count": os.cpu_count()}


def slurm() -> dict:
    """Whether jobs can be submitted from here: sbatch on PATH, and sinfo's partition summary
    (each command waited for at most COMMAND_TIMEOUT_S)."""
    info: dict = {"sbatch": shutil.which("sbatch"), "sinfo": None, "error": None}
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return info
    out = _run([sinfo, "--summarize"])
    if "error" in out:
        info["error"] = out["error"]
    else:
        info["sinfo"] = out["stdout"].rstrip()
    return info


def _run(argv: list[str]) -> dict:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{Path(argv[0]).name} did not answer within {COMMAND_TIMEOUT_S:g} s"}
    except OSError as exc:
        return {"error": f"{Path(argv[0]).name}: {exc}"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {
            "error": f"{Path(argv[0]).name} exited {proc.returncode}: {lines[-1] if lines else ''}"
        }
    return {"stdout": proc.stdout}


def format_environment(info: dict) -> str:
    """The report as aligned ``name  value`` lines."""
    rows = [("python", f"{info['python']} ({info['executable']})"), ("platform", info["platform"])]
    for name, version in info["libraries"].items():
        value = version or "not installed"
        if name == "vllm":
            side = info["vllm_side_env"]
            value += f"; side environment {side}" if side else "; no .venv-vllm found"
        rows.append((name, value))
    for name, version in info["pt"].items():
        rows.append((name, version or "not installed"))
    dev = info["devices"]
    if dev["kind"] == "cuda":
        rows.append(("devices", f"{dev['count']} CUDA: {', '.join(dev['names'])}"))
    else:
        rows.append(("devices", f"CPU only ({dev['cpu_count']} cores), no CUDA device"))
    slurm_info = info["slurm"]
    rows.append(("sbatch", slurm_info["sbatch"] or "not on PATH"))
    if slurm_info["error"]:
        rows.append(("sinfo", slurm_info["error"]))
    elif slurm_info["sinfo"] is not None:
        summary = slurm_info["sinfo"].splitlines()
        rows.append(("sinfo", summary[0] if summary else ""))
        rows.extend(("", line) for line in summary[1:])
    else:
        rows.append(("sinfo", "not on PATH"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}".rstrip() for name, value in rows)
