"""The workspace as a user meets it: five console scripts with help and a version, and the
torch-free tools installable on their own."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = ["pt-data", "pt-train", "pt-rollout", "pt-eval", "pt-slurm"]


@pytest.mark.parametrize("tool", TOOLS)
def test_every_tool_prints_help_and_version(cli, tool):
    help_ = cli(tool, "--help")
    assert "Usage" in help_.stdout and tool in help_.stdout
    version = cli(tool, "--version")
    assert version.stdout.strip() == f"{tool} {importlib.metadata.version(tool)}"


@pytest.mark.parametrize("package", ["pt-core", *TOOLS])
def test_a_packages_version_is_its_pyproject_version(package):
    """The version is written once, in the package's pyproject.toml; its ``__version__``
    (what ``--version`` and the manifests' ``created_by`` print) is read from there."""
    import tomllib

    pyproject = tomllib.loads((REPO / "packages" / package / "pyproject.toml").read_text())
    module = importlib.import_module(package.replace("-", "_"))
    assert module.__version__ == pyproject["project"]["version"]


@pytest.mark.parametrize("package", ["pt-eval", "pt-slurm"])
def test_light_tools_install_without_torch(tmp_path, package):
    """pt-eval grade and pt-slurm run on login nodes and CPU boxes: installing either into an
    empty environment must not pull torch (or transformers)."""
    uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(uv).exists() and not shutil.which("uv"):
        pytest.skip("uv is not on PATH")
    venv = tmp_path / "venv"
    env = {**os.environ, "UV_NO_PROGRESS": "1"}
    env.pop("VIRTUAL_ENV", None)
    subprocess.run([uv, "venv", "-q", str(venv)], check=True, env=env)
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(venv), str(REPO / "packages" / package)],
        check=True,
        env=env,
    )
    listed = subprocess.run(
        [uv, "pip", "list", "--python", str(venv)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.lower()
    assert package in listed
    for heavy in ("torch", "transformers", "deepspeed", "vllm"):
        assert f"\n{heavy} " not in listed, f"{package} pulled {heavy}"
    tool = venv / "bin" / package
    assert subprocess.run([str(tool), "--help"], capture_output=True).returncode == 0
    # pt (pt-core's) runs the tool that is there and names the one that is not
    pt = str(venv / "bin" / "pt")
    short = package.removeprefix("pt-")
    assert subprocess.run([pt, short, "--version"], capture_output=True).returncode == 0
    missing = subprocess.run([pt, "train", "run", "x.yaml"], capture_output=True, text=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("error: pt train: pt-train is not installed"), missing.stderr


@pytest.mark.parametrize("tool", TOOLS)
def test_usage_errors_are_one_message_not_a_traceback(cli, tool):
    proc = cli(tool, "no-such-command", "--no-such-option", check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "No such command" in proc.stderr
    assert proc.stdout == ""


def test_ruff_is_clean():
    ruff = Path(sys.executable).with_name("ruff")
    proc = subprocess.run([str(ruff), "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
