"""Full checkpoints (for resume) and inference checkpoints (for HF and vLLM).

Full checkpoint layout::

    checkpoints/step-N/ds/...            DeepSpeed: model, optimizer (ZeRO partitions)
    checkpoints/step-N/plain/state.pt    or, without DeepSpeed (pt_train.engine): both
    checkpoints/step-N/rng-rank{r}.pt    python/numpy/torch RNG states of each rank
    checkpoints/step-N/trainer_state.json   step, counters, config hash
    checkpoints/latest                   "step-N", written last

A LoRA run's full checkpoint holds the adapters, not the frozen base (pt_train.engine);
its inference checkpoint holds the merged weights, and the adapter in ``adapter/``
(pt_train.lora).

Everything is written under ``checkpoints/.tmp-step-N`` and renamed into place
once every rank has finished; ``latest`` is replaced atomically only after
that. A crash or ``kill -9`` mid-save leaves a ``.tmp-*`` directory that the
next run deletes, and ``latest`` still names the previous complete checkpoint.

With ``training.async_save`` (:class:`BackgroundSaver`) the training thread only copies
the state into CPU memory of its own (:func:`cpu_snapshot`); a thread on every rank
writes the files, fsyncs them and leaves a ``.written-rank{r}`` marker in the temporary
directory, and rank 0's thread, once every rank's marker is there, renames the
directory and moves ``latest`` as above. The next save, a stop and the end of training
wait for the write before going on, so there is at most one write in flight, and a
run that returns (or exits 85) has its last checkpoint complete.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pt_core.errors import DiskFull, disk_full_as_error, is_disk_full
from pt_core.files import atomic_path, atomic_write_json, atomic_write_text
from pt_core.log import get_logger
from pt_train.distributed import DistEnv, barrier
from pt_train.engine import PlainEngine, load_engine, save_engine
from pt_train.lora import (
    hf_model,
    is_four_bit,
    is_lora,
    lora_layers,
    merged_full_precision,
    merged_state_dict,
    save_adapter,
)
from pt_train.watchdog import TestStall

log = get_logger(__name__)

LATEST = "latest"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint ``latest`` names, or None for a fresh run."""
    pointer = checkpoint_dir(run_dir) / LATEST
    if not pointer.exists():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text().strip()
    assert (path / "trainer_state.json").exists(), f"latest points at incomplete {path}"
    return path


def remove_stale_temporaries(run_dir: Path) -> None:
    """Delete what an interrupted save left behind (rank 0 only)."""
    root = checkpoint_dir(run_dir)
    if root.exists():
        for tmp in root.glob(".tmp-*"):
            log.warning("removing %s, left by an interrupted checkpoint save", tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_full(
    engine,
    run_dir: Path,
    step: int,
    trainer_state: dict,
    env: DistEnv,
    keep: int,
    background: BackgroundSaver | None = None,
) -> Path:
    """Save the whole training state at ``step`` (all ranks call this).

    With ``background``, the files are written by its thread and the checkpoint becomes
    ``latest`` once every rank's thread is done (see :class:`BackgroundSaver`); the call
    returns after the state is copied, having first waited for the save before it.
    """
    root = checkpoint_dir(run_dir)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    if background is not None:
        background.wait()  # one write in flight at most
    start = time.perf_counter()
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    write = background.queue if background is not None else _write_now
    try:
        with _deepspeed_writes_through(engine, background):
            save_engine(engine, tmp, write)
        write(rng_state(), tmp / f"rng-rank{env.rank}.pt")
        if env.is_main:
            write(
                json.dumps({**trainer_state, "step": step}), tmp / "trainer_state.json", _write_text
            )
        if background is not None:
            background.start(step, tmp, final, keep, copy_s=time.perf_counter() - start)
            return final
        barrier()
        if env.is_main:
            _commit(tmp, final, keep)
    except Exception as exc:
        if not is_disk_full(exc, root):
            raise
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise checkpoint_disk_full(tmp, final) from exc
    barrier()
    return final


def checkpoint_disk_full(tmp: Path, final: Path) -> DiskFull:
    """The error of a checkpoint save that ran out of space, its ``tmp`` directory removed:
    where the run resumes (``latest`` was not moved)."""
    latest = latest_checkpoint(final.parent.parent)
    resume = (
        f"the same command resumes from {latest.name}, the last complete checkpoint"
        if latest is not None
        else "no complete checkpoint yet: the same command starts the run afresh"
    )
    return DiskFull(final.parent, kept=f"{final.name} not saved ({tmp.name} removed); {resume}")


def _commit(tmp: Path, final: Path, keep: int) -> None:
    """Rename a complete ``.tmp-step-N`` into place, then point ``latest`` at it (rank 0)."""
    root = final.parent
    _fsync_tree(tmp)
    if final.exists():  # re-saving a step (resumed run that stopped at the same step)
        shutil.rmtree(final)
    os.replace(tmp, final)
    atomic_write_text(root / LATEST, final.name + "\n")
    _prune(root, keep, protect=final)


def _write_now(obj, path: Path, save: Callable = torch.save) -> None:
    save(obj, path)


def _write_text(text: str, path: Path) -> None:
    Path(path).write_text(text)


def _fsync_tree(path: Path) -> None:
    for f in path.rglob("*"):
        if f.is_file():
            _fsync(f)


def _fsync(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _prune(root: Path, keep: int, protect: Path) -> None:
    steps = sorted(
        (p for p in root.glob("step-*") if p.is_dir() and p.name.split("-")[1].isdigit()),
        key=lambda p: int(p.name.split("-")[1]),
    )
    for old in steps[:-keep]:
        if old != protect:
            shutil.rmtree(old, ignore_errors=True)


class CheckpointWriteError(RuntimeError):
    """A checkpoint's files could not be written (a full disk, a lost file system)."""


WRITER_NICENESS = 10


class BackgroundSaver:
    """Writes the files of full checkpoints in a thread of this rank (``training.async_save``).

    :func:`save_full` hands it each file (:meth:`queue`: the object is copied into CPU
    memory there and then, on the training thread) and :meth:`start`s the write. The
    thread writes and fsyncs the files, then leaves ``.written-rank{r}`` in the
    temporary directory; rank 0's thread waits until every rank's marker is there (no
    collective: the training thread owns those), removes them and commits the checkpoint
    (rename, ``latest``, pruning) as a synchronous save does. A rank that fails leaves
    ``.failed-rank{r}`` instead, and each rank raises :class:`CheckpointWriteError` at its
    next :meth:`wait`. A kill during the write leaves ``.tmp-step-N`` and ``latest`` as
    they were.
    """

    def __init__(self, env: DistEnv, run_dir: Path):
        self.env = env
        self.stall = TestStall.from_env(env.rank, run_dir)
        self._files: list[tuple[Callable, object, Path]] = []
        self._thread: threading.Thread | None = None
        self._step: int | None = None
        self._error: BaseException | None = None

    def queue(self, obj, path: Path, save: Callable = torch.save) -> None:
        """Copy ``obj`` now; write it to ``path`` with ``save(obj, path)`` at :meth:`start`."""
        self._files.append((save, cpu_snapshot(obj), Path(path)))

    def start(self, step: int, tmp: Path, final: Path, keep: int, copy_s: float) -> None:
        assert self._thread is None, "a checkpoint write is already in flight"
        files, self._files = self._files, []
        self._step = step
        self._thread = threading.Thread(
            target=self._write,
            args=(files, step, tmp, final, keep, copy_s),
            name=f"pt-checkpoint-step-{step}",
            daemon=True,
        )
        self._thread.start()

    @property
    def writing(self) -> bool:
        """True while a write is in flight on this rank."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Return once the write in flight, if any, is done here (on rank 0: committed)."""
        if self._thread is None:
            return
        if self._thread.is_alive():
            start = time.perf_counter()
            self._thread.join()
            log.info(  # rank 0's wait (the pt loggers speak on rank 0)
                "waited %.2f s for checkpoint step-%d to be written",
                time.perf_counter() - start,
                self._step,
            )
        self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def finish(self) -> None:
        """Wait until the last checkpoint is written and committed on every rank (all ranks
        call this, at a stop and at the end of training, so that they leave together)."""
        self.wait()
        barrier()

    def _write(self, files, step: int, tmp: Path, final: Path, keep: int, copy_s: float):
        rank = self.env.rank
        start = time.perf_counter()
        # Where the cores are busy, the training thread goes first; the write only has to
        # be done by the next save. (Linux applies a thread id's niceness to that thread.)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)
        try:
            self.stall("write", step)  # test hooks: a write held up before it starts,
            written = 0
            while files:
                save, obj, path = files.pop(0)
                save(obj, path)
                del obj  # the copy is freed as soon as it is on disk
                _fsync(path)
                written += 1
                if written == 1:
                    self.stall("half_written", step)  # or after its first file
            (tmp / f".written-rank{rank}").touch()
        except BaseException as exc:
            if is_disk_full(exc, tmp):
                self._error = checkpoint_disk_full(tmp, final)
            else:
                self._error = CheckpointWriteError(
                    f"rank {rank} could not write its part of checkpoint {final.name} in "
                    f"{tmp}: {exc!r}"
                )
            with contextlib.suppress(OSError):
                (tmp / f".failed-rank{rank}").write_text(repr(exc))
            if self.env.is_main and isinstance(self._error, DiskFull):
                shutil.rmtree(tmp, ignore_errors=True)
            return
        if not self.env.is_main:
            return
        try:
            self._wait_for_ranks(tmp, final)
            for r in range(self.env.world_size):
                (tmp / f".written-rank{r}").unlink()
            _commit(tmp, final, keep)
        except BaseException as exc:
            self._error = (
                exc
                if isinstance(exc, CheckpointWriteError)
                else CheckpointWriteError(
                    f"checkpoint {final.name} could not be committed from {tmp}: {exc!r}"
                )
            )
            return
        log.info(
            "checkpoint %s written in the background: %.3f s on the training path, %.3f s writing",
            final.name,
            copy_s,
            time.perf_counter() - start,
        )

    def _wait_for_ranks(self, tmp: Path, final: Path) -> None:
        pause = 0.01
        while True:
            for r in range(self.env.world_size):
                failed = tmp / f".failed-rank{r}"
                if failed.exists():
                    raise CheckpointWriteError(
                        f"rank {r} could not write its part of checkpoint {final.name}: "
                        + failed.read_text()
                    )
            if all((tmp / f".written-rank{r}").exists() for r in range(self.env.world_size)):
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.5)


def background_saver(engine, env: DistEnv, run_dir: Path) -> BackgroundSaver | None:
    """A :class:`BackgroundSaver` for ``engine``, or None (with the reason logged) where its
    checkpoints cannot be written in the background."""
    if not isinstance(engine, PlainEngine):
        name = type(engine.checkpoint_engine).__name__
        if name != "TorchCheckpointEngine":
            log.warning(
                "training.async_save: DeepSpeed's checkpoint engine is %s, which writes "
                "in its own way; checkpoints are saved synchronously",
                name,
            )
            return None
    return BackgroundSaver(env, run_dir)


class _RoutedCheckpointEngine:
    """DeepSpeed's checkpoint engine with its file writes handed to a background saver;
    DeepSpeed still decides what each file holds, and everything else goes to the engine
    itself."""

    def __init__(self, inner, background: BackgroundSaver):
        self._inner = inner
        self._background = background

    def save(self, state_dict, path: str) -> None:
        self._background.queue(state_dict, Path(path), self._inner.save)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


@contextlib.contextmanager
def _deepspeed_writes_through(engine, background: BackgroundSaver | None):
    """While saving, hand a DeepSpeed engine's file writes to ``background``."""
    if background is None or isinstance(engine, PlainEngine):
        yield
        return
    inner = engine.checkpoint_engine
    engine.checkpoint_engine = _RoutedCheckpointEngine(inner, background)
    try:
        yield
    finally:
        engine.checkpoint_engine = inner


_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)


def cpu_snapshot(obj):
    """A copy of ``obj`` that later training steps cannot change: the storage of every
    tensor copied into CPU memory once (views of one storage stay views of one copy),
    dicts, lists and tuples rebuilt (an object met twice is copied once), immutable
    values kept and anything else deep-copied. For CPU tensors :func:`torch.save` writes
    the same bytes for the copy as for ``obj``; on a GPU the copy is in CPU memory."""
    memo: dict[int, object] = {}
    storages: dict[int, torch.UntypedStorage] = {}
    originals: list = []  # kept alive until the end, so that no id() is reused

    def tensor(t: torch.Tensor) -> torch.Tensor:
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided:
            return copy.deepcopy(t, memo)
        storage = t.untyped_storage()
        cpu = storages.get(storage._cdata)
        if cpu is None:
            cpu = storage.clone() if storage.device.type == "cpu" else storage.cpu()
            storages[storage._cdata] = cpu
        out = torch.empty(0, dtype=t.dtype).set_(cpu, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            out = torch.nn.Parameter(out, requires_grad=t.requires_grad)
        elif t.requires_grad:
            out.requires_grad_(True)
        if t.__dict__:
            vars(out).update(snap(dict(t.__dict__)))
        return out

    def snap(x: Any) -> Any:
        if isinstance(x, _IMMUTABLE):
            return x
        key = id(x)
        if key in memo:
            return memo[key]
        originals.append(x)
        kind = type(x)
        if isinstance(x, torch.Tensor):
            out = tensor(x)
        elif kind in (dict, OrderedDict):
            out = memo[key] = kind()
            for k, v in x.items():
                out[k] = snap(v)
            if kind is OrderedDict:  # e.g. the ``_metadata`` of a module's state dict
                out.__dict__.update(snap(vars(x)))
        elif kind is list:
            out = memo[key] = []
            out.extend(snap(v) for v in x)
        elif kind is tuple:
            out = tuple(snap(v) for v in x)
        else:
            out = copy.deepcopy(x, memo)
        memo[key] = out
        return out

    return snap(obj)


def load_full(engine, path: Path, env: DistEnv, zero_stage: int) -> dict:
    """Restore model, optimizer and this rank's RNG; return the trainer state."""
    load_engine(engine, path, zero_stage)
    rng_file = path / f"rng-rank{env.rank}.pt"
    if rng_file.exists():
        set_rng_state(torch.load(rng_file, weights_only=False))
    else:  # resumed on a different number of ranks
        log.warning("%s missing; RNG states start fresh on rank %d", rng_file.name, env.rank)
    return json.loads((path / "trainer_state.json").read_text())


def gathered_state_dict(
    engine, zero_stage: int, *, merged: bool = True, on_device: bool = False
) -> dict | None:
    """The full model state dict on rank 0 (None elsewhere); ZeRO-3 partitions are gathered.
    A LoRA model's is its merged weights under the base model's names (``merged``), or
    peft's own state dict, base and adapters apart. The tensors are moved to the CPU
    unless ``on_device`` (below ZeRO-3 they are then the live parameters, detached)."""
    if zero_stage == 3:
        state = engine._zero3_consolidated_16bit_state_dict()
        if torch.distributed.get_rank() != 0:
            return None
    elif torch.distributed.get_rank() != 0:
        return None
    else:
        state = {
            k: v.detach() if on_device else v.detach().cpu()
            for k, v in engine.module.state_dict().items()
        }
    if merged and is_lora(engine.module):
        state = merged_state_dict(engine.module, state)
    return state


def gathered_weights(
    engine, zero_stage: int, *, on_device: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged weights of :func:`gathered_state_dict`, under its names, as ``(name,
    tensor)`` pairs, in a one-rank run. Under ZeRO-3 the whole model is never gathered:
    the parameters of one group of modules (:func:`_module_groups`) are gathered, that
    group's pairs handed out while they are (a LoRA layer's merged from its own base and
    adapters), and released when the pair after the group's last is asked for, before the
    next group is gathered. A consumer that keeps a tensor keeps only that one alive."""
    if zero_stage < 3:
        state = gathered_state_dict(engine, zero_stage, on_device=on_device)
        assert state is not None, "one rank, rank 0"
        yield from state.items()
        return
    import deepspeed

    # GatheredParameters is a collective; only rank 0 would be asking for the next group.
    assert torch.distributed.get_world_size() == 1, "gathered a group at a time on one rank only"
    model = engine.module
    lora = is_lora(model)
    for group in _module_groups(model):
        tensors = {
            f"{prefix}{name}": tensor
            for prefix, module in group
            for name, tensor in _own_state(module)
        }
        params = list({id(t): t for t in tensors.values() if hasattr(t, "ds_id")}.values())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None), torch.no_grad():
            state = {
                key: t.detach() if on_device else t.detach().cpu() for key, t in tensors.items()
            }
            if lora:
                state = merged_state_dict(model, state)
            yield from state.items()
            del state  # the gathered parameters are released on the way out


def _module_groups(model) -> Iterator[list[tuple[str, torch.nn.Module]]]:
    """``model``'s modules as groups of ``(prefix, module)`` whose own tensors are gathered
    together, in state-dict order: each block of a ``ModuleList`` (a decoder layer) whole,
    so that what an inference engine fuses (q/k/v, gate/up) comes in one group; each LoRA
    layer whole, so that its base weight and adapters merge; every other module alone."""
    adapted = {id(m) for m in lora_layers(model).values()} if is_lora(model) else set()

    def walk(prefix: str, module) -> Iterator[list[tuple[str, torch.nn.Module]]]:
        yield [(prefix, module)]
        for name, child in module.named_children():
            if isinstance(module, torch.nn.ModuleList) or id(child) in adapted:
                yield [
                    (f"{inner}.", m)
                    for inner, m in child.named_modules(
                        prefix=f"{prefix}{name}", remove_duplicate=False
                    )
                ]
            else:
                yield from walk(f"{prefix}{name}.", child)

    for group in walk("", model):
        if any(True for _, module in group for _ in _own_state(module)):
            yield group


def _own_state(module) -> Iterator[tuple[str, torch.Tensor]]:
    """What ``module.state_dict()`` holds of ``module`` itself, children apart: its
    parameters and persistent buffers."""
    for name, param in module._parameters.items():
        if param is not None:
            yield name, param
    for name, buffer in module._buffers.items():
        if buffer is not None and name not in module._non_persistent_buffers_set:
            yield name, buffer


def save_inference(
    engine, tokenizer, run_dir: Path, step: int, env: DistEnv, zero_stage: int
) -> Path:
    """Write ``inference/step-N`` from the engine's model (all ranks call this)."""
    final = Path(run_dir) / "inference" / f"step-{step}"
    state = gathered_state_dict(engine, zero_stage, merged=False)
    if env.is_main:
        write_inference_checkpoint(engine.module, tokenizer, final, step=step, state_dict=state)
    barrier()
    return final


def write_inference_checkpoint(
    model, tokenizer, path: Path, *, step: int, state_dict: dict | None = None
) -> Path:
    """The one writer of inference checkpoints: safetensors weights, config (KV cache on),
    tokenizer, generation config and ``pt_train.json``, written to a temporary directory
    and renamed into place. A LoRA model (a peft model; ``state_dict``, if given, its own)
    is written merged, with its adapter in ``adapter/``; a QLoRA model merged into its base
    loaded again in full precision (:func:`pt_train.lora.merged_full_precision`)."""
    with disk_full_as_error(path, kept="nothing written there"), atomic_path(path) as tmp:
        tmp.mkdir()
        if is_four_bit(model):  # QLoRA: merged into the full-precision base
            peft_state = state_dict if state_dict is not None else model.state_dict()
            save_adapter(model, tmp / "adapter", peft_state)
            model, state_dict = merged_full_precision(model, peft_state), None
        elif is_lora(model):
            peft_state = state_dict if state_dict is not None else model.state_dict()
            save_adapter(model, tmp / "adapter", peft_state)
            state_dict = merged_state_dict(model, peft_state)
        save_model_weights(model, tmp, state_dict)
        tokenizer.save_pretrained(str(tmp))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(str(tmp))
        atomic_write_json(tmp / "pt_train.json", {"step": step})
    return Path(path)


def save_model_weights(model, directory: Path, state_dict: dict | None = None) -> None:
    """``model``'s config (KV cache on) and weights (``state_dict``, or its own) as
    safetensors in ``directory``, loadable by HF and vLLM; a peft model is saved as the
    Hugging Face model under it (give its merged state dict)."""
    model = hf_model(model)
    # Training turns the KV cache off; generation wants it on.
    was = model.config.use_cache
    model.config.use_cache = True
    try:
        # save_pretrained (transformers 5) empties the dict it is given: give it its own
        state_dict = dict(state_dict) if state_dict is not None else None
        model.save_pretrained(str(directory), state_dict=state_dict, safe_serialization=True)
    finally:
        model.config.use_cache = was


def save_model_config(model, directory: Path) -> None:
    """What :func:`save_model_weights` writes but the weights: ``model``'s config (KV cache
    on, its dtype and class named as ``save_pretrained`` names them) and generation config,
    for an engine that starts with placeholder weights."""
    model = hf_model(model)
    config = copy.deepcopy(model.config)
    config.use_cache = True
    config.dtype = str(model.dtype).removeprefix("torch.")
    config.architectures = [type(model).__name__]
    config.save_pretrained(str(directory))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(str(directory))
