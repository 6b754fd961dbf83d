"""The pt-train config: one YAML file, validated up front.

    run_name: sft-tiny
    output_dir: runs                 # run dir = output_dir/run_name
    model: {init: {tokenizer: tok/, hidden_size: 128, num_layers: 2, num_heads: 2}}
    data: {path: out/data/sft}
    objective: {name: sft}           # or dft, asft, dpo, each with its own keys
    training: {learning_rate: 1e-4, global_batch_size: 8, max_steps: 100}
    deepspeed: {zero_stage: 2}
    launcher: {nproc: 1}

Invalid combinations (no model source, two training lengths, a batch that the
micro-batch does not divide) are rejected here or at start-up with one message
that names the key.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from pt_core.config import Section, changed_keys, load_config
from pt_core.errors import ConfigError
from pt_core.log import get_logger
from pt_core.sampling import SamplingConfig
from pt_rollout.episodes.config import EnvironmentConfig
from pt_train.alarms import Bound
from pt_train.objectives import ObjectiveConfig
from pt_train.objectives.sft import SFTConfig
from pt_train.rewards import RewardConfig

log = get_logger(__name__)


class ModelInit(Section):
    """Random weights: architecture, sizes and the tokenizer the vocabulary comes from."""

    architecture: Literal["llama"] = "llama"
    tokenizer: str
    hidden_size: int = Field(default=128, gt=0)
    num_layers: int = Field(default=2, gt=0)
    num_heads: int = Field(default=2, gt=0)
    num_kv_heads: int | None = Field(default=None, gt=0)
    intermediate_size: int | None = Field(default=None, gt=0)
    max_position_embeddings: int = Field(default=2048, gt=0)
    tie_word_embeddings: bool = False
    # The embedding rows; None: the tokenizer's length. Larger values leave rows unused
    # (to shape a model like one with a bigger vocabulary).
    vocab_size: int | None = Field(default=None, gt=0)


class LoraSection(Section):
    """LoRA adapters (Hu et al. 2021, arXiv:2106.09685) on the policy, with peft: only the
    adapters train, the base weights stay frozen (see :mod:`pt_train.lora`)."""

    r: int = Field(default=16, gt=0)  # rank of each adapter
    alpha: float = Field(default=32.0, gt=0)  # the update is scaled by alpha / r
    dropout: float = Field(default=0.0, ge=0, lt=1)  # on the adapters' input, while training
    # Names (or name suffixes) of the linear layers that get an adapter; "all-linear": every
    # linear layer but the LM head.
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1
    )
    # The frozen reference of DPO / ASFT / GRPO when objective.reference.path is unset:
    # adapters_off runs the policy with its adapters disabled (the starting weights, no
    # second model in memory); copy loads a second, frozen model.
    reference: Literal["adapters_off", "copy"] = "adapters_off"
    # DoRA (Liu et al. 2024, arXiv:2402.09353): a trained magnitude per output row on top of
    # the low-rank direction update.
    use_dora: bool = False
    # rsLoRA (Kalajdzievski 2023, arXiv:2312.03732): the update scaled by alpha / sqrt(r).
    use_rslora: bool = False
    # QLoRA (Dettmers et al. 2023, arXiv:2305.14314): the frozen base loaded from
    # model.name_or_path in 4-bit NF4 through bitsandbytes (pip install 'pt-train[qlora]'),
    # the adapters trained on top; inference checkpoints merge the adapters into the base
    # loaded again in full precision (pt_train.lora).
    load_in_4bit: bool = False

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name_is_a_list(cls, value):
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _four_bit_needs_bitsandbytes(self):
        """Checked with the config, before any work."""
        import importlib.util

        if self.load_in_4bit and importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError(
                "load_in_4bit (QLoRA) needs the bitsandbytes package, which is not installed"
                "\n  fix: pip install 'pt-train[qlora]', or set model.lora.load_in_4bit=false "
                "to train LoRA on the full-precision base"
            )
        return self


class ModelConfig(Section):
    name_or_path: str | None = None
    init: ModelInit | None = None
    tokenizer: str | None = None  # defaults to name_or_path / init.tokenizer
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    gradient_checkpointing: bool = False
    # Memory-lean SwiGLU MLP and RMSNorm for Llama/Mistral/Qwen2/Qwen3 (pt_train.fused);
    # not applied under ZeRO-3.
    fused_ops: bool = True
    # LoRA adapters; None: the whole model trains.
    lora: LoraSection | None = None

    @model_validator(mode="after")
    def _one_source(self):
        if (self.name_or_path is None) == (self.init is None):
            raise ValueError(
                "give exactly one of model.name_or_path (a hub name or local path) "
                "or model.init (random weights)"
            )
        if self.init is not None and self.lora is not None and self.lora.load_in_4bit:
            raise ValueError(
                "model.lora.load_in_4bit (QLoRA) quantizes pretrained weights, and model.init "
                "draws random ones: there is nothing to quantize\n  fix: give "
                "model.name_or_path, or set model.lora.load_in_4bit=false"
            )
        return self

    @property
    def tokenizer_path(self) -> str:
        # _one_source: without init, name_or_path is set
        return self.tokenizer or (
            self.init.tokenizer if self.init else cast(str, self.name_or_path)
        )

    @property
    def tokenizer_key(self) -> str:
        """The config key :attr:`tokenizer_path` comes from, for errors."""
        if self.tokenizer:
            return "model.tokenizer"
        return "model.init.tokenizer" if self.init else "model.name_or_path"


class DataConfig(Section):
    path: str | None = None  # --data PATH|- overrides it
    split: str = "train"
    shuffle: bool = True
    # Rows of at most this many tokens: conversations are tokenized (and packed) to it here
    # with pt-data's code, and the sequences of preference pairs are packed into rows of it.
    max_seq_length: int = Field(default=2048, gt=0)
    # Rollouts (OPD, GRPO): consecutive samples of one prompt (a GRPO group) train in rows
    # that hold the prompt once, of at most max_seq_length tokens; sdpa and eager attention
    # (flash_attention_2 packs sequences instead).
    shared_prompt: bool = True
    # The chat template (chatml, plain, a .jinja file, or Jinja source) that conversations,
    # untokenized pairs and the online loop's prompts are rendered with here, and that the
    # checkpoints carry; unset: the one the data were built with (dataset.json), else the
    # tokenizer's own.
    chat_template: str | None = None
    # Used only when the data are conversations (not tokenized):
    packing: bool = True
    train_on: Literal["assistant", "last"] = "assistant"
    # Conversations and untokenized preference rows: cut what is too long instead of
    # dropping it (see docs/pt-data.md).
    truncate: bool = False
    # Used only when the data are preference rows that are not tokenized:
    max_prompt_length: int | None = Field(default=None, gt=0)
    max_completion_length: int | None = Field(default=None, gt=0)


LENGTH_KEYS = ("max_steps", "num_epochs", "num_training_samples", "num_training_tokens")


class TrainingConfig(Section):
    learning_rate: float = Field(default=1e-5, ge=0)
    lr_schedule: Literal["cosine", "constant", "linear"] = "cosine"
    warmup_ratio: float = Field(default=0.0, ge=0, le=1)
    warmup_steps: int | None = Field(default=None, ge=0)
    min_lr_ratio: float = Field(default=0.0, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float = Field(default=1.0, ge=0)  # 0 turns clipping off
    seed: int = 0
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    global_batch_size: int = Field(default=8, gt=0)  # rows (packed sequences) per optimizer step
    micro_batch_size: int = Field(default=1, gt=0)  # rows per forward pass on one rank
    max_steps: int | None = Field(default=None, gt=0)
    num_epochs: float | None = Field(default=None, gt=0)
    num_training_samples: int | None = Field(default=None, gt=0)
    num_training_tokens: int | None = Field(default=None, gt=0)
    save_steps: int | None = Field(
        default=None, gt=0
    )  # full checkpoints; one is always saved at the end
    save_total_limit: int = Field(default=2, gt=0)
    inference_steps: int | None = Field(
        default=None, gt=0
    )  # HF checkpoints; one is always saved at the end
    logging_steps: int = Field(default=1, gt=0)
    max_consecutive_nan: int = Field(default=5, gt=0)
    # The LM head runs on this many MiB of fp32 logits at a time (pt_train.logprobs).
    logits_chunk_mb: int = Field(default=256, gt=0)
    # Full checkpoints copied to CPU memory on the training thread and written by a
    # background thread (pt_train.checkpoint.BackgroundSaver).
    async_save: bool = False
    # The hang watchdog (pt_train.watchdog): minutes without a completed optimizer step
    # (and the save after it) before every rank dumps its Python stacks into RUN_DIR/hang/
    # and exits 86; null turns it off.
    watchdog_minutes: float | None = Field(default=None, gt=0)
    # The window of the first step, from the start (process group, model load, DeepSpeed
    # set-up, resume) to the end of step 1; watchdog_minutes where that is longer.
    watchdog_first_step_minutes: float = Field(default=30.0, gt=0)
    # Bounds on logged figures that stop the run (pt_train.alarms), e.g.
    # {rollout_kl: {above: 0.05}, entropy: {below: 0.05}}.
    alarms: dict[str, Bound] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_length(self):
        given = [k for k in LENGTH_KEYS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one training length of {', '.join(LENGTH_KEYS)}; got "
                + (", ".join(given) if given else "none")
            )
        return self


class DeepSpeedSection(Section):
    zero_stage: Literal[0, 1, 2, 3] = 0
    offload_optimizer: bool = False
    offload_param: bool = False
    raw: dict[str, Any] = Field(default_factory=dict)  # merged last into the DeepSpeed JSON
    # auto: plain PyTorch where DeepSpeed would only wrap the model (one process, stage 0,
    # fp32, no offload, no raw keys; see pt_train.engine); deepspeed: DeepSpeed always.
    engine: Literal["auto", "deepspeed"] = "auto"

    @model_validator(mode="after")
    def _offload_needs_zero(self):
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage 1, 2 or 3")
        if self.offload_param and self.zero_stage != 3:
            raise ValueError("offload_param needs zero_stage 3")
        return self


class RolloutBase(SamplingConfig):
    """The online loop: rounds of prompts -> samples from the current policy (sampled as
    :class:`pt_core.sampling.SamplingConfig` says: temperature, top_p, top_k, max_tokens,
    seed, seeding) -> teacher scores or rewards -> ``updates_per_round`` x
    ``epochs_per_round`` optimizer steps -> new weights to the generator. Set ``prompts``
    to turn it on; see :mod:`pt_train.producers.online`. Where the samples come from is
    ``generator``, and each kind has its own keys (:class:`LocalRollout`,
    :class:`ColocateRollout`, :class:`ServerRollout`): a key of one kind cannot be written
    for another."""

    prompts: str | None = None  # prompt rows: a file, a pt-data prompts dataset, or a pipe path
    split: str | None = None  # of a dataset directory (default: train)
    prompt_key: str | None = None
    id_key: str = "id"
    template: bool = True
    system: str | None = None
    samples_per_prompt: int = Field(default=1, ge=1)  # GRPO's group size
    prompts_per_round: int | None = Field(default=None, ge=1)  # default: from the global batch
    updates_per_round: int = Field(default=1, ge=1)  # mini-batches a round's rows are split into
    # passes over a round's rows (PPO's epochs, TRL's num_iterations): a round trains
    # updates_per_round x epochs_per_round optimizer steps, each pass in the same order
    epochs_per_round: int = Field(default=1, ge=1)
    stop: list[str] = Field(default_factory=list)
    # sync: generate round k with the weights after round k-1 (staleness 0); step_off and
    # async overlap generation with training (generator: server only)
    schedule: Literal["sync"] = "sync"


class LocalRollout(RolloutBase):
    """``generator: local``: the HF engine generates with the policy being trained, in the
    trainer's process, between steps (no weight copies)."""

    generator: Literal["local"] = "local"
    engine: Literal["hf"] = "hf"
    # the HF engine's decoder: lean (Llama-family models as flat tensor operations, the
    # same logits to rounding), hf (the model's forward), auto (lean on a CPU only)
    decoder: Literal["auto", "lean", "hf"] = "auto"


class ColocateRollout(RolloutBase):
    """``generator: colocate``: a vLLM engine in the trainer's process that gets new weights
    from the live parameters in memory before each round."""

    generator: Literal["colocate"]
    engine: Literal["vllm"] = "vllm"
    # the weights reach the engine as the live tensors, in memory
    weight_transfer: Literal["memory"] = "memory"
    # on a GPU: vLLM's sleep mode while the trainer steps. 1: its weights moved to host
    # memory and its KV cache freed; 2: both freed (the push before the next round reloads
    # the weights). 0: the engine keeps its memory.
    sleep_level: int = Field(default=0, ge=0, le=2, strict=True)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, gt=0)


class ServerRollout(RolloutBase):
    """``generator: server``: generator processes (:mod:`pt_rollout.serve`, HF or vLLM, in
    their own environment if need be) that get the policy's weights at each round start."""

    generator: Literal["server"]
    engine: Literal["hf", "vllm"] = "hf"
    decoder: Literal["auto", "lean", "hf"] = "auto"  # the HF engine's (see LocalRollout)
    # sync: round k generated with the weights after round k-1; step_off: round k+N is
    # generated while round k trains; async: the generator runs ahead as far as
    # max_staleness allows.
    schedule: Literal["sync", "step_off", "async"] = "sync"
    step_off: int = Field(default=1, ge=1)
    max_staleness: int = Field(default=1, ge=0)  # optimizer updates, async only
    stale: Literal["drop", "keep"] = "drop"  # async: a round older than the bound
    # async, vLLM: new weights reach a generation already running, between two of its
    # steps, instead of waiting for it to end; each token records its weight version
    in_flight: bool = False
    python: str | None = None  # the processes' interpreter (e.g. .venv-vllm/bin/python)
    # generator processes: each round is split among them, and one that ends has its share
    # generated by another. N: started by pt-train on its node; a list of host:port:
    # already listening there (pt-rollout serve --listen, on other nodes)
    servers: int | list[str] = 1
    # with addresses in servers: the key they were started with (default ~/.pt/serve.key)
    server_key_file: str | None = None
    # on a GPU node: the GPU of each generator process, an index among the devices
    # pt-train sees (one per process); unset, every process sees the trainer's devices
    server_devices: list[Annotated[int, Field(strict=True, ge=0)]] | None = None
    # how the processes get new weights: files, as safetensors written to a directory in
    # memory (/dev/shm) and loaded in place; gloo, broadcast over a gloo group with vLLM's
    # weight-transfer API (engine vllm, no file; pt-train run where vllm is); ipc, the same
    # API with CUDA IPC handles (a GPU the trainer and the process share); nccl, the same
    # API over NCCL (processes on GPUs of their own: server_devices)
    weight_transfer: Literal["files", "gloo", "ipc", "nccl"] = "files"
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_model_len: int | None = Field(default=None, gt=0)

    @property
    def server_count(self) -> int:
        """How many generator processes ``servers`` asks for."""
        return len(self.servers) if isinstance(self.servers, list) else self.servers

    @property
    def server_addresses(self) -> list[str] | None:
        """The addresses of generator processes on other nodes, where ``servers`` lists them."""
        return self.servers if isinstance(self.servers, list) else None

    @field_validator("servers", mode="before")
    @classmethod
    def _addresses(cls, value):
        if (
            isinstance(value, bool)
            or not isinstance(value, int | list)
            or (isinstance(value, int) and value < 1)
        ):
            raise ValueError(
                f"rollout.servers={value!r}: give a number of generator processes to start "
                "(1, 2, ...) or a list of the host:port addresses where they listen "
                "(pt-rollout serve --listen)"
            )
        if isinstance(value, list):
            from pt_rollout.serve.protocol import parse_address

            if not value:
                raise ValueError(
                    "rollout.servers lists no address: give host:port of each generator "
                    "process (pt-rollout serve --listen), or a number of processes to start"
                )
            for address in value:
                if not isinstance(address, str):
                    raise ValueError(f"rollout.servers: {address!r} is not an address host:port")
                parse_address(address)
            if len(set(value)) != len(value):
                raise ValueError(f"rollout.servers lists an address twice: {value}")
        return value

    @model_validator(mode="after")
    def _check(self):
        if self.engine == "vllm" and self.decoder != "auto":
            raise ValueError(
                f"rollout.decoder={self.decoder} has no effect with rollout.engine=vllm: it is "
                "the HF engine's decoder; remove it"
            )
        if self.server_key_file is not None and self.server_addresses is None:
            raise ValueError(
                "rollout.server_key_file is the key of generator processes on other nodes, "
                "which rollout.servers lists as host:port; here it starts them itself (with "
                "a key of its own): remove rollout.server_key_file"
            )
        if self.server_addresses is not None:
            started = [  # (key, the pt-rollout serve option that sets it there)
                (key, option)
                for key, option, unset in (
                    ("python", "run pt-rollout serve from that interpreter", None),
                    ("server_devices", "set CUDA_VISIBLE_DEVICES where it starts", None),
                    ("gpu_memory_utilization", "--gpu-memory-utilization", None),
                    ("max_model_len", "--max-model-len", None),
                    ("decoder", "--decoder", "auto"),
                )
                if getattr(self, key) != unset
            ]
            if started:
                raise ValueError(
                    f"rollout.{started[0][0]} is a setting of the generator process, and those "
                    "listed in rollout.servers were started with their own: remove "
                    f"rollout.{started[0][0]} and give it to pt-rollout serve on their "
                    f"nodes ({started[0][1]})"
                )
            if self.weight_transfer == "ipc":
                raise ValueError(
                    "rollout.weight_transfer=ipc shares the trainer's GPU memory with "
                    "processes on its own GPU, and those listed in rollout.servers are on "
                    "other nodes: use rollout.weight_transfer=nccl (or gloo, files)"
                )
        if self.in_flight and (self.schedule != "async" or self.engine != "vllm"):
            raise ValueError(
                "rollout.in_flight pushes new weights into generations already running, "
                "which only rollout.schedule=async has, with rollout.engine=vllm "
                f"(here schedule={self.schedule}, engine={self.engine}): set those, or "
                "remove rollout.in_flight"
            )
        if self.weight_transfer != "files" and self.engine != "vllm":
            raise ValueError(
                f"rollout.weight_transfer={self.weight_transfer} is how vLLM generator "
                f"processes get new weights (here engine={self.engine}): set "
                "rollout.engine=vllm, or remove rollout.weight_transfer"
            )
        if self.server_devices is not None:
            if len(self.server_devices) != self.server_count:
                raise ValueError(
                    f"rollout.server_devices names {len(self.server_devices)} devices for "
                    f"rollout.servers={self.servers} generator processes: give one per process"
                )
            if self.weight_transfer == "nccl" and 0 in self.server_devices:
                raise ValueError(
                    "rollout.weight_transfer=nccl joins the trainer's GPU (device 0) with each "
                    "generator process's, and NCCL cannot join two processes on one GPU: give "
                    "rollout.server_devices devices other than 0 (or, for processes on the "
                    "trainer's GPU, remove rollout.server_devices and use "
                    "rollout.weight_transfer=ipc)"
                )
            if self.weight_transfer == "ipc" and any(self.server_devices):
                raise ValueError(
                    "rollout.weight_transfer=ipc shares the trainer's GPU memory (device 0) "
                    f"with processes on that GPU, and rollout.server_devices="
                    f"{self.server_devices} places processes on others: use "
                    "rollout.weight_transfer=nccl (or gloo, files) for them, or remove "
                    "rollout.server_devices"
                )
        if (
            self.weight_transfer == "nccl"
            and self.server_devices is None
            and self.server_addresses is None
        ):
            raise ValueError(
                "rollout.weight_transfer=nccl broadcasts from the trainer's GPU to each "
                "generator process's own, and without rollout.server_devices they share the "
                "trainer's: set rollout.server_devices to GPUs other than 0 (or list "
                "processes on other nodes in rollout.servers), or use "
                "rollout.weight_transfer=ipc (one GPU), gloo or files"
            )
        if self.weight_transfer != "files" and self.in_flight:
            raise ValueError(
                f"rollout.in_flight loads new weights between two steps of a generation, from "
                f"files; rollout.weight_transfer={self.weight_transfer} sends them between "
                "generations: remove one of them"
            )
        return self


def _generator_of(value) -> str:
    """The kind a rollout section is: its ``generator`` (``local`` where none is given)."""
    if isinstance(value, dict):
        return value.get("generator", "local")
    return getattr(value, "generator", "local")


# The online loop's section: one of the generator kinds, by ``generator``.
RolloutConfig = Annotated[
    Annotated[LocalRollout, Tag("local")]
    | Annotated[ColocateRollout, Tag("colocate")]
    | Annotated[ServerRollout, Tag("server")],
    Discriminator(_generator_of),
]


class GenerateEvalConfig(SamplingConfig):
    """Answers of the policy to a prompt set (greedy by default; sampled as
    :class:`pt_core.sampling.SamplingConfig` says), graded by pt-eval (pt_train.evaluate)."""

    prompts: str | None = None  # prompt rows with a gold answer column
    split: str | None = None  # of a dataset directory (default: test if present, else train)
    max_prompts: int = Field(default=200, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    answer_key: str = "answer"
    template: bool = True
    system: str | None = None


class EvalConfig(Section):
    """Evaluation every ``steps`` optimizer steps (and after the last); see pt_train.evaluate."""

    steps: int | None = Field(default=None, ge=1)
    split: str = "validation"
    max_rows: int | None = Field(default=None, ge=1)
    generate: GenerateEvalConfig = Field(default_factory=GenerateEvalConfig)


class LauncherConfig(Section):
    nproc: int = Field(default=1, gt=0)  # >1: pt-train starts this many local ranks itself
    backend: Literal["auto", "gloo", "nccl"] = "auto"  # auto: nccl on GPU, gloo on CPU
    master_port: int | None = None


# MLflow's stores in a database, which it opens through sqlalchemy (sqlite:///mlflow.db is
# MLflow 3's own default).
MLFLOW_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")

# The package each logger needs: (key, module to import, pip name).
LOGGER_PACKAGES = (
    ("tensorboard", "tensorboard", "tensorboard"),
    ("wandb", "wandb", "wandb"),
    ("mlflow", "mlflow", "mlflow"),
)


class LoggingConfig(Section):
    """Where step metrics go besides ``metrics.jsonl`` (see :mod:`pt_train.metrics`)."""

    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "pt"
    # None: the WANDB_MODE environment variable where set, else offline.
    wandb_mode: Literal["offline", "online", "disabled"] | None = None
    mlflow: bool = False
    # None: the MLFLOW_TRACKING_URI environment variable where set, else a file store
    # <output_dir>/mlruns (see pt_train.metrics.mlflow_tracking_uri).
    mlflow_tracking_uri: str | None = None
    mlflow_experiment: str = "pt"

    @model_validator(mode="after")
    def _loggers_installed(self):
        """Checked with the config, before any data is read or model loaded."""
        import importlib.util
        import os

        for key, module, package in LOGGER_PACKAGES:
            if getattr(self, key) and importlib.util.find_spec(module) is None:
                raise ValueError(
                    f"logging.{key} is on but the {package} package is not installed"
                    f"\n  fix: pip install {package}, or set logging.{key}=false"
                )
        if not self.mlflow:
            return self
        if self.mlflow_tracking_uri is not None:
            uri, named = self.mlflow_tracking_uri, "logging.mlflow_tracking_uri"
        else:
            uri, named = os.environ.get("MLFLOW_TRACKING_URI"), "MLFLOW_TRACKING_URI"
        scheme = (uri or "").partition(":")[0].split("+")[0].lower()
        if scheme in MLFLOW_DATABASE_SCHEMES and importlib.util.find_spec("sqlalchemy") is None:
            raise ValueError(
                f"{named}={uri} is a database store, which needs the sqlalchemy package "
                "(mlflow-skinny, what pt-train[mlflow] installs, has none)"
                "\n  fix: pip install mlflow (the full package), or set "
                "logging.mlflow_tracking_uri to a tracking server (http://HOST:5000) or a file "
                "store (file:///PATH), or leave it unset for <output_dir>/mlruns"
            )
        return self


class TrainConfig(Section):
    run_name: str
    output_dir: str = "runs"
    model: ModelConfig
    data: DataConfig = Field(default_factory=DataConfig)
    objective: ObjectiveConfig = Field(default_factory=SFTConfig)
    training: TrainingConfig
    deepspeed: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    rollout: RolloutConfig = Field(default_factory=LocalRollout)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    # the online loop's samples as episodes of an environment (pt_rollout.episodes)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    launcher: LauncherConfig = Field(default_factory=LauncherConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    slurm: dict[str, Any] = Field(default_factory=dict)  # pt-slurm reads it; pt-train ignores it

    @model_validator(mode="before")
    @classmethod
    def _training_loss_is_now_objective(cls, data):
        return migrate(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _reward_is_read(self):
        """A ``reward:`` section set for an objective that declares no reward changes
        nothing: refused."""
        from pt_train.objectives import REGISTRY

        given = self.reward.model_dump(exclude_defaults=True)
        objective = REGISTRY[self.objective.name][1](self.objective)
        declare = getattr(objective, "declare", None)  # needs that follow from its config
        needs = declare() if declare is not None else objective.needs
        if given and not needs.reward:
            key = next(iter(given))
            raise ValueError(
                f"reward.{key} has no effect: objective {self.objective.name} trains on no "
                "reward; remove the reward section"
            )
        if self.environment.grade and not needs.reward:
            raise ValueError(
                f"environment.grade has no effect: objective {self.objective.name} trains on "
                "no reward; remove it"
            )
        if given and self.environment.name is not None and not self.environment.grade:
            key = next(iter(given))
            raise ValueError(
                f"reward.{key} has no effect: with an environment the reward is the "
                "environment's alone unless environment.grade is true; set environment.grade: "
                "true to add the reward section's, or remove the reward section"
            )
        return self

    @model_validator(mode="after")
    def _environment_is_the_online_loops(self):
        """An environment plays the online loop's episodes: without the loop, or a key of
        it without an environment, changes nothing, and is refused."""
        env = self.environment
        given = env.model_dump(exclude_defaults=True)
        if env.name is None and given:
            key = next(iter(given))
            raise ValueError(
                f"environment.{key} has no effect without environment.name; set the "
                "environment (module:Class) or remove it"
            )
        if env.name is not None and self.rollout.prompts is None:
            raise ValueError(
                f"environment.name={env.name} plays episodes in the online loop, which "
                "rollout.prompts turns on; set rollout.prompts (the rows episodes open "
                "from) or remove the environment section"
            )
        return self

    @model_validator(mode="after")
    def _four_bit_base_is_whole(self):
        """A 4-bit base (QLoRA) stays whole on every rank: ZeRO would partition its packed
        weights, and a generator process would need merged full-precision weights each
        round."""
        if self.model.lora is None or not self.model.lora.load_in_4bit:
            return self
        if self.deepspeed.zero_stage > 0:
            raise ValueError(
                f"model.lora.load_in_4bit (QLoRA) with deepspeed.zero_stage="
                f"{self.deepspeed.zero_stage}: ZeRO partitions the model's weights, and the "
                "4-bit base's packed weights cannot be partitioned\n  fix: set "
                "deepspeed.zero_stage=0"
            )
        if self.rollout.prompts is not None and isinstance(self.rollout, ServerRollout):
            raise ValueError(
                "model.lora.load_in_4bit (QLoRA) with rollout.generator=server: the generator "
                "process takes merged full-precision weights each round, which pt-train does "
                "not build from a 4-bit base\n  fix: set rollout.generator=local"
            )
        return self

    @model_validator(mode="after")
    def _colocate_is_one_rank(self):
        """The colocated engine runs in rank 0's process and takes its weights from that
        rank's parameters, on one rank (under ZeRO-3 gathered there a layer at a time).
        Checked with the config, before the model is loaded; vllm itself last, so the
        structural errors come first."""
        if self.rollout.prompts is None or not isinstance(self.rollout, ColocateRollout):
            return self
        if self.launcher.nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ValueError(
                "rollout.generator=colocate runs one vLLM engine in a single training process; "
                "pt-train does not place engines on several ranks\n  fix: train on one rank "
                "(launcher.nproc=1), or set rollout.generator=server"
            )
        if self.model.lora is not None and self.model.lora.load_in_4bit:
            raise ValueError(
                "model.lora.load_in_4bit (QLoRA) with rollout.generator=colocate: the engine "
                "takes merged full-precision weights each round, which pt-train does not build "
                "from a 4-bit base\n  fix: set rollout.generator=local"
            )
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                f"rollout.generator=colocate runs vLLM in this process, and {sys.executable} "
                "has no vllm\n  fix: run pt-train from an environment with vllm and pt-train "
                "(.ci/setup-vllm.sh makes .venv-vllm), or set rollout.generator=server"
            )
        return self

    @model_validator(mode="after")
    def _weight_transfer_has_vllm(self):
        """The trainer drives vLLM's weight-transfer API, so vllm must be importable in
        pt-train's own interpreter too. Checked with the config, before the model is loaded."""
        r = self.rollout
        if r.prompts is None or not isinstance(r, ServerRollout) or r.weight_transfer == "files":
            return self
        import importlib.util

        if r.weight_transfer == "ipc" and (
            self.launcher.nproc > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1
        ):
            raise ValueError(
                "rollout.weight_transfer=ipc shares one rank's weights, and vLLM's IPC "
                "sender gathers handles from every rank of the job\n  fix: train on one "
                "rank (launcher.nproc=1), or set rollout.weight_transfer=files"
            )
        if importlib.util.find_spec("vllm") is None:
            raise ValueError(
                f"rollout.weight_transfer={r.weight_transfer} sends weights with "
                f"vLLM's weight-transfer API from this process, and {sys.executable} has no "
                "vllm\n  fix: run pt-train from an environment with vllm and pt-train "
                "(.ci/setup-vllm.sh makes .venv-vllm), or set rollout.weight_transfer=files"
            )
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    @property
    def sampling_temperature(self) -> float:
        """The temperature of the distribution the trained samples were drawn from, at
        which the token head computes the policy's log-probs of them (and a teacher scores
        them): the online loop's ``rollout.temperature``; 1 for everything else (rows,
        pairs, and rollouts given as data, sampled at temperature 1). Greedy decoding
        (``rollout.temperature: 0``) draws from no distribution: its samples are the mode of
        the model's own, at temperature 1, and that is the one compared (a loss that needs
        the sampling distribution, GRPO's or OPD's pg_reverse_kl, refuses greedy)."""
        if self.rollout.prompts is None or self.rollout.temperature == 0:
            return 1.0
        return self.rollout.temperature


def migrate(data: dict, *, warn: bool = True) -> dict:
    """Configs written before objectives were sections: ``training.loss: dft`` is
    ``objective: {name: dft}``; before rewards were the online loop's component,
    ``objective.reward`` was the ``reward`` section. Both at once is an error."""
    data = _reward_section(data, warn)
    training = data.get("training")
    if not isinstance(training, dict) or "loss" not in training:
        return data
    data = {**data, "training": {k: v for k, v in training.items() if k != "loss"}}
    if "objective" in data:
        raise ConfigError(
            "training.loss and objective are both given; training.loss is the old name of "
            "objective.name",
            hint="remove training.loss and keep objective: {name: ...}",
        )
    data["objective"] = {"name": training["loss"]}
    if warn:
        log.warning(
            "training.loss=%s is now objective.name=%s (objective: {name: %s}); "
            "the old key still works",
            training["loss"],
            training["loss"],
            training["loss"],
        )
    return data


def _reward_section(data: dict, warn: bool) -> dict:
    objective = data.get("objective")
    if not isinstance(objective, dict) or "reward" not in objective:
        return data
    if "reward" in data:
        raise ConfigError(
            "objective.reward and reward are both given; objective.reward is the old place "
            "of the reward section",
            hint="move its keys into reward: and remove objective.reward",
        )
    data = {**data, "objective": {k: v for k, v in objective.items() if k != "reward"}}
    data["reward"] = objective["reward"]
    if warn:
        log.warning(
            "objective.reward is now the top-level reward section; the old place still works"
        )
    return data


def load_train_config(path, overrides: list[str] | None = None) -> TrainConfig:
    return load_config(path, overrides, TrainConfig)


def check_gpus(cfg: TrainConfig) -> None:
    """The keys that only a machine with GPUs runs, against this machine's: called by
    ``pt-train run`` before any model is loaded. Not part of the config's validation, so
    ``pt-train check`` (pt-slurm's, on a login node without a GPU) passes a config written
    for GPU nodes. ConfigError, naming every such key and its fix, where one does not fit."""
    r = cfg.rollout
    if r.prompts is None:
        return
    sleep_level = r.sleep_level if isinstance(r, ColocateRollout) else 0
    transfer = r.weight_transfer if isinstance(r, ServerRollout) else None
    devices = r.server_devices if isinstance(r, ServerRollout) else None
    wanted = []  # (key=value, the fix on a machine without a GPU)
    if sleep_level:
        wanted.append((f"rollout.sleep_level={sleep_level}", "remove rollout.sleep_level"))
    if transfer in ("ipc", "nccl"):
        wanted.append((f"rollout.weight_transfer={transfer}", "set rollout.weight_transfer=gloo"))
    if devices is not None:
        wanted.append((f"rollout.server_devices={devices}", "remove rollout.server_devices"))
    if not wanted:
        return
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        keys = ", ".join(key for key, _ in wanted)
        why = (
            " (vLLM's CPU build has no sleep mode, CUDA IPC or NCCL)"
            if sleep_level or transfer in ("ipc", "nccl")
            else ""
        )
        raise ConfigError(
            f"{keys} {'needs' if len(wanted) == 1 else 'need'} a GPU (CUDA or ROCm), and this "
            f"machine has none{why}",
            hint="; ".join(fix for _, fix in wanted),
        )
    if devices is not None and (missing := [d for d in devices if d >= count]):
        raise ConfigError(
            f"rollout.server_devices names device {missing[0]}, and pt-train sees {count} "
            f"GPU{'s' if count > 1 else ''} (0 to {count - 1})",
            hint="name devices pt-train sees (its CUDA_VISIBLE_DEVICES sets which)",
        )


# Keys that may differ between the frozen config of a run and the config it is
# resumed with: they change how often things are saved or logged, or where the
# job runs, never the arithmetic of training.
RESUME_FREE_KEYS = (
    "training.save_steps",
    "training.save_total_limit",
    "training.inference_steps",
    "training.logging_steps",
    "training.max_consecutive_nan",
    "training.logits_chunk_mb",
    "training.async_save",
    "training.watchdog_minutes",
    "training.watchdog_first_step_minutes",
    "training.alarms",
    "rollout.python",
    "eval",
    "rollout.gpu_memory_utilization",
    "rollout.sleep_level",
    "rollout.server_devices",
    "rollout.servers",
    "rollout.server_key_file",
    "launcher",
    "deepspeed.engine",
    "logging",
    "slurm",
    "output_dir",
)


def resume_changed_keys(old: dict, new: dict) -> list[str]:
    """The keys of a run's frozen config that a resumed run changes, free keys left out.
    A path written another way (``out/data/sft`` then the absolute path a manifest on
    stdin gives) is the same value when both name the same existing file or directory."""
    return [
        key
        for key in changed_keys(old, new, ignore=RESUME_FREE_KEYS)
        if not _same_path(_value_at(old, key), _value_at(new, key))
    ]


def _value_at(tree: dict, key: str):
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _same_path(a, b) -> bool:
    if not (isinstance(a, str) and isinstance(b, str)) or a == b:
        return False
    try:
        pa, pb = Path(a).expanduser(), Path(b).expanduser()
        return (pa.exists() or pb.exists()) and pa.resolve() == pb.resolve()
    except (OSError, ValueError):
        return False


def batch_layout(training: TrainingConfig, world_size: int) -> int:
    """Gradient-accumulation steps for the global batch; a clear error when it does not divide."""
    per_step = training.micro_batch_size * world_size
    if training.global_batch_size % per_step:
        raise ConfigError(
            f"training.global_batch_size={training.global_batch_size} is not divisible by "
            f"micro_batch_size x world_size = {training.micro_batch_size} x {world_size}",
            hint=f"use a global_batch_size that is a multiple of {per_step}, "
            "or change training.micro_batch_size",
        )
    return training.global_batch_size // per_step
