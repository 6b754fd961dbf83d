"""Fixtures shared by every package's tests: a tiny tokenizer and a tiny Llama, built
locally once per test session (no network)."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DS_ACCELERATOR", "cpu")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer with a ChatML template, saved to disk."""
    from pt_data.tokenizer import build_tokenizer

    out = tmp_path_factory.mktemp("tiny-tokenizer")
    build_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A randomly initialised 2-layer Llama (hidden 128, head_dim 64) with its tokenizer,
    loadable by transformers and vLLM."""
    from pt_train.model import build_llama

    out = tmp_path_factory.mktemp("tiny-model")
    model = build_llama(tiny_tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=0)
    model.save_pretrained(str(out))
    tiny_tokenizer.save_pretrained(str(out))
    return out


def run_cli(*args, input=None, env=None, check=True, cwd=None, timeout=600):
    """Run a console script of this workspace as a user would, in a subprocess."""
    import subprocess

    bindir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bindir, args[0]), *map(str, args[1:])]
    proc = subprocess.run(
        cmd,
        input=input,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


@pytest.fixture
def cli():
    return run_cli
