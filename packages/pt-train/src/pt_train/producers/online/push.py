"""How the policy's new weights reach a generator, chosen once by :func:`make_push` from
``rollout.weight_transfer``:

- ``files``: safetensors written to a directory in memory (``/dev/shm``), two alternating
  so a push never overwrites what the generator may still be reading, loaded in place by
  the generator processes (to a process on another node, the files sent over the
  connection); ``weight_push_s`` is the write, ``weight_load_s`` the processes' loads;
- ``gloo`` / ``ipc`` / ``nccl``: vLLM's weight-transfer API, no file, sent from a thread
  of its own (training goes on meanwhile); ``weight_push_s`` is the trainer's copy of the
  weights (none for ``sync``, whose weights do not change before the push is in),
  ``weight_load_s`` each process's time from the push's start to its end;
- ``memory``: the live tensors handed to a vLLM engine in this process
  (:meth:`VLLMEngine.push_weights <pt_rollout.engines.vllm.VLLMEngine.push_weights>`),
  gathered a group of modules at a time under ZeRO-3; ``weight_push_s`` is the load.

A new way is one class here and one entry in :data:`PUSHES`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from pt_train.policy import Policy


class CurrentWeights:
    """The policy's current weights as a push reads them. Under ZeRO-3 the state dict is
    gathered once for a round by every rank (a collective the producer makes before rank 0
    generates, :attr:`gathered`), else read from the policy when asked."""

    def __init__(self, policy: Policy, tokenizer):
        self.policy = policy
        self.tokenizer = tokenizer
        self.gathered: dict | None = None

    def state_dict(self) -> dict:
        state = self.gathered if self.gathered is not None else self.policy.state_dict()
        if state is None:
            raise RuntimeError("the policy's state dict is only on rank 0")
        return state

    def save(self, target: Path) -> None:
        """The current weights as safetensors in ``target`` (its config beside them)."""
        from pt_train.checkpoint import save_model_weights

        save_model_weights(self.policy.module(), target, self.state_dict())


class WeightDirs:
    """Two directories in memory (``/dev/shm`` where it exists), each with the tokenizer,
    that the current weights are written to in turn."""

    def __init__(self, weights: CurrentWeights):
        self.weights = weights
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
        self.dirs = [Path(tempfile.mkdtemp(prefix=f"pt-weights-{n}-", dir=base)) for n in "ab"]
        for d in self.dirs:
            weights.tokenizer.save_pretrained(str(d))
        self.turn = 0

    def write(self) -> Path:
        target = self.dirs[self.turn % 2]
        self.turn += 1
        for old in target.glob("*.safetensors"):
            old.unlink()
        self.weights.save(target)
        return target

    def close(self) -> None:
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)


class WeightPush:
    """A way of sending the current weights to a generator (``target``): :meth:`send`
    sends them as a version unless the target has that version, without waiting for it to
    load them; ``push_seconds`` and ``load_seconds`` add up the cost."""

    def __init__(self, target, weights: CurrentWeights, *, copy: bool = False):
        self.target = target
        self.weights = weights
        self.copy = copy  # the live weights change while a push is on its way
        self.version: int | None = None  # of the weights the target has (or was sent)
        self.push_seconds = 0.0
        self.load_seconds = 0.0

    def send(self, version: int) -> None:
        if self.version == version:
            return
        start = time.perf_counter()
        self._send(version)
        self.version = version
        self.push_seconds += time.perf_counter() - start

    def _send(self, version: int) -> None:
        raise NotImplementedError

    def loaded(self) -> None:
        """Take in the target's answers to the pushes it has loaded."""

    def close(self) -> None:
        pass


class _PoolPush(WeightPush):
    """A push to a :class:`~pt_rollout.serve.GeneratorPool`, whose answers (in order) say
    how long each process took to load it."""

    def __init__(self, target, weights: CurrentWeights, *, copy: bool = False):
        super().__init__(target, weights, copy=copy)
        self.keys: list[int] = []

    def loaded(self) -> None:
        while self.keys and self.target.done(self.keys[0]):
            self.load_seconds += self.target.wait(self.keys.pop(0))["seconds"]

    def wait_oldest(self) -> None:
        self.load_seconds += self.target.wait(self.keys.pop(0))["seconds"]


class FilesPush(_PoolPush):
    def __init__(self, target, weights: CurrentWeights, *, copy: bool = False,
                 dirs: WeightDirs | None = None):  # fmt: skip
        super().__init__(target, weights, copy=copy)
        self.dirs = dirs or WeightDirs(weights)

    def _send(self, version: int) -> None:
        if len(self.keys) >= 2:  # the push that used the next directory must be loaded
            self.wait_oldest()
        path = self.dirs.write()
        self.keys.append(self.target.submit_load_weights(str(path), version))

    def close(self) -> None:
        self.dirs.close()


class TransferPush(_PoolPush):
    def __init__(self, target, weights: CurrentWeights, *, copy: bool = False, way: str = "gloo"):
        super().__init__(target, weights, copy=copy)
        self.way = way

    def _send(self, version: int) -> None:
        self.keys.append(self.target.submit_push(self.pairs(), version))

    def pairs(self) -> list[tuple[str, Any]]:
        """The current weights as the push sends them (:func:`pairs_to_send`), copied where
        they are the live parameters and training goes on while the push is on its way."""
        pairs = pairs_to_send(self.weights.state_dict(),
                              copy=self.copy and self.weights.gathered is None)  # fmt: skip
        if self.way in ("ipc", "nccl"):  # sent from the GPU's memory
            pairs = [(name, t if t.is_cuda else t.to("cuda")) for name, t in pairs]
        return pairs


class InMemoryPush(WeightPush):
    def _send(self, version: int) -> None:
        self.target.push_weights(self.weights.policy.weights())


# rollout.weight_transfer -> how the weights travel
PUSHES: dict[str, type[WeightPush]] = {
    "files": FilesPush,
    "gloo": TransferPush,
    "ipc": TransferPush,
    "nccl": TransferPush,
    "memory": InMemoryPush,
}


def make_push(
    way: str, target, weights: CurrentWeights, *, copy: bool = False, **extra
) -> WeightPush:
    """The push of ``rollout.weight_transfer`` ``way`` to ``target``; ``copy``: the weights
    are copied for a push that is on its way while training goes on."""
    cls = PUSHES[way]
    if cls is TransferPush:
        extra["way"] = way
    return cls(target, weights, copy=copy, **extra)


def pairs_to_send(state: dict, *, copy: bool) -> list[tuple[str, Any]]:
    """A state dict as ``(name, tensor)`` pairs in checkpoint names for a weight-transfer
    push, a tied head's duplicate of its embedding (the same tensor under a second name)
    left out: the generator's model ties them itself. ``copy``: each tensor copied."""
    pairs, seen = [], set()
    for name, tensor in state.items():
        if tensor.numel():
            where = (tensor.data_ptr(), tuple(tensor.shape))
            if where in seen:
                continue
            seen.add(where)
        pairs.append((name, tensor.detach().clone() if copy else tensor.detach()))
    return pairs
