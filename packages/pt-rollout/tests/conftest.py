"""pt-rollout's tests: the suite imports test modules by path (--import-mode=importlib); the
helpers beside them (rollout_commands.py) are imported by name from this folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="session")
def one_process(tiny_model_dir, other_model_dir, tiny_tokenizer):
    """What a single generator process answers to :func:`serving.requests` (sampled, with
    the teacher other_model_dir's scores): on the starting weights, then on
    other_model_dir's pushed as version 3."""
    from serving import generate, requests

    from pt_rollout.serve import GeneratorPool, GeneratorSpec

    reqs = requests(tiny_tokenizer)
    spec = GeneratorSpec(model=str(tiny_model_dir), teacher=str(other_model_dir))
    with GeneratorPool(spec) as pool:
        before = generate(pool, reqs)
        pool.wait(pool.submit_load_weights(str(other_model_dir), 3))
        after = generate(pool, reqs)
    assert len(before["completions"]) == len(after["completions"]) == 7
    assert before["completions"] != after["completions"]  # the push changed the samples
    return before, after
