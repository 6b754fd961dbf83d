"""A run under ``ATEN_CPU_CAPABILITY`` compiles torch kernels in a cache of its own, so that
a kernel vectorised by a run with the CPU's own instructions is not found, and built without
them, by a run with ``ATEN_CPU_CAPABILITY=default`` (the vLLM engine calls
``separate_inductor_cache`` before vLLM compiles its sampler)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pt_rollout.engines.vllm import separate_inductor_cache

# A masked count over a row of logits: the shape of the kernel vLLM's top-k sampler compiles.
SCRIPT = """
import torch
from pt_rollout.engines.vllm import separate_inductor_cache

separate_inductor_cache()

@torch.compile(dynamic=True)
def count(x, t):
    return (x >= t[:, None]).sum(-1)

x = torch.arange(3 * 462, dtype=torch.float32).reshape(3, 462)
print(count(x, torch.tensor([0.0, 500.0, 1000.0])).tolist())
"""


def test_only_a_run_that_sets_the_capability_moves_and_a_named_cache_stays(monkeypatch, tmp_path):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    default = os.path.abspath(default_cache_dir())
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    separate_inductor_cache()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    separate_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == f"{default}-default"
    # torch names its default cache in the variable once it has used it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    separate_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == f"{default}-avx2"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    separate_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path)


@pytest.mark.slow
def test_a_kernel_vectorised_by_one_run_compiles_in_a_run_under_the_default_kernels(tmp_path):
    """The CPU's own kernels first, then ``default``, with torch's default cache in one
    folder (TMPDIR): both compile and count the same."""
    import torch
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    own = torch.backends.cpu.get_cpu_capability().lower()
    if own == "default":
        pytest.skip("this CPU has no vector instructions for torch to choose")
    found = []
    for capability in (own, "default"):
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        env |= {"TMPDIR": str(tmp_path), "ATEN_CPU_CAPABILITY": capability, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        found.append(done.stdout.split("\n")[-2])
    assert found[0] == found[1] == "[462, 424, 386]"
    default = Path(tmp_path) / Path(default_cache_dir()).name
    for capability in (own, "default"):
        assert any(Path(f"{default}-{capability}").rglob("*.main.cpp"))
