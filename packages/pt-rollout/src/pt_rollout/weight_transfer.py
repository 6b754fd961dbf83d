"""New weights for a vLLM generator process through vLLM's weight-transfer API
(:mod:`vllm.distributed.weight_transfer`), with no file: the trainer broadcasts its tensors
over a process group it shares with the generator's workers, and each worker loads them
into its model layer by layer, in place (vLLM's layerwise reload).

The handshake is vLLM's: ``init_weight_transfer_engine`` once (the rendezvous), then per
push ``start_weight_update``, ``update_weights`` (the names, dtypes and shapes to receive,
answered once the broadcast is in) and ``finish_weight_update``. A trainer-side engine
(``WeightTransferTrainerFactory``) drives it through a client with those four methods;
:class:`pt_rollout.serve.RemoteGenerator` is one, over its socket.

Three backends:

- ``gloo``: a dense broadcast over a gloo group, registered here in vLLM's two factories as
  ``pt_gloo`` (:func:`register`). Its wire is torch's gloo ``broadcast`` of each tensor in
  checkpoint order, one at a time, received in host memory (on a GPU worker, vLLM's
  loaders copy it to the device); the lifecycle, the layerwise reload and the worker's
  bookkeeping are vLLM's. It runs wherever torch does.
- ``ipc``: vLLM's own CUDA-IPC engines (``ipc`` in its factories): the trainer sends a
  CUDA IPC handle of each tensor, and the worker, on the same GPU, loads from the
  trainer's memory with no copy on the way: for generator processes on the trainer's own
  device. CUDA only.
- ``nccl``: vLLM's own NCCL engines (``nccl``): the tensors broadcast from the trainer's
  GPU to the worker's over an NCCL group of the two, for generator processes on GPUs of
  their own. CUDA only.

This module imports vLLM: it is for the processes that have it (the generator process,
and a trainer run from an environment that holds both, such as ``.venv-vllm``).
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (  # pyright: ignore[reportMissingImports]
    ParamMeta,
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightSource,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (  # pyright: ignore[reportMissingImports]
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

# pt's name of a backend -> the name it is registered under in vLLM's factories
BACKENDS = {"gloo": "pt_gloo", "ipc": "ipc", "nccl": "nccl"}
GLOO = BACKENDS["gloo"]
# How long a side waits for the other in the rendezvous (both enter it at once: the
# trainer asks the generator to, then enters itself), and in each broadcast.
RENDEZVOUS_TIMEOUT = datetime.timedelta(minutes=2)
TIMEOUT = datetime.timedelta(minutes=10)


def register() -> None:
    """Add the gloo engines to vLLM's factories (once per process). The worker that loads
    the weights needs it before vLLM builds its engine at model load; pt's vLLM engine calls
    it before it starts vLLM, and its worker extension's module on import in a worker
    process of its own."""
    if GLOO not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO, GlooWeightTransferEngine)
    if GLOO not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(GLOO, GlooTrainerWeightTransferEngine)


def open_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (for the rendezvous's store)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def trainer_init_info(backend: str, *, host: str, port: int, world_size: int):
    """The trainer's init info for pt's ``backend``, as rank 0 (the sender) of a group of
    ``world_size`` (the trainer and the generator's workers)."""
    if backend == "gloo":
        return GlooTrainerInitInfo(
            master_address=host, master_port=port, world_size=world_size, rank=0
        )
    if backend == "ipc":
        # no rendezvous; one handle per tensor (not vLLM's packed buffer), so a tensor
        # that is already contiguous on the device is shared, not copied
        from vllm.distributed.weight_transfer.ipc_engine import (  # pyright: ignore[reportMissingImports]
            IPCTrainerInitInfo,
        )

        return IPCTrainerInitInfo(rank=0, packed=False)
    if backend == "nccl":
        # vLLM's packed broadcast (its default): tensors sent through a few fixed buffers
        from vllm.distributed.weight_transfer.nccl_engine import (  # pyright: ignore[reportMissingImports]
            NCCLTrainerInitInfo,
        )

        return NCCLTrainerInitInfo(
            master_address=host, master_port=port, world_size=world_size, rank=0
        )
    raise ValueError(f"no weight-transfer backend {backend!r}; pt has {sorted(BACKENDS)}")


class PairsSource(WeightSource):
    """The ``(name, tensor)`` pairs of one push, in checkpoint names (a Hugging Face state
    dict, a tied head's duplicate left out), set before each :meth:`send_weights`."""

    def __init__(self) -> None:
        self.pairs: list[tuple[str, torch.Tensor]] = []

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.pairs]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.pairs)


# --------------------------------------------------------------------------- gloo


def address_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def _gloo_group(host: str, port: int, rank: int, world_size: int):
    """A gloo process group of its own (the default group, if any, untouched), met through
    a TCP store that rank 0 holds at ``host``: rank 0's address on the route to the others.

    Each side's gloo device is bound to its address on the route between them (rank 0's
    is ``host``), never gloo's default, the address this machine's name resolves to: on
    many nodes that is a loopback address (Debian's 127.0.1.1), which a peer on another
    node would be told to connect to."""
    # torch documents both stores as torch.distributed's; its type stubs do not re-export them
    store = dist.TCPStore(host, port, world_size, is_master=rank == 0, timeout=RENDEZVOUS_TIMEOUT)  # pyright: ignore[reportPrivateImportUsage]
    prefixed = dist.PrefixStore("pt-weights", store)  # pyright: ignore[reportPrivateImportUsage]
    options = dist.ProcessGroupGloo._Options()  # pyright: ignore[reportAttributeAccessIssue]
    options._timeout = RENDEZVOUS_TIMEOUT  # the group's default; a broadcast sets its own
    own = host if rank == 0 else address_towards(host, port)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=own)]
    return dist.ProcessGroupGloo(prefixed, rank, world_size, options)


def _broadcast(group, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.timeout = TIMEOUT
    group.broadcast([tensor], options).wait()


@dataclass
class GlooInitInfo(WeightTransferInitInfo):
    """The worker's side of the rendezvous: the trainer's store, where the workers'
    ranks start, and the group's size."""

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int


@dataclass
class GlooUpdateInfo(WeightTransferUpdateInfo):
    """One push: the tensors to receive, in the order they are broadcast."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self):
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                f"names, dtype_names and shapes differ in length: {len(self.names)}, "
                f"{len(self.dtype_names)}, {len(self.shapes)}"
            )


@dataclass
class GlooTrainerInitInfo(TrainerInitInfo):
    backend: ClassVar[str] = GLOO

    master_address: str
    master_port: int
    world_size: int


class GlooWeightTransferEngine(WeightTransferEngine):
    """The worker's side: join the trainer's gloo group, receive each tensor of a push in
    turn and load it (vLLM's ``model.load_weights`` inside its layerwise reload, as its NCCL
    engine does)."""

    init_info_cls = GlooInitInfo
    update_info_cls = GlooUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: Any = None

    def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
        parallel = self.parallel_config
        worker = parallel.data_parallel_index * parallel.world_size + parallel.rank
        self.group = _gloo_group(
            init_info.master_address,
            init_info.master_port,
            init_info.rank_offset + worker,
            init_info.world_size,
        )

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (  # pyright: ignore[reportMissingImports]
            initialize_layerwise_reload,
        )

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import (  # pyright: ignore[reportMissingImports]
            finalize_layerwise_reload,
        )

        finalize_layerwise_reload(self.model, self.model_config)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class ends with torch.accelerator.synchronize(), which raises where
        # there is no accelerator; gloo's broadcast has completed when wait() returns.
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError("gloo weight transfer: init_weight_transfer_engine first")
        for name, dtype_name, shape in zip(
            update_info.names, update_info.dtype_names, update_info.shapes, strict=True
        ):
            # gloo moves host memory: a GPU worker's loaders copy it to the device
            weight = torch.empty(shape, dtype=getattr(torch, dtype_name))
            _broadcast(self.group, weight)
            self.model.load_weights([(name, weight)])

    def shutdown(self) -> None:
        self.group = None


class GlooTrainerWeightTransferEngine(TrainerWeightTransferEngine):
    """The trainer's side (rank 0 of the group, the one sender): the rendezvous, then per
    push vLLM's round trip with each tensor broadcast while the worker's
    ``update_weights`` receives it."""

    init_info_cls = GlooTrainerInitInfo

    def __init__(self, *, client, source: WeightSource, is_sender: bool = True) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender)
        self.group: Any = None

    @classmethod
    def trainer_init(cls, init_info: GlooTrainerInitInfo, *, client, source=None):
        if source is None:
            raise ValueError("the gloo weight transfer sends a WeightSource each push")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        worker_info = GlooInitInfo(
            master_address=init_info.master_address,
            master_port=init_info.master_port,
            rank_offset=1,
            world_size=init_info.world_size,
        )
        # The workers wait in the rendezvous inside init_weight_transfer_engine: both
        # sides must be in it at once. A worker that fails there (it cannot reach this
        # side) answers with its error, which ends the wait for it at once rather than
        # after the rendezvous's timeout; the thread left waiting is a daemon's.
        joined: dict[str, Any] = {}

        def join() -> None:
            try:
                joined["group"] = _gloo_group(
                    init_info.master_address, init_info.master_port, 0, init_info.world_size
                )
            except BaseException as exc:  # raised below, in the caller's thread
                joined["error"] = exc

        thread = threading.Thread(target=join, name="pt-gloo-rendezvous", daemon=True)
        thread.start()
        client.init_weight_transfer_engine(asdict(worker_info))  # raises the worker's error
        thread.join()
        if "error" in joined:
            raise joined["error"]
        engine.group = joined["group"]
        return engine

    def send_weights(self) -> None:
        source = self.source
        assert source is not None  # trainer_init's check
        meta = source.metadata()
        if not self.is_sender:
            for _ in source:
                pass
            return
        info = GlooUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).removeprefix("torch.") for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
        self.client.start_weight_update()
        with ThreadPoolExecutor(max_workers=1) as pool:
            received = pool.submit(self.client.update_weights, asdict(info))
            for (name, tensor), expected in zip(source, meta, strict=True):
                if name != expected.name or tuple(tensor.shape) != expected.shape:
                    raise ValueError(
                        f"the weights changed while being sent: {name} {tuple(tensor.shape)} "
                        f"where {expected.name} {expected.shape} was announced"
                    )
                if received.done():  # the worker failed before taking everything
                    received.result()
                _broadcast(self.group, tensor.detach().cpu().contiguous())
            received.result()
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.group = None
