"""The online loop as a producer: rounds of generation from the policy being trained.

Round ``r`` takes its prompts (:mod:`.prompts`), has a generator (:mod:`.generators`)
sample ``samples_per_prompt`` completions of each, scored by a teacher and rewarded by
the run's reward component as the objective declares
(:class:`pt_train.objectives.Needs`), completed by the objective (:mod:`.build`), and
feeds the trainer ``updates_per_round`` optimizer steps of ``global_batch_size`` rows
(mini-batches), ``epochs_per_round`` times over (PPO's epochs, in the same order each
time). With ``U = updates_per_round x epochs_per_round`` optimizer steps per round, step
``s`` trains round ``s // U``; the steps after a round's first take their ratio against
the log-probs of the weights the round started from. When rounds are asked for, and what
is done with a stale one, is the schedule's (:mod:`.schedule`); how new weights reach the
generator is the push's (:mod:`.push`).

Every sample records ``weight_version``, the number of optimizer updates behind the
weights that generated it, and ``staleness``: the updates between those weights and the
weights its round starts training from; with in-flight updates these are of its first
token, and ``token_weight_version`` gives every token's (metrics
``token_staleness_mean``/``token_staleness_max``, ``samples_spanning_versions``). Rank 0
makes each round and shares it with the other ranks in memory; it is written to
``<run_dir>/rounds/round-NNNNNN/`` (:mod:`.rounds`) before it is trained on, so a resumed
run trains on the rounds it finds there instead of generating them again, and a full
checkpoint first makes the rounds in flight: with ``seeding: per_sample`` a resumed run
ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from pt_core.log import get_logger
from pt_train.batch import Batch
from pt_train.distributed import DistEnv, barrier
from pt_train.policy import Policy
from pt_train.producers.base import Producer
from pt_train.producers.online.build import RoundBuilder
from pt_train.producers.online.generators import (
    Generation,
    GeneratorContext,
    make_generator,
    score_request,
)
from pt_train.producers.online.prompts import PromptStream, SampleRequest
from pt_train.producers.online.push import CurrentWeights
from pt_train.producers.online.rounds import RoundStore, per_completion_token, round_figures
from pt_train.producers.online.schedule import Schedule, round_layout
from pt_train.producers.rollouts import (
    SEQUENCE_COLUMNS,
    TOKEN_COLUMNS,
    rollout_batch,
    sample_from_row,
)

log = get_logger(__name__)


class OnlineProducer(Producer):
    def __init__(self, cfg, objective, env: DistEnv, tokenizer, policy: Policy):
        self.cfg = cfg
        self.rollout = r = cfg.rollout
        self.objective = objective
        self.needs = objective.needs
        self.env = env
        self.tokenizer = tokenizer
        self.policy = policy
        training = cfg.training
        self.minibatches, self.updates = round_layout(cfg)
        self.rows_per_step = training.global_batch_size
        self.prompts_per_round = self.rows_per_step * self.minibatches // r.samples_per_prompt
        self.num_rows = self.rows_per_step * training.max_steps  # rows trained, epochs counted
        self.num_tokens = 0
        self.micro_batch_size = training.micro_batch_size
        self.schedule = Schedule(r, self.updates, training.max_steps // self.updates)
        self.store = RoundStore(cfg.run_dir, env)
        self.prompts = PromptStream(r, tokenizer, self.prompts_per_round)
        self.weights = CurrentWeights(policy, tokenizer)
        score = score_request(self.needs)
        self.context = GeneratorContext(cfg, self.needs, tokenizer, self.weights,
                                        self._sampling(), score)  # fmt: skip
        # episodes of an environment (rank 0's: it makes the rounds), whose rewards are
        # the environment's, plus the reward component's where environment.grade says so
        self.episodes = None
        if cfg.environment.name is not None and env.is_main:
            from pt_train.producers.online.episodes import EpisodeRounds

            self.episodes = EpisodeRounds(cfg, tokenizer)
        self.rewards = None
        if self.needs.reward and (cfg.environment.name is None or cfg.environment.grade):
            from pt_train.rewards import Rewards

            self.rewards = Rewards(cfg.reward)
        self.builder = RoundBuilder(r, objective, self.rewards, tokenizer, self.prompts,
                                    self.prompts_per_round, score)  # fmt: skip
        self.generator = None  # rank 0's, built at the first round it makes
        # round -> the generator's key (or, for episodes, the job of their turns)
        self.pending: dict[int, Any] = {}
        self.dropped_stale = 0
        self.version = 0  # optimizer updates so far
        if r.generator == "server" and r.server_addresses is not None and env.is_main:
            # before the run directory is written and the model loaded: a process that
            # does not fit is one error at once, not one after the model's load
            from pt_train.producers.online.generators.listening import check_early

            check_early(self.context)

    def _sampling(self) -> dict:
        """How every sample of the run is drawn, as it crosses a socket."""
        from pt_rollout.prompts import stop_token_ids

        r, model = self.rollout, self.cfg.model
        # fixed for the run (its tokenizer, template and model files): read once
        source = model.name_or_path if model.name_or_path is not None else model.tokenizer_path
        return {
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "max_tokens": r.max_tokens,
            "stop": tuple(r.stop),
            "stop_token_ids": stop_token_ids(source, self.tokenizer, template=r.template),
            "logprobs": True,
            "logprobs_mode": self.needs.logprobs_mode,
            "logprobs_top_k": self.needs.student_top_k,
            "seeding": r.seeding,
        }

    # ------------------------------------------------------------------ the trainer's side

    def micro_batches(self, step: int) -> list[Batch]:
        self.version = step
        round_index, k = divmod(step, self.updates)
        j = k % self.minibatches  # this epoch's mini-batch
        rows = self._round(round_index)
        if self.needs.old_logps:
            self._old_logps(round_index, rows)
        self._step_rows = rows[j * self.rows_per_step : (j + 1) * self.rows_per_step]
        return self._batches(self._mine(self._step_rows), f"round {round_index}")

    def _mine(self, step_rows: list[dict]) -> list[dict]:
        per_rank = len(step_rows) // self.env.world_size
        return step_rows[self.env.rank * per_rank : (self.env.rank + 1) * per_rank]

    def _batches(self, rows: list[dict], where: str) -> list[Batch]:
        columns = [c for c in (*TOKEN_COLUMNS, *SEQUENCE_COLUMNS) if c in rows[0]]
        samples = [sample_from_row(row, f"{where} row {i}", columns) for i, row in enumerate(rows)]
        data = self.cfg.data
        pack = (
            data.max_seq_length
            if self.cfg.model.attn_implementation == "flash_attention_2"
            else None
        )
        return [
            rollout_batch(
                samples[i : i + self.micro_batch_size],
                self.tokenizer.pad_token_id,
                self.cfg.model.attn_implementation,
                pack,
                data.max_seq_length if data.shared_prompt else None,
            )
            for i in range(0, len(samples), self.micro_batch_size)
        ]

    def _old_logps(self, index: int, rows: list[dict]) -> None:
        """The log-probs of this rank's rows under the weights the round starts from, for
        the updates after the first: computed before the round's first update, kept with
        the rows, and written for a run resumed mid-round."""
        mine = [row for j in range(self.minibatches)
                for row in self._mine(rows[j * self.rows_per_step : (j + 1) * self.rows_per_step])]  # fmt: skip
        if all("old_logprobs" in row for row in mine):
            return
        values = self.store.load_old_logps(index)
        if values is None:
            parts: list[torch.Tensor] = []
            for batch in self._batches(mine, f"round {index}"):
                logps = self.policy.token_logps(batch)
                sizes = torch.bincount(batch.token_sequence, minlength=batch.num_sequences)
                parts += list(torch.split(logps, sizes.tolist()))
            self.store.save_old_logps(index, parts)
            values = [part.numpy() for part in parts]
        for row, value in zip(mine, values, strict=True):
            row["old_logprobs"] = per_completion_token(value, row.get("completion_mask"))

    def after_step(self, step: int) -> dict:
        rows = self._step_rows
        staleness = np.array([row["staleness"] for row in rows], dtype=np.float64)
        metrics = {
            "round": step // self.updates,
            "staleness_mean": float(staleness.mean()),
            "staleness_min": float(staleness.min()),
            "staleness_max": float(staleness.max()),
            "dropped_stale": self.dropped_stale,
        }
        if "token_weight_version" in rows[0]:  # in-flight updates: versions per token
            start = (step // self.updates) * self.updates
            tokens = np.array(
                [start - v for row in rows for v in row["token_weight_version"]], dtype=np.float64
            )
            metrics["token_staleness_mean"] = float(tokens.mean()) if tokens.size else 0.0
            metrics["token_staleness_max"] = float(tokens.max()) if tokens.size else 0.0
            metrics["samples_spanning_versions"] = float(
                np.mean([len(set(row["token_weight_version"])) > 1 for row in rows])
            )
        if step % self.updates == 0:  # the round's own figures, logged with its first step
            metrics.update(self.store.meta.get(step // self.updates, {}).get("metrics", {}))
        return metrics

    def state_dict(self) -> dict:
        """Called as a full checkpoint is saved: the rounds in flight are waited for and
        written to the run directory first, so a run resumed from this checkpoint trains on
        the samples an uninterrupted run gets (drawn with the weights of when they were
        asked for), not on new ones drawn with the weights it resumes with."""
        if self.env.is_main:
            for index in sorted(self.pending):
                self.store.write(index, *self._make_round(index, keep_ahead=False))
        return {"dropped_stale": self.dropped_stale}

    def load_state_dict(self, state: dict) -> None:
        self.dropped_stale = int(state.get("dropped_stale", 0))

    def close(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if self.episodes is not None:
            self.episodes.environment.close()
        if self.generator is not None:
            self.generator.close()
        self.generator = None

    # ------------------------------------------------------------------ rounds

    def _round(self, index: int) -> list[dict]:
        """The rows of round ``index``: in memory, made now (rank 0), or read back from
        the run directory (a resumed run); every rank gets rank 0's."""
        if index in self.store.rows:
            return self.store.rows[index]
        self.store.forget_before(index)
        barrier()  # every rank decides on the same files
        missing = not self.store.written(index)
        if missing and self.policy.zero_stage == 3 and self.rollout.generator == "server":
            # ZeRO-3 partitions the weights: gathering them for the generator takes every
            # rank (the colocated engine, on the one rank, takes them a group at a time)
            self.weights.gathered = self.policy.state_dict()
        made = None
        if self.env.is_main:
            if missing:
                made = self._make_round(index)
                self.store.write(index, *made)
            elif self.schedule.overlaps:
                # A round read back from the run directory (written before the run stopped):
                # ask for the rounds the schedule wants in flight from here.
                self._top_up(index)
                if self.schedule.kind == "async":
                    self._top_up(index + 1)
            made = self.store.take(index)
        self.weights.gathered = None
        rows = self.store.share(index, made)
        self.prompts.extra_position = max(
            self.prompts.extra_position, self.store.meta[index].get("extra_position", 0)
        )
        start_version = index * self.updates
        for row in rows:
            row["staleness"] = start_version - row["weight_version"]
        return rows

    def _make_round(self, index: int, *, keep_ahead: bool = True) -> tuple[list[dict], dict]:
        """Rank 0: round ``index``'s rows and meta."""
        started = time.perf_counter()
        made = self._generation(index, keep_ahead=keep_ahead)
        wait_s = time.perf_counter() - started
        rows = self.builder.rows(index, self.prompts.round(index), made)
        metrics = self.builder.prepare(rows)
        if self.needs.regroup_tries:
            rows, dynamic = self.builder.dynamic_sampling(
                index, rows, self.needs.regroup_tries, self._generate_now
            )
            metrics.update(dynamic)
        metrics.update(round_figures(rows))
        assert self.generator is not None  # made it
        metrics.update({
            "generate_s": round(made.generate_s, 3),
            "score_s": round(made.score_s, 3),
            "wait_s": round(wait_s, 3),
            **self.generator.round_metrics(),
            "completion_tokens_mean": float(np.mean([len(r["completion_token_ids"]) for r in rows])),
        })  # fmt: skip
        meta = {
            "round": index,
            "weight_version": made.version,
            "extra_position": self.prompts.extra_position,
            "metrics": metrics,
        }
        return rows, meta

    def _generation(self, index: int, *, keep_ahead: bool) -> Generation:
        """Round ``index`` from the generator: asked for now, or earlier as the schedule
        wants, and asked for again while it comes back too stale."""
        generator = self._generator()
        if keep_ahead:
            self._top_up(index)
        if self.schedule.in_flight:  # the newest weights reach the round while it is generated
            generator.push(self.version)
        while True:
            made = self._wait(generator, self.pending.pop(index))
            if not self.schedule.drops(index, made.version):
                break
            self.dropped_stale += 1
            log.info(
                "round %d was generated %d updates ago (> rollout.max_staleness=%d): "
                "generating it again",
                index, self.schedule.staleness(index, made.version), self.schedule.max_staleness,
            )  # fmt: skip
            generator.push(self.version)
            self.pending[index] = self._submit(generator, self.prompts.round(index))
        if self.schedule.kind == "async" and keep_ahead:
            self._top_up(index + 1)  # keep the generator busy as far as staleness allows
        return made

    def _top_up(self, current: int) -> None:
        """Ask for the rounds the schedule wants in flight now, the current weights pushed
        first where they changed, so a request is sampled with the newest ones."""
        todo = [
            w
            for w in self.schedule.wanted(current, self.version)
            if w not in self.pending and not self.store.has(w)
        ]
        if not todo:
            return
        generator = self._generator()
        generator.push(self.version)
        for w in todo:
            self.pending[w] = self._submit(generator, self.prompts.round(w))

    def _generate_now(self, requests: list[SampleRequest]) -> Generation:
        """Generate (and score) ``requests`` at once with the current weights."""
        generator = self._generator()
        generator.push(self.version)
        return self._wait(generator, self._submit(generator, requests))

    def _submit(self, generator, requests: list[SampleRequest]):
        """Ask for ``requests``: their completions, or their episodes' first turns."""
        if self.episodes is not None:
            return self.episodes.submit(generator, requests)
        return generator.submit([s.request for s in requests])

    def _wait(self, generator, pending) -> Generation:
        """What was asked for: the completions, or the episodes played to their end."""
        if self.episodes is not None:
            return self.episodes.finish(pending, generator, lambda: self.version)
        return generator.wait(pending)

    def _generator(self):
        if self.generator is None:
            self.generator = make_generator(self.context)
        return self.generator
