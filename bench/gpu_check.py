"""The GPU paths of pt-train on one GPU, in one run of at most 8 minutes (its budget);
bench/gpu_check.sh starts it (after installing the wheels that bench/gpu_wheels.sh made).

    bash bench/gpu_check.sh               # on a GPU machine: Qwen2.5-shaped models, bf16
    bash bench/gpu_check.sh --dry-run     # on a CPU, tiny shapes: the plan, one check run

Models have random weights and the shapes of Qwen2.5-0.5B (hidden 896, 24 layers, 14
heads, 2 KV heads, MLP 4864) and Qwen2.5-1.5B (1536, 28, 12, 2, 8960), with tied
embeddings and Qwen's 151,936 vocabulary rows: a local tokenizer from ``pt-data
tokenizer``, padded by ``model.init.vocab_size``. ``model.init`` builds Llamas only, so
they are Llamas (no q/k/v biases: 0.1% fewer weights than Qwen2). Nothing is downloaded.
Each check is one process of a pt CLI, as a user runs it, killed when it outlives its
share of the budget; a check that no longer fits in what is left is skipped. In order:

- ``sft-{0.5b,1.5b}-{zero2,zero0}``: SFT on rows of 2,048 random tokens, bf16, sdpa,
  DeepSpeed ZeRO-2 and stage 0 (pt-train trains bf16 through DeepSpeed; its plain engine
  takes fp32 only). tokens/s: the median of pt-train's ``tokens_per_s`` after the first
  steps. MFU: 6 x parameters x tokens/s / 790e12, the bf16 dense matrix rate measured on
  an H200 (tied embeddings count once; attention scores are not counted). Peak memory:
  the largest ``peak_memory_gb`` (CUDA max allocated).
- ``dft-0.5b``; ``dpo-0.5b`` (pairs of text; the reference is the starting weights);
  ``opd-0.5b``: one round of the online loop, the HF engine generating in the trainer's
  process, scored by a second 0.5B model; ``grpo-0.5b``: two such rounds, graded by
  pt-eval.
- ``grpo-0.5b-server``: GRPO's two rounds from a generator process (``rollout.generator:
  server``, the HF engine on the same GPU): the second round's weights pushed as safetensors
  in /dev/shm (``weight_push_s``, the write) and loaded by the generator (``weight_load_s``).
  Each round's generation time is recorded (``generate_s_rounds``), the first one's
  included, for both GRPO checks.
- ``rollout-per-sample``, ``rollout-engine``: ``pt-rollout generate --engine hf`` on the
  same model and prompts with ``--seeding per-sample`` (the default: every (id, sample)
  its own seed, for exact resume) and ``--seeding engine``: generated tokens/s of each.
- ``sft-0.5b-plain-fp32``: the plain engine (one process, stage 0, fp32) on the GPU.
- ``sft-0.5b-flash-attn``: flash_attention_2 where flash_attn imports (skipped otherwise).
- ``vllm-*``, where vllm imports (skipped elsewhere: vLLM does not fit in what travels to
  the GPU machine): GRPO's two rounds from the 0.5B SFT model with the colocated vLLM
  engine (``sleep_level: 2``), and with a vLLM generator process on the same GPU, pushed
  as files and over CUDA IPC (``weight_push_s``, ``weight_load_s``), and over NCCL to a
  second GPU where there is one; ``bench/weight_push.py --way ipc`` (files against CUDA
  IPC, Qwen2.5-0.5B's and 1.5B's shapes); ``pt-rollout generate --engine vllm`` with
  per-sample and engine seeding.

``--only NAME,NAME`` runs those checks (with ``setup``, and ``sft-0.5b-zero2`` when one of
them starts from its model) and plans the rest, as a dry run does.

A dry run trains ``sft-0.5b-zero2`` only (DeepSpeed's CPU accelerator, bf16) and plans
the rest: each other check's config is written and validated by pt-train's config loader
in one process, and its JSON entry holds that config (or the command line), with status
``planned``.

One line per check on stdout; every figure in ``<out>/gpu_check.json``, the end of each
check's log in ``<out>/gpu_check.log``. Exit code 1 when a check failed.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PT_PACKAGES = ("pt-core", "pt-data", "pt-rollout", "pt-eval", "pt-train")
PEAK_FLOPS = 790e12  # bf16 dense matrix products, measured on one H200
QWEN_VOCAB = 151_936
BUDGET_S = 480.0  # all of bash bench/gpu_check.sh, the wheel install included
RESERVE_S = 10.0  # kept back for writing the results
LOG_TAIL_LINES = 120
CHECKS = (
    "setup",
    "sft-0.5b-zero2", "sft-0.5b-zero0", "sft-1.5b-zero2", "sft-1.5b-zero0",
    "dft-0.5b", "dpo-0.5b", "opd-0.5b", "grpo-0.5b", "grpo-0.5b-server",
    "rollout-per-sample", "rollout-engine",
    "sft-0.5b-plain-fp32", "sft-0.5b-flash-attn",
    "vllm-grpo-0.5b-colocate", "vllm-grpo-0.5b-server-files", "vllm-grpo-0.5b-server-ipc",
    "vllm-grpo-0.5b-server-nccl", "vllm-weight-push", "vllm-rollout-per-sample",
    "vllm-rollout-engine",
)  # fmt: skip
NAME_WIDTH = max(len(name) for name in CHECKS) + 2  # of summary_line's first column
# The checks of pt's vLLM paths: run where vllm imports, skipped (VLLM_REASON) elsewhere.
VLLM_CHECKS = tuple(name for name in CHECKS if name.startswith("vllm-"))
# The checks that start from the model sft-0.5b-zero2 trains.
FROM_SMALL_MODEL = (
    "dpo-0.5b", "opd-0.5b", "grpo-0.5b", "grpo-0.5b-server", "rollout-per-sample",
    "rollout-engine", *VLLM_CHECKS,
)  # fmt: skip
VLLM_REASON = (
    "vllm does not import here: it does not fit in what the device tool carries to the GPU "
    "machine (64 MiB in all; vLLM's wheel and the CUDA libraries it pins are far larger)"
)
NCCL_REASON = "one GPU: weight transfer over nccl joins the trainer's GPU with another"
FLASH_REASON = (
    "flash_attn does not import; the GPU machine does not have it and it does not travel "
    "(a CUDA build of its own, far larger than what is carried)"
)
MFU_CONVENTION = (
    "6 x parameters x tokens/s / 790e12: the forward and backward matrix products of the "
    "weights (tied embeddings counted once, attention scores not counted) against the bf16 "
    "dense rate measured on one H200"
)
# Words of the prompts and text pairs (their tokens are the local tokenizer's).
TEXT = (
    "the quick brown fox jumps over lazy dog please reason step by step and put your final "
    "answer within boxed what is twelve plus thirty four we add tens ones compute seven "
    "times eight minus five first then train travels sixty miles in two hours so its speed"
)
WORDS = tuple(TEXT.split())
# What the environment check prints: versions and devices (pt env), and what imports.
PROBE = """
import importlib.util, json
from pt_core.env import environment
info = environment()
info.pop("slurm", None)
try:
    import deepspeed
    info["deepspeed_import"] = None
except Exception as exc:
    info["deepspeed_import"] = f"{type(exc).__name__}: {exc}"
info["flash_attn"] = importlib.util.find_spec("flash_attn") is not None
info["vllm"] = importlib.util.find_spec("vllm") is not None
print(json.dumps(info))
"""
# What validates planned configs: pt-train's config loader and batch layout, one process
# for all of them.
VALIDATE = """
import json, sys
from pt_train.config import batch_layout, load_train_config
found = {}
for path in sys.argv[1:]:
    try:
        cfg = load_train_config(path)
        found[path] = {"grad_accum": batch_layout(cfg.training, cfg.launcher.nproc)}
    except Exception as exc:
        found[path] = {"error": f"{type(exc).__name__}: {exc}"}
print(json.dumps(found))
"""


class CheckError(Exception):
    """A step that the later checks depend on failed."""


@dataclasses.dataclass(frozen=True)
class Shape:
    label: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int

    def parameters(self, vocab: int) -> int:
        """Weights of the tied-embedding Llama of this shape: the embedding (= LM head);
        per layer q, k, v, o, gate, up, down and two norms; the final norm."""
        head_dim = self.hidden // self.heads
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        mlp = 3 * self.hidden * self.intermediate
        return vocab * self.hidden + self.layers * (attention + mlp + 2 * self.hidden) + self.hidden

    def init(self, tokenizer: str, vocab: int, max_len: int) -> dict:
        """pt-train's ``model.init`` section."""
        return {
            "architecture": "llama",
            "tokenizer": tokenizer,
            "hidden_size": self.hidden,
            "num_layers": self.layers,
            "num_heads": self.heads,
            "num_kv_heads": self.kv_heads,
            "intermediate_size": self.intermediate,
            "max_position_embeddings": max_len,
            "tie_word_embeddings": True,
            "vocab_size": vocab,
        }


@dataclasses.dataclass(frozen=True)
class Plan:
    """Sizes and time limits of one mode (GPU or dry run)."""

    small: Shape
    large: Shape
    vocab: int
    precision: str  # of every check but the plain engine's
    seq: int  # tokens per SFT row
    rows: int  # SFT/DFT rows per optimizer step
    micro: dict  # SFT/DFT rows per forward pass, by shape label
    steps: int  # SFT steps
    warmup: int  # first steps left out of the tokens/s median
    short_steps: int  # DFT, DPO, plain engine
    pairs: int  # DPO pairs in the data
    pair_batch: int  # DPO pairs per optimizer step
    pair_micro: int
    pair_words: int  # words per DPO completion
    opd_prompts: int  # OPD prompts per round, one sample each
    grpo_prompts: int
    grpo_samples: int
    online_tokens: int  # new tokens per online sample
    rollout_prompts: int
    rollout_n: int
    rollout_tokens: int
    rollout_dtype: str
    timeout: dict  # seconds a check may run, by kind
    needs: dict  # seconds that must be left to start a check, by kind
    # The checks that run; the others are planned (written and validated). None: all run.
    run_only: tuple[str, ...] | None = None


QWEN_05B = Shape("Qwen2.5-0.5B", 896, 24, 14, 2, 4864)
QWEN_15B = Shape("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960)
GPU_PLAN = Plan(
    small=QWEN_05B,
    large=QWEN_15B,
    vocab=QWEN_VOCAB,
    precision="bf16",
    seq=2048,
    rows=16,
    micro={QWEN_05B.label: 8, QWEN_15B.label: 4},
    steps=8,
    warmup=2,
    short_steps=4,
    pairs=64,
    pair_batch=16,
    pair_micro=8,
    pair_words=120,
    opd_prompts=32,
    grpo_prompts=8,
    grpo_samples=8,
    online_tokens=128,
    rollout_prompts=64,
    rollout_n=4,
    rollout_tokens=128,
    rollout_dtype="bfloat16",
    # vllm: a vLLM engine's start (graph capture included) before the work
    timeout={"small": 100, "large": 130, "short": 80, "online": 150, "rollout": 60, "vllm": 240},
    needs={"small": 40, "large": 60, "short": 35, "online": 40, "rollout": 25, "vllm": 90},
)

TINY_A = Shape("tiny (dry run)", 64, 2, 2, 1, 128)
TINY_B = Shape("tiny, larger (dry run)", 128, 2, 2, 1, 256)
KINDS = ("small", "large", "short", "online", "rollout", "vllm")
DRY_PLAN = Plan(
    small=TINY_A,
    large=TINY_B,
    vocab=2048,
    precision="bf16",
    seq=128,
    rows=4,
    micro={TINY_A.label: 2, TINY_B.label: 2},
    steps=3,
    warmup=1,
    short_steps=2,
    pairs=8,
    pair_batch=4,
    pair_micro=2,
    pair_words=12,
    opd_prompts=4,
    grpo_prompts=2,
    grpo_samples=4,
    online_tokens=8,
    rollout_prompts=8,
    rollout_n=2,
    rollout_tokens=16,
    rollout_dtype="bfloat16",
    timeout=dict.fromkeys(KINDS, 400),
    needs=dict.fromkeys(KINDS, 5),
    run_only=("sft-0.5b-zero2",),
)


def checks_to_run(only: str) -> tuple[str, ...]:
    """The checks ``--only`` names, with those they need: ``setup`` always, and
    ``sft-0.5b-zero2`` for a check that starts from its model; CheckError for a name that
    is no check."""
    names = [n.strip() for n in only.split(",") if n.strip()]
    if unknown := [n for n in names if n not in CHECKS]:
        raise CheckError(
            f"--only: no check named {', '.join(repr(n) for n in unknown)}; the checks are "
            + ", ".join(CHECKS)
        )
    if not names:
        raise CheckError(f"--only names no check; the checks are {', '.join(CHECKS)}")
    wanted = {"setup", *names}
    if wanted & set(FROM_SMALL_MODEL):
        wanted.add("sft-0.5b-zero2")
    return tuple(n for n in CHECKS if n in wanted)


def source_hash() -> str:
    """sha256 of pt's package sources (pyproject.toml and src/), to tell stale wheels."""
    digest = hashlib.sha256()
    for package in PT_PACKAGES:
        root = REPO / "packages" / package
        for f in [root / "pyproject.toml", *sorted((root / "src").rglob("*"))]:
            if f.is_file() and "__pycache__" not in f.parts:
                digest.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return digest.hexdigest()


class Runner:
    """Runs the checks in order within the budget and keeps their results."""

    def __init__(self, plan: Plan, *, dry_run: bool, out: Path, work: Path, deadline: float):
        self.plan = plan
        self.dry_run = dry_run
        self.out = out
        self.work = work
        self.deadline = deadline
        self.results: list[dict] = []
        self.env_info: dict = {}
        self.models: list[str] = []  # inference checkpoints of the small shape, in order
        self.planned: dict[str, Path] = {}  # planned training checks: their config files
        self.log = open(out / "gpu_check.log", "w", encoding="utf-8")  # noqa: SIM115 (main closes it)
        self.last_stderr: list[str] = []  # the end of the last process's stderr
        self.env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }

    # ------------------------------------------------------------------ processes

    def run(self, name: str, args: list[str], timeout: float) -> tuple[int | None, str, float]:
        """``python <args>`` with its stderr kept for the log: (exit code, or None when it
        timed out; stdout; seconds). On timeout its whole process group is killed."""
        cmd = [sys.executable, *args]
        started = time.monotonic()
        with tempfile.TemporaryFile("w+", encoding="utf-8") as err:
            proc = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=self.env,
                cwd=self.work, start_new_session=True,
            )  # fmt: skip
            try:
                stdout, _ = proc.communicate(timeout=timeout)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, _ = proc.communicate()
                code = None
            err.seek(0)
            self.last_stderr = err.read().splitlines()[-LOG_TAIL_LINES:]
        seconds = time.monotonic() - started
        shown = " ".join(a if len(a) < 200 else a[:40] + "..." for a in cmd[1:])
        self.log.write(f"===== {name}: python {shown}\n")
        self.log.write("\n".join(self.last_stderr))
        self.log.write(f"\n===== {name}: exit {code} after {seconds:.1f} s\n")
        self.log.flush()
        return code, stdout, seconds

    def check(self, name: str, kind: str, body, *, plan: dict, config: Path | None = None) -> None:
        """``body(timeout)`` as check ``name`` when enough of the budget is left; when the
        plan does not run it, ``plan`` (what it would run) is recorded instead."""
        left = self.deadline - time.monotonic() - RESERVE_S
        if left < self.plan.needs[kind]:
            self.skip(name, f"the time budget is spent ({max(left, 0):.0f} s left)")
            return
        if self.plan.run_only is not None and name not in self.plan.run_only:
            self.record({"name": name, "status": "planned", **plan})
            if config is not None:
                self.planned[name] = config
            return
        print(f"-> {name}", file=sys.stderr, flush=True)
        result = body(min(self.plan.timeout[kind], left))
        self.record({"name": name, "status": "ok", **result})

    def record(self, result: dict) -> None:
        self.results.append(result)
        print(summary_line(result), flush=True)

    def skip(self, name: str, reason: str) -> None:
        self.record({"name": name, "status": "skipped", "reason": reason})

    def validate_planned(self) -> None:
        """The planned checks' configs through pt-train's config loader (one process): each
        gets its gradient accumulation, or fails with the loader's error."""
        if not self.planned:
            return
        paths = [str(path) for path in self.planned.values()]
        code, stdout, seconds = self.run("validate", ["-c", VALIDATE, *paths], 300)
        if code != 0:
            raise CheckError(
                f"the planned configs could not be validated: {last_error(self.last_stderr)}"
            )
        found = json.loads(stdout.strip().splitlines()[-1])
        by_name = {r["name"]: r for r in self.results}
        for name, path in self.planned.items():
            result, outcome = by_name[name], found[str(path)]
            if "error" in outcome:
                result.update(status="failed", reason=outcome["error"])
            else:
                result["grad_accum"] = outcome["grad_accum"]
        print(f"{len(self.planned)} planned configs validated in {seconds:.0f} s", file=sys.stderr)

    def failure(self, code: int | None, seconds: float, timeout: float) -> dict:
        reason = (
            f"timed out after {timeout:.0f} s"
            if code is None
            else f"exit code {code}: {last_error(self.last_stderr)}"
        )
        return {"status": "failed", "reason": reason, "wall_s": seconds}

    # ------------------------------------------------------------------ set-up

    def environment(self) -> None:
        """Versions, devices, and whether deepspeed and flash_attn import."""
        code, stdout, _ = self.run("environment", ["-c", PROBE], 120)
        if code != 0:
            raise CheckError(f"pt does not import: {last_error(self.last_stderr)}")
        self.env_info = json.loads(stdout.strip().splitlines()[-1])
        if not self.dry_run and self.env_info["devices"]["kind"] != "cuda":
            raise CheckError("no CUDA device is visible; on a CPU, run it with --dry-run")
        self.env_info["nvcc"] = shutil.which("nvcc")
        self.env_info["ninja"] = shutil.which("ninja")
        self.env_info["work_dir"] = str(self.work)

    @property
    def deepspeed_error(self) -> str | None:
        return self.env_info.get("deepspeed_import")

    def prepare(self) -> None:
        """The tokenizer, SFT rows of random ids, text pairs and prompts with answers."""
        p, rng = self.plan, random.Random(0)
        texts = self.work / "texts.jsonl"
        write_jsonl(texts, ({"text": " ".join(rng.choices(WORDS, k=40))} for _ in range(200)))
        tokenizer = ["-m", "pt_data.cli", "tokenizer", "--texts", str(texts), "--out", "tokenizer"]
        code, _, seconds = self.run("setup", tokenizer, 120)
        if code != 0:
            raise CheckError(f"pt-data tokenizer failed: {last_error(self.last_stderr)}")
        # Every token is trained, and the ids cover the whole padded vocabulary.
        rows = ([rng.randrange(p.vocab) for _ in range(p.seq)] for _ in range(4 * p.rows))
        write_jsonl(self.work / "sft.jsonl", ({"input_ids": r, "labels": r} for r in rows))

        def words(n: int) -> str:
            return " ".join(rng.choices(WORDS, k=n))

        pairs = (
            {"prompt": words(p.pair_words // 2), "chosen": words(p.pair_words),
             "rejected": words(p.pair_words)}
            for _ in range(p.pairs)
        )  # fmt: skip
        write_jsonl(self.work / "pairs.jsonl", pairs)
        count = max(p.opd_prompts, p.grpo_prompts, p.rollout_prompts)
        prompts = (
            {"id": f"p{i}", "prompt": f"What is {i} plus {2 * i}? {words(8)}", "answer": str(3 * i)}
            for i in range(count)
        )
        write_jsonl(self.work / "prompts.jsonl", prompts)
        self.record({"name": "setup", "status": "ok", "wall_s": seconds})

    # ------------------------------------------------------------------ training

    def write_config(self, name: str, config: dict) -> Path:
        import yaml

        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def config(self, name: str, objective: dict, training: dict, **sections) -> dict:
        return {
            "run_name": name,
            "output_dir": str(self.work / "runs"),
            **sections,
            "objective": objective,
            "training": {
                "learning_rate": 1e-5,
                "lr_schedule": "constant",
                # Without DeepSpeed, pt-train trains fp32 only (its plain engine).
                "precision": "fp32" if self.deepspeed_error else self.plan.precision,
                "logging_steps": 1,
                "seed": 0,
                **training,
            },
        }

    def train(self, name: str, config: Path, timeout: float, *, keep_model: bool) -> dict:
        """``pt-train run``: its metrics summarised; its checkpoints then removed (the
        inference checkpoint is kept when later checks start from it)."""
        code, stdout, seconds = self.run(name, ["-m", "pt_train.cli", "run", str(config)], timeout)
        run_dir = self.work / "runs" / name
        try:
            if code != 0:
                return self.failure(code, seconds, timeout)
            if keep_model:
                self.models.append(json.loads(stdout.strip().splitlines()[-1])["path"])
            return {"wall_s": seconds, **summarise(run_dir, self.plan.warmup)}
        finally:
            shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            if not keep_model:
                shutil.rmtree(run_dir / "inference", ignore_errors=True)

    def sft(
        self, name: str, shape: Shape, *, zero: int | None, objective: str = "sft",
        steps: int | None = None, seed: int = 0, attention: str = "sdpa",
    ) -> None:  # fmt: skip
        """SFT (or DFT) of ``shape`` with DeepSpeed stage ``zero``; None: the plain engine,
        which takes fp32 only."""
        if zero is not None and self.deepspeed_error:
            self.skip(name, f"deepspeed does not import: {self.deepspeed_error}")
            return
        p = self.plan
        precision = "fp32" if zero is None else p.precision
        config = self.config(
            name,
            {"name": objective},
            {
                "precision": precision,
                "global_batch_size": p.rows,
                "micro_batch_size": p.micro[shape.label],
                "max_steps": steps or p.steps,
                "seed": seed,
            },
            model={
                "init": shape.init(str(self.work / "tokenizer"), p.vocab, max_len=2 * p.seq),
                "attn_implementation": attention,
            },
            data={"path": str(self.work / "sft.jsonl")},
            deepspeed=(
                {"engine": "auto"} if zero is None else {"zero_stage": zero, "engine": "deepspeed"}
            ),
        )
        path = self.write_config(name, config)
        keep = shape is p.small and objective == "sft" and len(self.models) < 2
        figures = {
            "shape": dataclasses.asdict(shape),
            "vocab": p.vocab,
            "parameters": shape.parameters(p.vocab),
            "seq": p.seq,
            "tokens_per_step": p.rows * p.seq,
            "precision": precision,
            "attention": attention,
            "engine": "plain" if zero is None else f"DeepSpeed ZeRO-{zero}",
        }

        def body(timeout: float) -> dict:
            result = self.train(name, path, timeout, keep_model=keep) | figures
            if result.get("tokens_per_s"):
                result["mfu"] = 6 * result["parameters"] * result["tokens_per_s"] / PEAK_FLOPS
            return result

        kind = "large" if shape is p.large else "small"
        self.check(name, kind, body, plan={**figures, "config": config}, config=path)

    def from_small_model(self, name: str, kind: str, config: dict) -> None:
        """A training check that starts from the first small model an SFT check wrote (an
        OPD teacher: the second one, or the same one when there is only one)."""
        if not self.models:
            self.skip(name, "no 0.5B model was trained before it")
            return
        config = {"model": {"name_or_path": self.models[0]}, **config}
        teacher = config["objective"].get("teacher")
        if teacher is not None:
            teacher["path"] = self.models[-1]
        path = self.write_config(name, config)

        def body(timeout: float) -> dict:
            return {"start": self.models[0], **self.train(name, path, timeout, keep_model=False)}

        self.check(name, kind, body, plan={"start": self.models[0], "config": config}, config=path)

    def dpo(self) -> None:
        p = self.plan
        config = self.config(
            "dpo-0.5b",
            {"name": "dpo", "beta": 0.1},
            {"global_batch_size": p.pair_batch, "micro_batch_size": p.pair_micro,
             "max_steps": p.short_steps},
            data={"path": str(self.work / "pairs.jsonl"), "max_seq_length": p.seq},
        )  # fmt: skip
        self.from_small_model("dpo-0.5b", "short", config)

    def online(
        self, name: str, objective: dict, prompts: int, samples: int, rounds: int = 1,
        kind: str = "online", **rollout,
    ) -> None:  # fmt: skip
        """``rounds`` rounds of the online loop: ``prompts`` x ``samples`` rows, one update
        each; ``rollout``: more of the rollout section."""
        rows = prompts * samples
        config = self.config(
            name,
            objective,
            {"global_batch_size": rows, "micro_batch_size": rows // 2, "max_steps": rounds},
            rollout={
                "prompts": str(self.work / "prompts.jsonl"),
                "samples_per_prompt": samples,
                "max_tokens": self.plan.online_tokens,
                "temperature": 1.0,
                **rollout,
            },
        )
        self.from_small_model(name, kind, config)

    # ------------------------------------------------------------------ rollouts

    def rollout(self, seeding: str, engine: str = "hf") -> None:
        p = self.plan
        name = f"rollout-{seeding}" if engine == "hf" else f"{engine}-rollout-{seeding}"
        if not self.models:
            self.skip(name, "no 0.5B model was trained before it")
            return
        model, out = self.models[0], self.work / f"{name}.jsonl"
        args = [
            "-m", "pt_rollout.cli", "generate", "--model", model,
            "--prompts", str(self.work / "prompts.jsonl"), "--limit", str(p.rollout_prompts),
            "--engine", engine, "--n", str(p.rollout_n), "--temperature", "1.0",
            "--max-tokens", str(p.rollout_tokens), "--seed", "0", "--seeding", seeding,
            "--dtype", p.rollout_dtype, "--out", str(out),
        ]  # fmt: skip

        def body(timeout: float) -> dict:
            code, stdout, seconds = self.run(name, args, timeout)
            out.unlink(missing_ok=True)
            if code != 0:
                return self.failure(code, seconds, timeout)
            manifest = json.loads(stdout.strip().splitlines()[-1])
            return {
                "wall_s": seconds,
                "model": model,
                "prompts": p.rollout_prompts,
                "n": p.rollout_n,
                "max_tokens": p.rollout_tokens,
                "dtype": p.rollout_dtype,
                **{k: manifest.get(k) for k in ("rows", "completion_tokens", "seconds")},
                "tokens_per_s": manifest.get("tokens_per_s"),
            }

        kind = "rollout" if engine == "hf" else "vllm"
        self.check(name, kind, body, plan={"command": ["python", *args]})

    def weight_push(self) -> None:
        """bench/weight_push.py on this GPU: files against CUDA IPC to a vLLM generator
        process on it, for Qwen2.5-0.5B's and 1.5B's shapes (random weights, bfloat16)."""
        name = "vllm-weight-push"
        shapes = "qwen2-0.5b,qwen2-1.5b" if self.plan.small is QWEN_05B else "tiny"
        args = [str(REPO / "bench" / "weight_push.py"), "--shapes", shapes, "--way", "ipc",
                "--pushes", "3", "--workdir", str(self.work / "weight-push")]  # fmt: skip

        def body(timeout: float) -> dict:
            code, stdout, seconds = self.run(name, args, timeout)
            if code != 0:
                return self.failure(code, seconds, timeout)
            return {"wall_s": seconds, **json.loads(stdout.strip().splitlines()[-1])}

        self.check(name, "vllm", body, plan={"command": ["python", *args]})

    # ------------------------------------------------------------------ the sequence

    def all(self) -> None:
        p = self.plan
        self.environment()
        self.prepare()
        self.sft("sft-0.5b-zero2", p.small, zero=2)
        # Another seed: its model is OPD's teacher.
        self.sft("sft-0.5b-zero0", p.small, zero=0, seed=1)
        self.sft("sft-1.5b-zero2", p.large, zero=2)
        self.sft("sft-1.5b-zero0", p.large, zero=0)
        if self.deepspeed_error:  # then the plain engine makes the model the rest start from
            self.sft("sft-0.5b-plain-fp32", p.small, zero=None, steps=p.short_steps)
        self.sft("dft-0.5b", p.small, zero=0, objective="dft", steps=p.short_steps)
        self.dpo()
        self.online(
            "opd-0.5b",
            {"name": "opd", "loss": "forward_kl", "support": "teacher_topk",
             "teacher": {"path": None, "top_k": 8}},
            p.opd_prompts, 1,
        )  # fmt: skip
        self.online("grpo-0.5b", {"name": "grpo"}, p.grpo_prompts, p.grpo_samples, rounds=2)
        self.online(
            "grpo-0.5b-server", {"name": "grpo"}, p.grpo_prompts, p.grpo_samples, rounds=2,
            generator="server",
        )  # fmt: skip
        self.rollout("per-sample")
        self.rollout("engine")
        if not self.deepspeed_error:
            self.sft("sft-0.5b-plain-fp32", p.small, zero=None, steps=p.short_steps)
        if self.env_info.get("flash_attn"):
            self.sft("sft-0.5b-flash-attn", p.small, zero=0, attention="flash_attention_2")
        else:
            self.skip("sft-0.5b-flash-attn", FLASH_REASON)
        self.vllm()
        self.validate_planned()

    def vllm(self) -> None:
        """pt's vLLM paths from the 0.5B SFT model, where vllm imports: GRPO's two rounds
        with the colocated engine (asleep while the trainer steps) and with a generator
        process on the same GPU, its weights pushed as files and over CUDA IPC (and over
        NCCL to a second GPU, where there is one); then pt-rollout's vLLM engine with
        per-sample and engine seeding."""
        reason = None
        if not self.env_info.get("vllm"):
            reason = VLLM_REASON
        elif self.env_info["devices"]["kind"] != "cuda":
            reason = "no GPU: these checks run vLLM's GPU paths (sleep mode, CUDA IPC, NCCL)"
        if reason is not None:
            for name in VLLM_CHECKS:
                self.skip(name, reason)
            return
        p = self.plan
        grpo = ({"name": "grpo"}, p.grpo_prompts, p.grpo_samples)
        # the trainer and vLLM on one GPU: vLLM takes a share, not its default 0.9
        common = {"kind": "vllm", "engine": "vllm", "gpu_memory_utilization": 0.3}
        self.online(
            "vllm-grpo-0.5b-colocate", *grpo, rounds=2, generator="colocate", sleep_level=2,
            **common,
        )  # fmt: skip
        self.online("vllm-grpo-0.5b-server-files", *grpo, rounds=2, generator="server", **common)
        self.online(
            "vllm-grpo-0.5b-server-ipc", *grpo, rounds=2, generator="server",
            weight_transfer="ipc", **common,
        )  # fmt: skip
        if self.env_info["devices"]["count"] >= 2:
            self.online(
                "vllm-grpo-0.5b-server-nccl", *grpo, rounds=2, generator="server",
                weight_transfer="nccl", server_devices=[1], kind="vllm", engine="vllm",
            )  # fmt: skip
        else:
            self.skip("vllm-grpo-0.5b-server-nccl", NCCL_REASON)
        self.weight_push()
        self.rollout("per-sample", engine="vllm")
        self.rollout("engine", engine="vllm")


def summarise(run_dir: Path, warmup: int) -> dict:
    """From a run's metrics.jsonl: tokens/s and step time (medians after ``warmup`` steps),
    peak memory, the first and last loss, and the online loop's timings."""
    from pt_train.metrics import read_metrics

    records = read_metrics(run_dir)
    timed = records[warmup:] or records
    out = {
        "steps": len(records),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
        "step_time_s": statistics.median(r["step_time_s"] for r in timed),
        "peak_memory_gb": max(r["peak_memory_gb"] for r in records),
        "loss_first": records[0]["loss"],
        "loss_last": records[-1]["loss"],
    }
    for key in (
        "generate_s", "score_s", "completion_tokens_mean", "weight_push_s", "weight_load_s",
        "sleep_s",
    ):  # fmt: skip
        if key in records[-1]:
            out[key] = records[-1][key]
    if "generate_s" in records[-1]:
        out["generate_s_rounds"] = [r["generate_s"] for r in records if "generate_s" in r]
    return out


def summary_line(r: dict) -> str:
    """One line per check: its name, status, and its figures or the reason."""
    head = f"{r['name']:<{NAME_WIDTH}}{r['status']:<9}"
    if r["status"] == "planned":
        return head + ("config written" if "config" in r else " ".join(r["command"][1:4]))
    if r["status"] != "ok":
        return head + r.get("reason", "")
    parts = []
    if "engine" in r:
        parts.append(f"{r['precision']} {r['attention']} {r['engine']}")
    if r.get("tokens_per_s") is not None:
        parts.append(f"{r['tokens_per_s']:,.0f} tokens/s")
    if "mfu" in r:
        parts.append(f"MFU {100 * r['mfu']:.1f}%")
    if "peak_memory_gb" in r:
        parts.append(f"peak {r['peak_memory_gb']:.1f} GB")
    if "generate_s" in r:
        parts.append(f"generation {r['generate_s']:.1f} s")
    if r.get("weight_load_s"):
        parts.append(f"push {r['weight_push_s']:.2f} s + load {r['weight_load_s']:.2f} s")
    if "steps" in r:
        parts.append(f"{r['steps']} steps")
    if "wall_s" in r:
        parts.append(f"{r['wall_s']:.0f} s in all")
    return head + ", ".join(parts)


def last_error(stderr: list[str]) -> str:
    """The last line of a process's stderr that names an error (else its last line)."""
    lines = [x.strip() for x in stderr if x.strip()]
    for line in reversed(lines):
        if "Error" in line or "error" in line:
            return line[:300]
    return lines[-1][:300] if lines else ""


def write_jsonl(path: Path, rows) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def work_dir(dry_run: bool) -> Path:
    """Runs go to /dev/shm on a GPU machine that has room there (the full checkpoint a
    1.5B run writes at its end is about 22 GB), else to the temporary directory."""
    shm = Path("/dev/shm")
    if not dry_run and shm.is_dir() and shutil.disk_usage(shm).free > 48 * 2**30:
        return Path(tempfile.mkdtemp(prefix="pt-gpu-check-", dir=shm))
    return Path(tempfile.mkdtemp(prefix="pt-gpu-check-"))


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line on stderr and exit 2, without the usage block."""

    def error(self, message: str):
        print(f"gpu_check: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def main() -> None:
    parser = _Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="on a CPU, with tiny shapes")
    parser.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-check-out"),
        help="where gpu_check.json and gpu_check.log go (default: $OUT, else gpu-check-out)",
    )  # fmt: skip
    parser.add_argument(
        "--budget-s", type=_seconds, default=None,
        help="seconds for everything since PT_GPU_CHECK_STARTED (default 480; dry run 1800)",
    )  # fmt: skip
    parser.add_argument(
        "--only", metavar="NAME,NAME", default=None,
        help="run these checks (and those they need) and plan the rest",
    )  # fmt: skip
    parser.add_argument("--source-hash", action="store_true", help="print pt's source hash")
    args = parser.parse_args()
    if args.source_hash:
        print(source_hash())
        return
    plan = DRY_PLAN if args.dry_run else GPU_PLAN
    if args.only is not None:
        try:
            plan = dataclasses.replace(plan, run_only=checks_to_run(args.only))
        except CheckError as exc:
            print(f"gpu_check: {exc}", file=sys.stderr)
            sys.exit(2)
    started = float(os.environ.get("PT_GPU_CHECK_STARTED") or time.time())
    budget = args.budget_s or (1800.0 if args.dry_run else BUDGET_S)
    deadline = time.monotonic() + budget - (time.time() - started)
    args.out.mkdir(parents=True, exist_ok=True)
    work = work_dir(args.dry_run)
    runner = Runner(plan, dry_run=args.dry_run, out=args.out, work=work, deadline=deadline)
    try:
        runner.all()
    except CheckError as exc:
        runner.record({"name": "setup", "status": "failed", "reason": str(exc)})
    finally:
        shutil.rmtree(work, ignore_errors=True)
        runner.log.close()
    failed = write_results(args.out, runner, mode="dry-run" if args.dry_run else "gpu",
                           budget=budget, started=started)  # fmt: skip
    sys.exit(1 if failed else 0)


def write_results(out: Path, runner: Runner, *, mode: str, budget: float, started: float) -> list:
    """``out/gpu_check.json`` (written whole, then renamed); returns the failed checks."""
    result = {
        "mode": mode,
        "wall_s": round(time.time() - started, 1),
        "budget_s": budget,
        "environment": runner.env_info,
        "peak_flops": PEAK_FLOPS,
        "mfu": MFU_CONVENTION,
        "tokens_per_s": f"median of pt-train's tokens_per_s after the first {runner.plan.warmup} steps",
        "peak_memory_gb": "largest peak_memory_gb of the run: CUDA max allocated on a GPU, "
        "the process's peak RSS on a CPU",
        "checks": runner.results,
    }
    tmp = out / "gpu_check.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / "gpu_check.json")
    failed = [r["name"] for r in runner.results if r["status"] == "failed"]
    print(
        f"{len(runner.results)} checks, {len(failed)} failed, {result['wall_s']:.0f} s in all; "
        f"{out / 'gpu_check.json'}",
        file=sys.stderr,
    )
    return failed


if __name__ == "__main__":
    main()
