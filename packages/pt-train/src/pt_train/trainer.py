"""The training loop: objectives trained on batches that producers hand over.

    from pt_train.config import load_train_config
    from pt_train.trainer import train
    result = train(load_train_config("train.yaml"), data_path="out/data/sft")

Launch one process (CPU or one GPU), or many under ``torchrun`` / ``deepspeed``
/ ``accelerate launch``; ``pt-train run`` with ``launcher.nproc=N`` starts N
local ranks itself. Each optimizer step:

1. takes this rank's micro-batches of the step from the producer
   (:mod:`pt_train.producers`), and adds up the objective's normalizer (trained tokens,
   pairs, sequences: :meth:`Objective.count`) and the tokens over all ranks (one
   all-reduce);
2. for every micro-batch, runs the policy once through the token head
   (:mod:`pt_train.logprobs`: log-probs at trained positions only, the LM head in
   chunks), and the reference model where the objective compares with one; computes the
   loss SUM and back-propagates ``sum * world_size / global_count`` (DeepSpeed averages
   gradients over ranks, the world size undoes that), so the gradient is that of the
   step's mean however the batch is split;
3. adds up the loss, the objective's metrics, the NaN flag and the stop request over the
   ranks (a second all-reduce), clips, steps AdamW at the step's learning rate, and skips
   the update when any rank's loss was NaN/inf.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
import yaml

from pt_core.config import config_hash, config_to_dict, freeze_config
from pt_core.errors import ConfigError, InputError, PtError, RunFailure
from pt_core.log import get_logger, progress
from pt_train import checkpoint as ckpt
from pt_train.alarms import Alarms, AlarmTripped
from pt_train.batch import Batch
from pt_train.chat_format import run_chat_format
from pt_train.config import TrainConfig, batch_layout, migrate, resume_changed_keys
from pt_train.distributed import DistEnv, all_reduce, barrier, init_distributed, launched_env
from pt_train.engine import PlainEngine, use_plain_engine
from pt_train.fingerprint import check_data_fingerprint, data_fingerprint, write_data_fingerprint
from pt_train.logprobs import HeadRequest, install_token_head, other_model_hidden
from pt_train.lora import AdaptersOff, hf_model, shares_reference
from pt_train.metrics import MetricsWriter, peak_flops, peak_memory_gb, training_flops_per_token
from pt_train.model import check_lora_targets, load_model, load_tokenizer
from pt_train.objectives import REGISTRY, Needs, Objective, build_objective
from pt_train.policy import Policy
from pt_train.producers import Producer
from pt_train.producers.fixed import FixedData
from pt_train.schedule import lr_at
from pt_train.signals import NonFiniteLoss, StopRequest
from pt_train.watchdog import TestStall, Watchdog

log = get_logger(__name__)

RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class TrainingAborted(RunFailure):
    """Training cannot go on (e.g. the loss stayed NaN/inf for too many steps)."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    total_steps: int
    inference_path: Path | None  # None when stopped by a signal
    stopped: bool  # True: stopped on SIGTERM/SIGUSR1 after saving a full checkpoint


def deepspeed_config(cfg: TrainConfig, grad_accum: int, bf16: bool) -> dict:
    """The DeepSpeed JSON derived from the YAML; ``deepspeed.raw`` is merged in last."""
    ds = cfg.deepspeed
    zero: dict = {"stage": ds.zero_stage}
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if ds.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    config = {
        "train_batch_size": cfg.training.global_batch_size,
        "train_micro_batch_size_per_gpu": cfg.training.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        # Stage 0 is clipped here (to report the norm); ZeRO clips its own partitions.
        "gradient_clipping": cfg.training.max_grad_norm if ds.zero_stage > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    return _merge(config, ds.raw)


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def total_steps_of(cfg: TrainConfig, num_rows: int, num_tokens: int) -> int:
    """Optimizer steps for the configured length; a partial last batch rounds up."""
    t, g = cfg.training, cfg.training.global_batch_size
    if t.max_steps is not None:
        return t.max_steps
    if t.num_epochs is not None:
        samples = t.num_epochs * num_rows
    elif t.num_training_samples is not None:
        samples = t.num_training_samples
    else:
        assert t.num_training_tokens is not None  # exactly one length is set (the config's check)
        samples = t.num_training_tokens / (num_tokens / num_rows)
    return max(1, math.ceil(samples / g - 1e-9))


class Trainer:
    def __init__(
        self, cfg: TrainConfig, *, force_resume: bool = False, producer: Producer | None = None
    ):
        self.cfg = cfg
        self.run_dir = cfg.run_dir
        if producer is None and cfg.data.path is None and cfg.rollout.prompts is None:
            raise ConfigError(
                "no training data: data.path is not set",
                hint="set data.path in the config, or pass --data PATH (or --data - in a pipe)",
            )
        self.env: DistEnv = init_distributed(cfg.launcher.backend)
        self.device = (
            torch.device("cuda", self.env.local_rank)
            if torch.cuda.is_available()
            else torch.device("cpu")
        )
        precision = cfg.training.precision
        self.bf16 = precision == "bf16" or (precision == "auto" and self.device.type == "cuda")
        self.model_dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.grad_accum = batch_layout(cfg.training, self.env.world_size)
        self.zero_stage = cfg.deepspeed.zero_stage
        self._prepare_run_dir(force_resume)

        self.tokenizer = load_tokenizer(cfg.model.tokenizer_path, key=cfg.model.tokenizer_key)
        # LoRA targets that match no layer are refused before anything is written to the
        # run directory (a precomputed reference, below, is written before the model loads).
        check_lora_targets(cfg.model, self.tokenizer)
        # Before any row is tokenized or prompt rendered: the run's template and EOS.
        self.chat_format = run_chat_format(cfg, self.tokenizer, announce=self.env.is_main)
        self.objective: Objective = build_objective(cfg.objective)
        self.objective.configure(cfg)
        self.needs: Needs = self.objective.needs
        self.reference = None
        self.policy = Policy(
            zero_stage=self.zero_stage,
            device=self.device,
            dtype=self.model_dtype,
            chunk_mb=cfg.training.logits_chunk_mb,
            temperature=cfg.sampling_temperature,
            # a colocated engine shares the trainer's device: its weights are not copied to
            # the CPU on the way
            on_device=cfg.rollout.generator == "colocate",
        )
        if producer is None and cfg.rollout.prompts is not None:
            producer = self._online_producer()
        self.producer = producer if producer is not None else self._fixed_producer()
        self.total_steps = total_steps_of(cfg, self.producer.num_rows, self.producer.num_tokens)
        frozen = self.needs.frozen_model
        if frozen is not None and frozen.path is not None and self.env.is_main:
            from pt_train.model import check_same_tokenizer

            # precomputed log-probs may be stored in the run: the model may be gone on resume
            check_same_tokenizer(
                self.tokenizer, frozen.path, self.needs.frozen_as, required=not frozen.precompute
            )
        live_reference = self.needs.frozen != "none" and not (frozen and frozen.precompute)
        # LoRA: the reference is the policy with its adapters off, once the engine holds it.
        adapters_off = live_reference and shares_reference(cfg.model.lora, frozen)
        if live_reference and not adapters_off:
            self.reference = self._load_reference()
        self._write_run_dir()
        self._build_engine()
        self.policy.attach(self.engine)
        if adapters_off:
            log.info("frozen reference: the policy with its LoRA adapters disabled")
            self.reference = AdaptersOff(self.engine.module)
        # resilience: full checkpoints written in the background (training.async_save)
        self.background = (
            ckpt.background_saver(self.engine, self.env, self.run_dir)
            if cfg.training.async_save
            else None
        )

        self.step = 0
        self.trained_tokens = 0
        self.nonfinite = NonFiniteLoss(cfg.training.max_consecutive_nan)
        self.alarms = Alarms(cfg.training.alarms)
        latest = ckpt.latest_checkpoint(self.run_dir)
        if latest is not None:
            state = ckpt.load_full(self.engine, latest, self.env, self.zero_stage)
            self.step = state["step"]
            self.trained_tokens = state["trained_tokens"]
            self.nonfinite.consecutive = state["consecutive_nonfinite"]
            self.objective.load_state_dict(state.get("objective", {}))
            self.producer.load_state_dict(state.get("producer", {}))
            log.info("resuming %s from %s (step %d)", self.run_dir, latest.name, self.step)
        self.evaluator = None
        if cfg.eval.steps:
            from pt_train.evaluate import Evaluator, HeldOut

            if cfg.eval.generate.prompts is not None and self.zero_stage == 3:
                raise ConfigError(
                    "eval.generate answers with the policy in one process, which ZeRO-3 "
                    "partitions over the ranks",
                    hint="evaluate the inference checkpoints with pt-eval run instead, or use "
                    "deepspeed.zero_stage 0-2",
                )
            held_out = None
            if self.needs.data in ("tokens", "pairs"):
                held_out = HeldOut(self._held_out_batches, self.forward_loss)
            self.evaluator = Evaluator(cfg, self.env, self.policy, self.tokenizer, held_out)
        self.metrics = MetricsWriter(
            self.run_dir, cfg.logging, enabled=self.env.is_main, resume_step=self.step
        )
        self.flops_per_token = training_flops_per_token(self.engine.module)
        self.peak_flops = peak_flops()

    # ------------------------------------------------------------------ set-up

    def _prepare_run_dir(self, force_resume: bool) -> None:
        """Refuse to resume a run whose arithmetic (or data) changed; writes nothing."""
        frozen = self.run_dir / "config.yaml"
        data = self.cfg.data
        if data.path is not None:
            fingerprint = data_fingerprint(data.path, data.split)
        elif self.cfg.rollout.prompts is not None:
            fingerprint = data_fingerprint(
                self.cfg.rollout.prompts, self.cfg.rollout.split or "train"
            )
        else:
            fingerprint = None
        if frozen.exists() and ckpt.latest_checkpoint(self.run_dir) is not None:
            old = migrate(yaml.safe_load(frozen.read_text()) or {}, warn=False)
            # Keys added to pt since the run was frozen take their defaults there; a frozen
            # key pt no longer has leaves the config as it is (and is reported changed).
            with contextlib.suppress(ValueError, PtError):
                old = config_to_dict(TrainConfig.model_validate(old))
            changed = resume_changed_keys(old, config_to_dict(self.cfg))
            if changed and not force_resume:
                raise ConfigError(
                    f"{self.run_dir} holds a run with a different config; changed keys: "
                    + ", ".join(changed),
                    hint="use a new run_name, restore those values, or pass --force-resume "
                    "to continue anyway with the new values",
                )
            if changed:
                log.warning("resuming with changed keys (forced): %s", ", ".join(changed))
            if fingerprint is not None:
                check_data_fingerprint(self.run_dir, fingerprint, force_resume=force_resume)
        self._fingerprint = fingerprint

    def _write_run_dir(self) -> None:
        """Create the run directory and freeze the config (rank 0), once the data loaded:
        bad data leaves nothing behind."""
        barrier()
        if self.env.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            ckpt.remove_stale_temporaries(self.run_dir)
            freeze_config(self.cfg, self.run_dir)
            if self._fingerprint is not None:
                write_data_fingerprint(self.run_dir, self._fingerprint)
        barrier()

    @property
    def fused_ops(self) -> bool:
        # ZeRO-3 gathers a weight only when its own module runs; the fused MLP reads three.
        return self.cfg.model.fused_ops and self.zero_stage < 3

    def _online_producer(self) -> Producer:
        """Rounds of generation from the policy itself (``rollout.prompts`` set)."""
        from pt_train.producers.online import OnlineProducer

        if self.needs.data != "rollouts":
            online = [name for name, (_, cls) in REGISTRY.items() if cls.needs.data == "rollouts"]
            raise ConfigError(
                f"rollout.prompts is set, but objective {self.cfg.objective.name!r} trains on "
                "fixed data, not on samples from the policy",
                hint=f"use objective.name={' or '.join(online)} with rollout.prompts, or unset "
                "rollout.prompts",
            )
        rollout = self.cfg.rollout
        if self.zero_stage == 3 and (rollout.generator == "local" or rollout.schedule != "sync"):
            raise ConfigError(
                "under ZeRO-3 the online loop gathers the weights for each round: it needs "
                "rollout.generator=server (or colocate, on one rank) and rollout.schedule=sync",
                hint="set them, or use deepspeed.zero_stage 0-2",
            )

        return OnlineProducer(self.cfg, self.objective, self.env, self.tokenizer, self.policy)

    def _held_out_batches(self) -> list:
        """This rank's micro-batches of the held-out rows (``eval.split``), every rank the
        same number (None where a rank has fewer rows)."""
        evaluation = self.cfg.eval
        data = self.cfg.data.model_copy(update={"split": evaluation.split, "shuffle": False})
        producer = cast(FixedData, self._fixed_producer(data_cfg=data, for_eval=True))
        items = list(range(producer.num_rows))
        if evaluation.max_rows is not None:
            items = items[: evaluation.max_rows]
        world, rank = self.env.world_size, self.env.rank
        per_rank = -(-len(items) // world)  # ceil: the last ranks may get fewer rows
        mine = items[rank * per_rank : (rank + 1) * per_rank]
        size = self.cfg.training.micro_batch_size
        count = -(-per_rank // size)
        return [
            producer.to_batch(mine[i * size : (i + 1) * size]) if mine[i * size :] else None
            for i in range(count)
        ]

    def _fixed_producer(self, data_cfg=None, for_eval: bool = False) -> Producer:
        """Token rows or preference pairs from ``data.path`` (or ``data_cfg``, e.g. the
        held-out split), whichever the objective trains on."""
        from pt_train.data import load_pairs, load_rows
        from pt_train.producers import pairs_producer, rows_producer

        cfg = self.cfg.model_copy(update={"data": data_cfg}) if data_cfg is not None else self.cfg
        sampling = {
            "global_batch_size": cfg.training.global_batch_size,
            "micro_batch_size": cfg.training.micro_batch_size,
            "seed": cfg.training.seed,
            "shuffle": cfg.data.shuffle,
            "rank": self.env.rank,
            "world_size": self.env.world_size,
        }
        common = {
            "pad_token_id": self.tokenizer.pad_token_id,
            "attn_implementation": cfg.model.attn_implementation,
        }
        # set: __init__ refuses a run without data.path unless other rows are given
        path = cast(str, cfg.data.path)
        if self.needs.data == "tokens":
            rows = load_rows(cfg.data, path, self.tokenizer, self._vocab_size())
            return rows_producer(rows, **common, **sampling)
        if self.needs.data == "rollouts":
            from pt_train.producers.rollouts import load_rollouts, rollouts_producer

            samples = load_rollouts(cfg.data, path, self.needs.columns)
            return rollouts_producer(
                samples,
                **common,
                max_seq_length=cfg.data.max_seq_length,
                shared_prompt=cfg.data.shared_prompt,
                **sampling,
            )
        pairs = load_pairs(cfg.data, path, self.tokenizer, self._vocab_size())
        producer = pairs_producer(
            pairs, **common, max_seq_length=cfg.data.max_seq_length, **sampling
        )
        reference_cfg = self.needs.frozen_model
        if self.needs.frozen == "logps" and reference_cfg and reference_cfg.precompute:
            table = self._precomputed_reference(pairs, producer, "eval" if for_eval else None)
            producer = pairs_producer(
                pairs,
                **common,
                max_seq_length=cfg.data.max_seq_length,
                reference_logps=table,
                **sampling,
            )
        return producer

    def _vocab_size(self) -> int:
        """The embedding rows of the model the run trains (it may pad the tokenizer's)."""
        m = self.cfg.model
        if m.init is not None:
            return m.init.vocab_size or len(self.tokenizer)
        from transformers import AutoConfig

        assert m.name_or_path is not None  # without init (the config's check)
        try:
            config = AutoConfig.from_pretrained(m.name_or_path)
        except (OSError, ValueError):
            return len(self.tokenizer)  # the model load reports what is wrong
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return int(getattr(text, "vocab_size", None) or len(self.tokenizer))

    def _load_reference(self):
        from pt_train.reference import load_frozen

        reference_cfg = self.needs.frozen_model
        log.info(
            "frozen %s model: %s",
            self.needs.frozen_as,
            reference_cfg.path or "the policy's starting weights (a frozen copy)",
        )
        return load_frozen(
            self.cfg.model,
            reference_cfg,
            self.tokenizer,
            dtype=self.model_dtype,
            seed=self.cfg.training.seed,
            device=self.device,
            zero_stage=self.zero_stage,
            fused=self.fused_ops,
        )

    def _precomputed_reference(self, pairs, producer, part: str | None = None):
        """Reference log-probs of every pair, stored in the run directory (computed once)."""
        import gc

        from pt_train.reference import precompute_pair_logps, stored_pair_logps

        reference_cfg = self.needs.frozen_model
        source = reference_cfg.path or f"policy-start:{config_hash(self.cfg.model)}"
        root = self.run_dir / "reference" / (part or "")
        table = stored_pair_logps(root, pairs, source)
        if table is not None:
            log.info("reference log-probs from %s/reference (not loading it)", self.run_dir)
            return table
        model = self._load_reference()
        table = precompute_pair_logps(
            model,
            pairs,
            producer.to_batch,
            root,
            self.env,
            micro_pairs=self.cfg.training.micro_batch_size,
            chunk_mb=self.cfg.training.logits_chunk_mb,
            device=self.device,
            dtype=self.model_dtype,
            source=source,
        )
        del model
        gc.collect()
        return table

    def _build_engine(self) -> None:
        cfg = self.cfg
        if cfg.model.fused_ops and not self.fused_ops:
            log.info("model.fused_ops is not applied under ZeRO-3 (see pt_train.fused)")
        model = load_model(
            cfg.model,
            self.tokenizer,
            dtype=torch.float32,
            seed=cfg.training.seed,
            fused_ops=self.fused_ops,
            lora=cfg.model.lora,  # LoRA: only the adapters require a gradient
            device=self.device,  # QLoRA: where the base is quantized
            compute_dtype=self.model_dtype,
        )
        # Dropout draws from torch's global generator, whose state loading may leave
        # different from run to run (a 4-bit load through bitsandbytes does): training.seed
        # sets it here, and a resume from the checkpoint's RNG state.
        torch.manual_seed(cfg.training.seed)
        install_token_head(model)
        self.chat_format.apply_to(hf_model(model))
        decay, no_decay = [], []
        for p in model.parameters():
            if p.requires_grad:
                (decay if p.ndim >= 2 else no_decay).append(p)
        t = cfg.training
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": t.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=lr_at(0, t, self.total_steps),
            betas=(t.adam_beta1, t.adam_beta2),
            eps=t.adam_epsilon,
        )
        if use_plain_engine(cfg, self.env.world_size, self.bf16):
            self.engine = PlainEngine(model.to(self.device), optimizer, self.grad_accum)
            self.optimizer = optimizer
            return
        if self.device.type == "cpu":
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed

        self.engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=deepspeed_config(cfg, self.grad_accum, self.bf16),
        )
        assert ds_optimizer is not None  # given one, DeepSpeed returns it (or its wrapper)
        self.optimizer = ds_optimizer

    # ------------------------------------------------------------------ one step

    def row_lengths(self, batch: Batch) -> list[int] | None:
        return self.policy.row_lengths(batch)

    def forward_loss(self, batch: Batch):
        """The objective's :class:`LossOutput` of one micro-batch: the policy through the
        token head, and the reference where the objective compares with one."""
        batch = batch.to(self.device)
        inputs = batch.model_inputs(self.device, self.model_dtype)
        chunk_mb = self.cfg.training.logits_chunk_mb
        request = HeadRequest(
            targets=batch.targets,
            chunk_mb=chunk_mb,
            temperature=self.policy.temperature,
            row_lengths=self.row_lengths(batch),
            **self.objective.head(batch),
        )
        reference_out = None
        if self.reference is not None and self.needs.frozen == "logps":
            if "ref_logps" not in batch.data:
                with torch.no_grad():
                    reference_out = self.reference(
                        **inputs,
                        head=HeadRequest(
                            targets=batch.targets,
                            chunk_mb=chunk_mb,
                            temperature=request.temperature,
                            row_lengths=self.row_lengths(batch),
                        ),
                    )
        elif self.reference is not None and self.needs.frozen == "dense":
            request.dense = self.objective.dense()
            request.dense_hidden = other_model_hidden(
                self.reference, inputs, batch.targets, self.row_lengths(batch)
            )
            request.dense_head = install_token_head(self.reference).lm_head
        out = self.engine(**inputs, head=request)
        return self.objective.loss(out, batch, reference_out)

    def forward_backward_step(self, batch: Batch, loss_scale: float):
        """Forward one micro-batch, back-propagate ``loss_sum * loss_scale``; return the
        detached :class:`LossOutput`."""
        loss = self.forward_loss(batch)
        self.engine.backward(loss.sum * loss_scale, scale_wrt_gas=False)
        loss.sum = loss.sum.detach()
        return loss

    def train_step(
        self, step: int, stop: StopRequest | None = None, batches: list[Batch] | None = None
    ) -> dict:
        """One optimizer step over this rank's micro-batches; returns its metrics."""
        start = time.perf_counter()
        if batches is None:
            batches = self.producer.micro_batches(step)
        global_count, global_tokens, global_trained = all_reduce(
            [
                sum(self.objective.count(b) for b in batches),
                sum(b.tokens for b in batches),
                sum(b.num_trained for b in batches),
            ],
            self.device,
        )
        loss_scale = self.env.world_size / max(global_count, 1.0)

        lr = lr_at(step, self.cfg.training, self.total_steps)
        # DeepSpeed's optimizer wrappers have the wrapped optimizer's param_groups
        for group in self.optimizer.param_groups:  # pyright: ignore[reportAttributeAccessIssue]
            group["lr"] = lr

        loss_total = torch.zeros((), dtype=torch.float64, device=self.device)
        metric_sums: dict[str, list[float]] = {}
        for i, batch in enumerate(batches):
            loss = self.forward_backward_step(batch, loss_scale)
            loss_total += loss.sum.double()
            for name, (value, count) in loss.metrics.items():
                acc = metric_sums.setdefault(name, [0.0, 0.0])
                acc[0] += float(value)
                acc[1] += float(count)
            if i < len(batches) - 1:
                self.engine.step()  # not a boundary: DeepSpeed only counts the micro-step
        local_finite = bool(torch.isfinite(loss_total))
        names = sorted(metric_sums)
        # The second all-reduce: loss, NaN flag, stop request and the metrics' sums.
        reduced = all_reduce(
            [
                loss_total.item() if local_finite else 0.0,
                0.0 if local_finite else 1.0,
                1.0 if stop is not None and stop.requested else 0.0,
                *(v for n in names for v in metric_sums[n]),
            ],
            self.device,
        )
        loss_sum_all, nonfinite, stop_all = reduced[:3]
        sums = {n: (reduced[3 + 2 * i], reduced[4 + 2 * i]) for i, n in enumerate(names)}
        finite = not nonfinite
        if self.alarms.bounds:
            figures = {n: t / c for n, (t, c) in sums.items() if c}
            figures["loss"] = loss_sum_all / max(global_count, 1.0) if finite else float("nan")
            try:
                self.alarms.check(figures, step + 1, before_update=True)
            except AlarmTripped:
                self.engine.zero_grad()
                if self.env.is_main:
                    self.metrics.log({"step": step + 1, **figures, "skipped": True})
                    self.metrics.close()
                raise

        grad_norm = None
        if not finite:
            # Drop this step's gradients so the update below changes nothing. (ZeRO
            # stages also detect the non-finite gradient norm and skip by themselves.)
            if self.zero_stage == 0:
                self.engine.zero_grad()
        elif self.zero_stage == 0 and self.cfg.training.max_grad_norm > 0:
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(
                    # DeepSpeed's engine.module is typed as Tensor | Module (Module.__getattr__)
                    self.engine.module.parameters(),  # pyright: ignore[reportAttributeAccessIssue]
                    self.cfg.training.max_grad_norm,
                )
            )
        self.engine.step()
        if grad_norm is None and finite:
            norm = self.engine.get_global_grad_norm()
            grad_norm = float(norm) if norm is not None else None
        if finite:
            self.objective.end_step(sums)
        producer_metrics = self.producer.after_step(step)

        elapsed = time.perf_counter() - start
        if finite:
            self.trained_tokens += int(global_trained)
        record = {
            "step": step + 1,
            "loss": loss_sum_all / max(global_count, 1.0) if finite else float("nan"),
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": int(global_tokens),
            "step_trained_tokens": int(global_trained),
            "trained_tokens": self.trained_tokens,
            "tokens_per_s": global_tokens / elapsed,
            "step_time_s": elapsed,
            "peak_memory_gb": peak_memory_gb(),
            "skipped": not finite,
        }
        for name, (total, count) in sums.items():
            record[name] = total / count if count else None
        record.update(producer_metrics)
        if self.peak_flops:
            record["mfu"] = (
                self.flops_per_token
                * global_tokens
                / elapsed
                / (self.peak_flops * self.env.world_size)
            )
        record["_stop"] = bool(stop_all)
        return record

    # ------------------------------------------------------------------ loop

    def trainer_state(self) -> dict:
        return {
            "trained_tokens": self.trained_tokens,
            "consecutive_nonfinite": self.nonfinite.consecutive,
            "total_steps": self.total_steps,
            "world_size": self.env.world_size,
            "config_hash": config_hash(self.cfg),
            "objective": self.objective.state_dict(),
            "producer": self.producer.state_dict(),
        }

    def save_full(self) -> Path:
        return ckpt.save_full(
            self.engine,
            self.run_dir,
            self.step,
            self.trainer_state(),
            self.env,
            self.cfg.training.save_total_limit,
            background=self.background,
        )

    def save_inference(self) -> Path:
        return ckpt.save_inference(
            self.engine,
            self.chat_format.checkpoint_tokenizer,
            self.run_dir,
            self.step,
            self.env,
            self.zero_stage,
        )

    def train(self, stop: StopRequest, watchdog: Watchdog | None = None) -> TrainResult:
        """Run the remaining steps; ``stop`` is the signal flag and ``watchdog`` the hang
        watchdog (both installed by :func:`train`)."""
        t = self.cfg.training
        # resilience: the watchdog's beat after each step, and a test hook before it
        watchdog = watchdog or Watchdog(self.run_dir, self.env.rank, None)
        stall = TestStall.from_env(self.env.rank, self.run_dir)
        if self.step >= self.total_steps:
            path = self.run_dir / "inference" / f"step-{self.step}"
            if not path.exists():
                path = self.save_inference()
            return TrainResult(self.run_dir, self.step, self.total_steps, path, False)
        log.info(
            "training %s (%s): %d rows, %d steps, global batch %d = micro %d x accum %d x ranks %d",
            self.run_dir,
            self.cfg.objective.name,
            self.producer.num_rows,
            self.total_steps,
            t.global_batch_size,
            t.micro_batch_size,
            self.grad_accum,
            self.env.world_size,
        )
        self.engine.train()
        bar = progress() if self.env.is_main else None
        stopped = False
        alarms_unchecked = bool(self.alarms.bounds)
        with bar or nullcontext():
            task = (
                bar.add_task("train", total=self.total_steps, completed=self.step) if bar else None
            )
            while self.step < self.total_steps:
                stall("step", self.step)
                record = self.train_step(self.step, stop)
                self.step += 1
                stopped = record.pop("_stop")
                if record["skipped"]:
                    log.warning("step %d: loss is NaN/inf; update skipped", self.step)
                if self.nonfinite.update(not record["skipped"]):
                    raise TrainingAborted(
                        f"the loss was NaN/inf for {self.nonfinite.consecutive} steps in a row "
                        f"(up to step {self.step}); stopping",
                        hint="lower training.learning_rate, check the data for empty or broken "
                        "rows, or raise training.max_consecutive_nan",
                    )
                self.alarms.check(record, self.step, before_update=False)
                # every bounded figure is one the run logs (the online loop's round figures
                # come with the first step of a round)
                if alarms_unchecked and ("round" not in record or "completion_length" in record):
                    self.alarms.check_known(record)
                    alarms_unchecked = False
                evaluated = False
                if self.evaluator is not None and self.evaluator.due(self.step, self.total_steps):
                    evaluated = True
                    record.update(self.evaluator.run())
                if evaluated or self.step % t.logging_steps == 0 or self.step == self.total_steps:
                    self.metrics.log(record)
                if bar is not None and task is not None:  # task is set with bar
                    bar.update(task, completed=self.step, description=f"loss {record['loss']:.4f}")
                done = self.step == self.total_steps
                if stopped or done or (t.save_steps and self.step % t.save_steps == 0):
                    self.save_full()
                if done or (t.inference_steps and self.step % t.inference_steps == 0):
                    self.save_inference()
                watchdog.beat(self.step)
                if stopped:
                    break
        if self.background is not None:
            self.background.finish()  # the last checkpoint is complete before we return
        self.metrics.close()
        if stopped:
            if not stop.interrupted:  # Ctrl-C: the CLI's own line says where it resumes
                log.warning(
                    "stopped by signal %s at step %d; checkpoint saved, rerun to resume",
                    signal.Signals(stop.signum).name,
                    self.step,
                )
            return TrainResult(self.run_dir, self.step, self.total_steps, None, True)
        path = self.run_dir / "inference" / f"step-{self.step}"
        return TrainResult(self.run_dir, self.step, self.total_steps, path, False)


def train(
    cfg: TrainConfig,
    *,
    data_path: str | Path | None = None,
    force_resume: bool = False,
    producer: Producer | None = None,
):
    """Train (or resume) ``cfg``'s run in this process, as one rank of the job."""
    if data_path is not None:
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": str(data_path)})})
    if cfg.data.path is not None and not Path(cfg.data.path).exists():
        raise InputError(f"data.path {cfg.data.path}: no such file or directory")
    if cfg.rollout.prompts is not None and not Path(cfg.rollout.prompts).exists():
        raise InputError(f"rollout.prompts {cfg.rollout.prompts}: no such file or directory")
    # Signals are caught from the start: one that arrives while the model loads stops
    # the run after its first step, with a checkpoint, like any other.
    # A plain process sets up a one-rank job in its environment (pt_train.distributed);
    # put it back afterwards, so processes it starts later are not taken for ranks.
    # The watchdog starts before the model loads: its first window covers the set-up.
    saved = {k: os.environ.get(k) for k in RANK_VARIABLES}
    launched = launched_env()
    watchdog = Watchdog(
        cfg.run_dir,
        launched.rank if launched is not None else 0,
        cfg.training.watchdog_minutes,
        cfg.training.watchdog_first_step_minutes,
    )
    try:
        with StopRequest() as stop, watchdog:
            trainer = Trainer(cfg, force_resume=force_resume, producer=producer)
            try:
                return trainer.train(stop, watchdog)
            finally:
                trainer.producer.close()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
