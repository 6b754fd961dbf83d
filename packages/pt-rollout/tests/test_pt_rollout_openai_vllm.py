"""pt on the OpenAI-compatible wire with vLLM, on the real-shape Qwen2 model: pt as a
client of ``vllm serve`` (generation, and teacher scores equal to ``pt-rollout score
--engine vllm`` in-process), and ``pt-rollout serve-openai --engine vllm`` sampling what
``vllm serve`` samples.

Both servers run in the side environment .venv-vllm (started once for the module, side
by side); the clients run here, as a user's would.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from openai_servers import start_pt_server, start_vllm_server
from test_pt_rollout_openai import largest_difference, manifest, one_error, rows, run
from test_pt_rollout_vllm import ENV, VLLM_BIN, require_vllm, run_in_vllm_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1800)]

PROMPTS = [
    {"id": 0, "prompt": "The capital of France is"},
    {"id": 1, "prompt": "Write a haiku about the sea."},
    {"id": 2, "prompt": [{"role": "user", "content": "def add(a, b):"}]},
]
SAMPLING = ["--n", "2", "--max-tokens", "16", "--temperature", "1.0", "--seed", "3"]
TOP_K = 5


@pytest.fixture(scope="module")
def servers(qwen2_model_dir, tmp_path_factory):
    require_vllm()
    logs = tmp_path_factory.mktemp("servers")
    with ThreadPoolExecutor(2) as pool:  # the two start side by side
        vllm = pool.submit(start_vllm_server, VLLM_BIN / "python", qwen2_model_dir,
                           logs / "vllm.log", "--dtype", "float32", "--enforce-eager", env=ENV)  # fmt: skip
        pt = pool.submit(start_pt_server, qwen2_model_dir, logs / "pt.log", "--engine", "vllm",
                         "--dtype", "float32", python=VLLM_BIN / "python", env=ENV,
                         timeout=600)  # fmt: skip
        started = {"vllm": vllm.result(), "pt": pt.result()}
    yield started
    left = {name: served.stop() for name, served in started.items()}
    # stopped (SIGTERM), each server ends with the processes it started: vLLM's engine
    # core, in a process of its own, is not left running without it
    assert left == {"vllm": [], "pt": []}, left


@pytest.fixture(scope="module")
def rollouts(servers, qwen2_model_dir, tmp_path_factory):
    """Rollouts sampled by vllm serve through pt's client, and the prompts."""
    work = tmp_path_factory.mktemp("wire")
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in PROMPTS))
    out = work / "rollouts.jsonl"
    proc = run("pt-rollout", "generate", "--endpoint", servers["vllm"].url, "--model",
                   qwen2_model_dir, "--prompts", prompts, "--out", out, *SAMPLING,
                   "--logprobs")  # fmt: skip
    assert manifest(proc)["rows"] == 6
    return {"prompts": prompts, "path": out, "rows": rows(out)}


def test_teacher_scores_through_vllm_serve_equal_vllm_in_process(
    servers, rollouts, qwen2_model_dir, tmp_path, cli
):
    """The teacher scores a vLLM server gives (its prompt_logprobs) are the scores of
    ``pt-rollout score --engine vllm`` in-process, at every completion token, top-k
    included; pt's own server on the vLLM engine gives them too."""
    through = {}
    for name, served in servers.items():
        out = tmp_path / f"scores-{name}.jsonl"
        proc = cli("pt-rollout", "score", "--endpoint", served.url, "--teacher", served.model,
                   "--rollouts", rollouts["path"], "--top-k", TOP_K, "--out", out)  # fmt: skip
        assert manifest(proc)["scored"] == 6
        through[name] = rows(out)
    local = tmp_path / "scores-in-process.jsonl"
    run_in_vllm_env([VLLM_BIN / "pt-rollout", "score", "--engine", "vllm", "--teacher",
                     qwen2_model_dir, "--rollouts", rollouts["path"], "--top-k", TOP_K,
                     "--dtype", "float32", "--out", local])  # fmt: skip
    in_process = rows(local)
    for name, scored in through.items():
        assert [r["teacher_topk_ids"] for r in scored] == [
            r["teacher_topk_ids"] for r in in_process
        ], name
        for key in ("teacher_token_logprobs", "teacher_topk_logprobs"):
            difference = largest_difference([r[key] for r in scored], [r[key] for r in in_process])
            print(f"{name} server, {key}: largest difference {difference:.3g}")
            assert difference <= 1e-4, (name, key, difference)
    # the sampled tokens' log-probs vllm serve returned are the teacher's (same model)
    assert largest_difference([r["completion_logprobs"] for r in rollouts["rows"]],
                              [r["teacher_token_logprobs"] for r in in_process]) <= 1e-4  # fmt: skip


def test_pt_serve_openai_on_vllm_samples_what_vllm_serve_samples(
    servers, rollouts, qwen2_model_dir, tmp_path, cli
):
    out = tmp_path / "rollouts.jsonl"
    cli("pt-rollout", "generate", "--endpoint", servers["pt"].url, "--model", qwen2_model_dir,
        "--prompts", rollouts["prompts"], "--out", out, *SAMPLING, "--logprobs")  # fmt: skip
    # the same seeds through both servers: the same tokens
    assert [r["completion_token_ids"] for r in rows(out)] == [
        r["completion_token_ids"] for r in rollouts["rows"]
    ]
    # the openai client against pt's server on vLLM: a chat, streamed as it is sampled
    api = openai.OpenAI(base_url=servers["pt"].url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "Tell me a story."}]
    whole = api.chat.completions.create(model=servers["pt"].model, messages=messages,  # pyright: ignore[reportArgumentType]
                                        max_tokens=24, seed=5, temperature=1.0)  # fmt: skip
    pieces = [
        choice.delta.content or ""
        for chunk in api.chat.completions.create(
            model=servers["pt"].model,
            messages=messages,  # pyright: ignore[reportArgumentType]
            max_tokens=24,
            seed=5,
            temperature=1.0,
            stream=True,
        )  # fmt: skip
        for choice in chunk.choices
    ]
    assert len([p for p in pieces if p]) > 1
    assert "".join(pieces) == whole.choices[0].message.content


def test_more_log_probs_than_the_server_gives_is_one_line_with_the_fix(
    servers, rollouts, tmp_path, cli
):
    # vllm serve gives at most 20 log-probs a position unless started with more
    proc = cli("pt-rollout", "score", "--endpoint", servers["vllm"].url, "--teacher",
               servers["vllm"].model, "--rollouts", rollouts["path"], "--top-k", "25",
               "--out", tmp_path / "s.jsonl", check=False)  # fmt: skip
    one_error(proc, 2, "HTTP 400", "fix:", "--max-logprobs")
    assert not list(tmp_path.glob("s.jsonl*"))
