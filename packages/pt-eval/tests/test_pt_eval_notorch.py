"""`pt-eval grade` installs and runs without torch."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from pt_core.files import write_rows

REPO = Path(__file__).resolve().parents[3]


def _requirements_closure(dist: str, seen: set[str] | None = None) -> set[str]:
    """Every distribution ``dist`` pulls in, extras left out."""
    seen = set() if seen is None else seen
    name = re.sub(r"[-_.]+", "-", dist).lower()
    if name in seen:
        return seen
    seen.add(name)
    for requirement in metadata.requires(dist) or []:
        if "extra ==" in requirement:
            continue
        child = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)
        try:
            _requirements_closure(child, seen)
        except metadata.PackageNotFoundError:
            seen.add(child.lower())  # an environment marker excluded it here
    return seen


def test_torch_is_not_among_the_dependencies():
    closure = _requirements_closure("pt-eval")
    assert {"pt-core", "sympy"} <= closure
    assert not closure & {"torch", "transformers", "vllm", "pt-rollout", "pt-train"}


def test_grading_never_imports_torch(cli, tmp_path):
    # a torch that refuses to import, ahead of the real one on the path of every process
    fake = tmp_path / "blocked" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('pt-eval grade must not import torch')\n")
    src = write_rows(
        tmp_path / "p.jsonl", [{"id": 1, "completion": "\\boxed{1/2}", "answer": "0.5"}]
    )
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")])
        )
    }
    proc = cli("pt-eval", "grade", src, "--workers", "1", env=env)
    assert json.loads(proc.stdout)["accuracy"] == 1.0


@pytest.mark.slow
def test_a_fresh_environment_without_torch_grades(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv), "-p", sys.executable], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [uv, "pip", "install", "-q", "--offline", "--python", str(python),
         str(REPO / "packages" / "pt-core"), str(REPO / "packages" / "pt-eval")],
        capture_output=True, text=True,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip(f"no network and the packages are not in uv's cache: {install.stderr[-300:]}")
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert probe.stdout.strip() == "True"
    src = write_rows(tmp_path / "p.jsonl", [{"id": 1, "completion": "\\boxed{3}", "answer": "3"}])
    proc = subprocess.run(
        [str(venv / "bin" / "pt-eval"), "grade", str(src), "--workers", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["accuracy"] == 1.0
