"""Data parallelism for generation: one engine per GPU (or per group of ``tensor_parallel``
GPUs), each in its own process, on its own shard of the prompts.

Each worker is the same ``pt-rollout generate`` command on a shard file, with
``CUDA_VISIBLE_DEVICES`` set to its GPUs, writing its own resumable shard output beside
``--out``; the parent shows their combined progress and merges the shards when all have
finished. A failed worker leaves its shard output in place, so rerunning resumes it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pt_core.errors import ConfigError, PtError
from pt_core.files import iter_rows, write_rows
from pt_core.log import get_logger
from pt_rollout.output import ResumableOutput, row_key

log = get_logger(__name__)


def visible_entries(visible: str | None) -> list[str] | None:
    """The devices a ``CUDA_VISIBLE_DEVICES`` value names, in order (indices or UUIDs), or
    None where it is unset or empty: the names a child process is given its GPUs by."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    return entries or None


def gpu_groups(data_parallel: int, tensor_parallel: int) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` for each worker, or None for each when there is no GPU."""
    import torch

    count = torch.cuda.device_count()
    if count == 0:
        log.warning("no GPU: running %d engines on the CPU", data_parallel)
        return [None] * data_parallel
    entries = visible_entries(os.environ.get("CUDA_VISIBLE_DEVICES"))
    devices = (entries or [str(i) for i in range(count)])[:count]
    need = data_parallel * tensor_parallel
    if need > len(devices):
        raise ConfigError(
            f"--data-parallel {data_parallel} x --tensor-parallel {tensor_parallel} needs "
            f"{need} GPUs; {len(devices)} are visible",
            hint="lower --data-parallel or --tensor-parallel",
        )
    return [
        ",".join(devices[rank * tensor_parallel : (rank + 1) * tensor_parallel])
        for rank in range(data_parallel)
    ]


def worker_args(options) -> list[str]:
    """The ``pt-rollout generate`` flags that reproduce ``options`` in a worker."""
    args = [
        "--n", options.n,
        "--temperature", options.temperature,
        "--top-p", options.top_p,
        "--top-k", options.top_k,
        "--seeding", options.seeding,
        "--decoder", options.decoder,
        "--max-tokens", options.max_tokens,
        "--seed", options.seed,
        "--engine", options.engine,
        "--batch-size", options.batch_size,
        "--dtype", options.dtype,
        "--tensor-parallel", options.tensor_parallel,
        "--prompt-key", "prompt",
        "--id-key", "id",
    ]  # fmt: skip
    for stop in options.stop:
        args += ["--stop", stop]
    if options.logprobs:
        args.append("--logprobs")
    if not options.template:
        args.append("--no-template")
    if options.chat_template is not None:
        args += ["--chat-template", options.chat_template]
    if options.system is not None:
        args += ["--system", options.system]
    if options.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", options.gpu_memory_utilization]
    if options.max_model_len is not None:
        args += ["--max-model-len", options.max_model_len]
    for flag, value in (("--env", options.env), ("--max-turns", options.max_turns),
                        ("--max-episode-tokens", options.max_episode_tokens)):  # fmt: skip
        if value is not None:
            args += [flag, value]
    return [str(a) for a in args]


def generate_data_parallel(model: str, pending, output: ResumableOutput, options, meter) -> None:
    """Generate the ``pending`` (prompt row, sample) pairs with ``options.data_parallel``
    worker processes and append their rows to ``output``."""
    dp = options.data_parallel
    groups = gpu_groups(dp, options.tensor_parallel)
    work = output.path.parent / f".{output.path.name}.dp{dp}"
    work.mkdir(parents=True, exist_ok=True)
    prompts = {}
    for row, _ in pending:
        prompts.setdefault(row.position, row)
    shards = [[] for _ in range(dp)]
    for index, row in enumerate(prompts.values()):
        shards[index % dp].append(row)

    procs = []
    for rank, shard in enumerate(shards):
        if not shard:
            continue
        shard_prompts = work / f"prompts-{rank}.jsonl"
        shard_out = work / f"rollouts-{rank}.jsonl"
        write_rows(shard_prompts, [{**r.columns, "id": r.id, "prompt": r.prompt} for r in shard])
        _seed_done_rows(shard_out, shard, output)
        env = dict(os.environ)
        group = groups[rank]
        if group is not None:
            env["CUDA_VISIBLE_DEVICES"] = group
        cmd = [
            sys.executable, "-m", "pt_rollout.cli", "--quiet", "generate",
            "--model", model, "--prompts", str(shard_prompts), "--out", str(shard_out),
            *worker_args(options),
        ]  # fmt: skip
        log_path = work / f"worker-{rank}.log"
        with open(log_path, "w") as log_file:
            proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=log_file, text=True
            )
        procs.append((rank, proc, shard_out, log_path))
        log.info("worker %d: %d prompts, GPUs %s", rank, len(shard), groups[rank] or "none")

    watchers = {rank: _PartialWatcher(shard_out) for rank, _, shard_out, _ in procs}
    try:
        while any(proc.poll() is None for _, proc, _, _ in procs):
            time.sleep(1.0)
            rows = sum(w.poll()[0] for w in watchers.values())
            tokens = sum(w.tokens for w in watchers.values())
            meter.set_done(rows, tokens)
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): stop the workers too; their rows stay for a rerun.
        for _, proc, _, _ in procs:
            if proc.poll() is None:
                proc.terminate()
        for _, proc, _, _ in procs:
            proc.wait()
        raise

    failed = [
        (rank, proc.returncode, log_path) for rank, proc, _, log_path in procs if proc.returncode
    ]
    if failed:
        rank, code, log_path = failed[0]
        tail = "\n".join(Path(log_path).read_text(errors="replace").splitlines()[-15:])
        raise PtError(
            f"data-parallel worker {rank} exited with {code}; its log is {log_path}:\n{tail}",
            hint="fix the cause and rerun the same command: finished rows are kept",
        )
    rows, tokens = 0, 0
    for _, proc, shard_out, _ in procs:
        manifest = json.loads(proc.stdout.read().strip().splitlines()[-1])
        tokens += int(manifest.get("completion_tokens", 0))
        new = [r for r in iter_rows(shard_out) if row_key(r["id"], r["sample"]) not in output.done]
        output.write(new)
        rows += len(new)
    meter.set_done(rows, tokens)
    shutil.rmtree(work)


def _seed_done_rows(shard_out: Path, shard, output: ResumableOutput) -> None:
    """Give a fresh shard output the rows ``output`` already has for its prompts, so the
    worker does not generate them again."""
    partial = shard_out.with_name(shard_out.name + ".partial")
    if shard_out.exists() or partial.exists():
        return
    ids = {row_key(r.id, 0)[0] for r in shard}
    done = [r for r in output.rows() if row_key(r["id"], 0)[0] in ids]
    if done:
        with open(partial, "w", encoding="utf-8") as fh:
            for r in done:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")


class _PartialWatcher:
    """Counts the rows and completion tokens a worker has appended to its partial file."""

    def __init__(self, shard_out: Path):
        self.partial = shard_out.with_name(shard_out.name + ".partial")
        # Rows seeded from an earlier run are already counted as done.
        self.offset = self.partial.stat().st_size if self.partial.exists() else 0
        self.rows = 0
        self.tokens = 0
        self._rest = b""

    def poll(self) -> tuple[int, int]:
        if self.partial.exists():
            with open(self.partial, "rb") as fh:
                fh.seek(self.offset)
                data = self._rest + fh.read()
                self.offset = fh.tell()
            *lines, self._rest = data.split(b"\n")
            for line in lines:
                if line.strip():
                    self.rows += 1
                    self.tokens += len(json.loads(line).get("completion_token_ids", ()))
        return self.rows, self.tokens
