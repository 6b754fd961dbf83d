"""The `pt` command: tools listed without being imported, a clear message for a tool that
is not installed, and `pt env`. (Running the tools through `pt` is tested at the
workspace root, where every tool is installed: tests/test_umbrella.py.)"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pt_core.errors import PtError
from pt_core.umbrella import TOOLS, tool_entry_point

PT = str(Path(sys.executable).with_name("pt"))


def test_help_lists_every_tool_without_importing_one():
    """pt-core stays light: `pt --help` names the tools from a table, and no tool's
    package is imported until its subcommand runs."""
    code = textwrap.dedent(
        """
        import sys
        from pt_core.umbrella import app
        try:
            app(["--help"], prog_name="pt", standalone_mode=False)
        except SystemExit:
            pass
        tools = ("pt_data", "pt_train", "pt_rollout", "pt_eval", "pt_slurm", "torch")
        print(sorted({m.split(".")[0] for m in sys.modules} & set(tools)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    *help_lines, imported = proc.stdout.splitlines()
    assert imported == "[]"
    commands = help_lines[help_lines.index("Commands:") + 1 :]
    listed = [line.split()[0] for line in commands if line.startswith("  ") and line[2] != " "]
    for name in (*TOOLS, "env"):
        assert name in listed, proc.stdout


def test_a_tool_that_is_not_installed_is_named_with_the_fix(monkeypatch):
    monkeypatch.setitem(TOOLS, "nope", ("pt-nope", "Not a real tool."))
    with pytest.raises(PtError) as err:
        tool_entry_point("nope")
    assert err.value.message == "pt nope: pt-nope is not installed in this environment"
    assert "uv pip install ./packages/pt-nope" in err.value.hint


def test_env_reports_this_interpreter_its_packages_and_slurm(tmp_path):
    """`pt env --json` describes the environment it runs in: each figure here is read
    independently from this interpreter, its installed metadata and PATH."""
    proc = subprocess.run([PT, "env", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["python"] == platform.python_version()
    assert info["pt"]["pt-core"] == importlib.metadata.version("pt-core")
    names = ("torch", "transformers", "deepspeed", "vllm", "peft", "bitsandbytes", "wandb",
             "tensorboard")  # fmt: skip
    for name in names:
        try:
            expected = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected = None
        assert info["libraries"][name] == expected, name
    # MLflow under the name of the distribution installed: mlflow, or the mlflow-skinny
    # that pt-train[mlflow] installs (whose default store it cannot open)
    mlflow = {k: v for k, v in info["libraries"].items() if k.startswith("mlflow")}
    for distribution in ("mlflow", "mlflow-skinny"):
        try:
            assert mlflow == {distribution: importlib.metadata.version(distribution)}
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        assert mlflow == {"mlflow": None}
    assert info["devices"]["kind"] in ("cpu", "cuda")
    assert info["devices"]["count"] == len(info["devices"]["names"])
    assert info["slurm"]["sbatch"] == shutil.which("sbatch")
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        assert info["slurm"]["sinfo"] is None and info["slurm"]["error"] is None
    else:
        ran = subprocess.run([sinfo, "--summarize"], capture_output=True, text=True, timeout=30)
        if ran.returncode == 0:
            assert info["slurm"]["sinfo"] == ran.stdout.rstrip()
        else:
            assert info["slurm"]["error"].startswith(f"sinfo exited {ran.returncode}: ")


def test_env_imports_no_heavy_library():
    """`pt env` reads versions from metadata and devices from nvidia-smi: importing torch
    (or transformers, which imports it) would cost seconds for figures it does not need."""
    code = textwrap.dedent(
        """
        import sys
        from pt_core.umbrella import app
        app(["env", "--json"], prog_name="pt", standalone_mode=False)
        heavy = ("torch", "transformers", "deepspeed", "vllm", "numpy")
        print(sorted({m.split(".")[0] for m in sys.modules} & set(heavy)))
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    report, imported = proc.stdout.splitlines()
    assert json.loads(report)["libraries"]["torch"] == importlib.metadata.version("torch")
    assert imported == "[]"


def test_env_finds_the_vllm_side_environment_and_prints_a_report(tmp_path):
    side = tmp_path / ".venv-vllm" / "bin"
    side.mkdir(parents=True)
    (side / "python").write_text("")
    work = tmp_path / "project" / "sub"
    work.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([PT, "env"], capture_output=True, text=True, cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert f"side environment {tmp_path / '.venv-vllm'}" in rows["vllm"]
    for name in ("python", "torch", "transformers", "deepspeed", "pt-core", "devices", "sbatch"):
        assert name in rows, proc.stdout
