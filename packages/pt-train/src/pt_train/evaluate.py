"""Evaluation during training: the objective on held-out rows, and answers to a prompt set.

    eval:
      steps: 50                 # every 50 optimizer steps, and after the last
      split: validation         # the held-out rows pt-data builds (validation_split > 0)
      max_rows: null
      generate:                 # optional: answers graded by pt-eval
        prompts: data/test-prompts
        max_prompts: 200
        max_tokens: 256
        temperature: 0.0        # greedy; or sampled: top_p, top_k, seed, seeding as anywhere

``eval_loss`` is the objective's loss (and ``eval/<metric>`` its metrics: DPO's reward
accuracy, say) over every held-out row, normalised as in training, without gradients, the
rows shared between ranks. It needs rows of the kind the objective trains on (token rows,
pairs); objectives that train on their own samples (opd, grpo) have none and log only the
generation eval. ``eval_accuracy`` (and ``eval_no_answer``) are pt-eval's grades of the
policy's answers to the prompt set (greedy unless ``temperature`` > 0), generated in-process with the HF engine on
rank 0 (the other ranks wait). Both are logged with the step in ``metrics.jsonl``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from pt_core.errors import ConfigError
from pt_core.log import get_logger
from pt_train.distributed import all_reduce, barrier

log = get_logger(__name__)


class HeldOut:
    """The held-out rows as this rank's micro-batches (``batches()``: every rank the same
    number, None where a rank has fewer rows) and the objective's loss of one
    (``forward_loss``): the trainer's, as it trains."""

    def __init__(self, batches: Callable[[], list], forward_loss: Callable):
        self._make = batches
        self._batches: list | None = None
        self.forward_loss = forward_loss

    def batches(self) -> list:
        if self._batches is None:
            self._batches = self._make()
        return self._batches


class Evaluator:
    """``policy``: the policy being trained (:class:`pt_train.policy.Policy`); ``held_out``:
    the held-out rows and the loss of the objective, where it trains on rows or pairs."""

    def __init__(self, cfg, env, policy, tokenizer, held_out: HeldOut | None = None):
        self.cfg = cfg.eval
        self.model_cfg = cfg.model
        self.env = env
        self.policy = policy
        self.tokenizer = tokenizer
        self.held_out = held_out
        self._prompts = None
        self._engine = None

    # ------------------------------------------------------------------ held-out loss

    def held_out_loss(self) -> dict:
        assert self.held_out is not None  # run() asks for it only then
        total, count = 0.0, 0.0
        sums: dict[str, list[float]] = {}
        module = self.policy.engine.module
        module.eval()
        try:
            with torch.no_grad():
                for batch in self.held_out.batches():
                    if batch is None:  # a rank with fewer rows keeps step with the others
                        continue
                    loss = self.held_out.forward_loss(batch)
                    total += float(loss.sum)
                    count += float(loss.count)
                    for name, (value, n) in loss.metrics.items():
                        acc = sums.setdefault(name, [0.0, 0.0])
                        acc[0] += float(value)
                        acc[1] += float(n)
        finally:
            self.policy.engine.train()
        names = sorted(sums)
        reduced = all_reduce(
            [total, count, *(v for n in names for v in sums[n])], self.policy.device
        )
        out = {"eval_loss": reduced[0] / reduced[1] if reduced[1] else None}
        for i, name in enumerate(names):
            value, n = reduced[2 + 2 * i], reduced[3 + 2 * i]
            out[f"eval/{name}"] = value / n if n else None
        return out

    # ------------------------------------------------------------------ generation

    def generation_accuracy(self) -> dict:
        """Rank 0 answers the prompt set greedily with the policy; pt-eval grades them."""
        out: dict = {}
        if self.env.is_main:
            out = self._generate_and_grade()
        barrier()
        return out

    def _generate_and_grade(self) -> dict:
        from pt_eval.grade import GradeOptions, grade_rows
        from pt_rollout.columns import completion_text
        from pt_rollout.engines import Request, SamplingParams, sample_seed
        from pt_rollout.prompts import prompt_token_ids, prompts_path, read_prompts, stop_token_ids

        g = self.cfg.generate
        start = time.perf_counter()
        if self._prompts is None:
            rows = read_prompts(prompts_path(g.prompts, g.split))[: g.max_prompts]
            missing = [r.id for r in rows if g.answer_key not in r.columns]
            if missing:
                raise ConfigError(
                    f"eval.generate.prompts {g.prompts}: row {missing[0]!r} has no "
                    f"{g.answer_key!r} column to grade against",
                    hint="set eval.generate.answer_key to the gold answer's column",
                )
            ids = [
                prompt_token_ids(self.tokenizer, r.prompt, template=g.template, system=g.system)
                for r in rows
            ]
            self._prompts = (rows, ids)
        rows, ids = self._prompts
        if self._engine is None:  # under LoRA the adapted model, as peft runs it
            self._engine = self.policy.sampler(self.tokenizer)
        source = self.model_cfg.name_or_path or self.model_cfg.tokenizer_path
        params = SamplingParams(
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            max_tokens=g.max_tokens,
            seeding=g.seeding,
            stop_token_ids=stop_token_ids(source, self.tokenizer, template=g.template),
        )
        requests = [
            Request(i, sample_seed(g.seed, r.id, 0)) for r, i in zip(rows, ids, strict=True)
        ]
        completions = self._engine.generate(requests, params)
        graded, summary = grade_rows(
            [
                {"id": r.id, "completion": completion_text(self.tokenizer, c.token_ids, []),
                 "answer": r.columns[g.answer_key], "finish_reason": c.finish_reason}
                for r, c in zip(rows, completions, strict=True)
            ],
            GradeOptions(pred_key="completion", gold_key="answer", id_key="id"),
        )  # fmt: skip
        return {
            "eval_accuracy": summary["accuracy"],
            "eval_no_answer": summary.get("no_answer"),
            "eval_generate_s": round(time.perf_counter() - start, 3),
        }

    # ------------------------------------------------------------------ when

    def due(self, step: int, total: int) -> bool:
        return bool(self.cfg.steps) and (step % self.cfg.steps == 0 or step == total)

    def run(self) -> dict:
        out = {}
        if self.held_out is not None:
            out.update(self.held_out_loss())
        if self.cfg.generate.prompts is not None:
            out.update(self.generation_accuracy())
        return out
