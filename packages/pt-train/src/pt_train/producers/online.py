"""The online loop as a producer: rounds of generation from the policy being trained.

Round ``r`` takes ``prompts_per_round`` prompts (epochs of a seeded permutation, as for
fixed data), samples ``samples_per_prompt`` completions of each from the policy, has them
scored by a teacher and rewarded by the run's reward component, as the objective
declares (:class:`pt_train.objectives.Needs`), completed by the objective's
:meth:`~pt_train.objectives.Objective.prepare_round` (e.g. group advantages), and
feeds the trainer ``updates_per_round`` optimizer steps of ``global_batch_size`` rows
(mini-batches), ``epochs_per_round`` times over (PPO's epochs, in the same order each
time). With ``U = updates_per_round x epochs_per_round`` optimizer steps per round, step
``s`` trains round ``s // U``; the steps after a round's first take their ratio against
the log-probs of the weights the round started from.

Where the samples come from (``rollout.generator``):

- ``local``: the HF engine generates with the policy module itself, in the trainer's
  process, between steps; the weights are always the current ones (no copies);
- ``server``: a generator process (:mod:`pt_rollout.serve`, HF or vLLM, in its own
  environment if need be) that gets the policy's weights at every round start, written as
  safetensors to a directory in memory (``/dev/shm``) and loaded in place; its cost is the
  ``weight_push_s`` metric.

When (``rollout.schedule``):

- ``sync``: round r is generated when round r starts, with the weights of that moment;
- ``step_off: N``: round r+N is asked for when round r starts, so it is generated while
  round r trains (the first N+1 rounds with the starting weights);
- ``async``: the generator is kept busy with up to ``max_staleness // U`` rounds ahead,
  each asked for as soon as a place is free; a round whose staleness exceeds
  ``max_staleness`` is dropped and generated again (``stale: drop``, as TRL does, counted
  in ``dropped_stale``) or trained on anyway (``stale: keep``, as AsyncOPD does).

Every sample records ``weight_version``, the number of optimizer updates behind the
weights that generated it, and ``staleness``: the updates between those weights and the
weights its round starts training from (0 for ``sync``, ``N x U`` in the steady state of
``step_off``). Each round is written to ``<run_dir>/rounds/round-NNNNNN/rollouts.jsonl``
(and ``meta.json``) before it is trained on; a resumed run reads the rounds it finds there
instead of generating them again, and a full checkpoint first writes the rounds in flight
(``step_off``, ``async``), so with ``seeding: per_sample`` a resumed run ends with the weights
of an uninterrupted run.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from pt_core.errors import ConfigError
from pt_core.files import atomic_write_json, iter_rows, write_rows
from pt_core.log import get_logger
from pt_train.batch import Batch
from pt_train.data import StepSampler
from pt_train.distributed import DistEnv, barrier
from pt_train.producers.base import Producer
from pt_train.producers.rollouts import (
    SEQUENCE_COLUMNS,
    TOKEN_COLUMNS,
    rollout_batch,
    sample_from_row,
)

log = get_logger(__name__)


class OnlineProducer(Producer):
    def __init__(
        self,
        cfg,
        objective,
        env: DistEnv,
        tokenizer,
        *,
        policy: Callable[[], object],
        state_dict: Callable[[], dict | None],
        token_logps: Callable[[Batch], object] | None = None,
    ):
        from pt_rollout.prompts import prompts_path, read_prompts

        self.cfg = cfg
        self.rollout = r = cfg.rollout
        self.objective = objective
        self.needs = objective.needs
        self.rewards = None
        if self.needs.reward:
            from pt_train.rewards import Rewards

            self.rewards = Rewards(cfg.reward)
        self.env = env
        self.tokenizer = tokenizer
        self.policy = policy
        self.state_dict_of_policy = state_dict
        self.token_logps = token_logps
        self.run_dir = Path(cfg.run_dir)
        training = cfg.training
        if training.max_steps is None:
            raise ConfigError(
                "the online loop runs training.max_steps optimizer steps; other training "
                "lengths count fixed rows",
                hint="set training.max_steps (rounds = max_steps / (rollout.updates_per_round "
                "x rollout.epochs_per_round))",
            )
        self.minibatches = r.updates_per_round
        self.updates = r.updates_per_round * r.epochs_per_round  # optimizer steps per round
        if training.max_steps % self.updates:
            raise ConfigError(
                f"training.max_steps={training.max_steps} is not a whole number of rounds of "
                f"{self.updates} steps (rollout.updates_per_round={r.updates_per_round} x "
                f"rollout.epochs_per_round={r.epochs_per_round})",
                hint="make max_steps a multiple of updates_per_round x epochs_per_round",
            )
        self.rows_per_step = training.global_batch_size
        rows_per_round = self.rows_per_step * self.minibatches
        if rows_per_round % r.samples_per_prompt:
            raise ConfigError(
                f"a round of {rows_per_round} rows (training.global_batch_size x "
                f"rollout.updates_per_round) is not a whole number of prompts of "
                f"rollout.samples_per_prompt={r.samples_per_prompt}",
                hint="make global_batch_size x updates_per_round a multiple of samples_per_prompt",
            )
        self.prompts_per_round = rows_per_round // r.samples_per_prompt
        if r.prompts_per_round is not None and r.prompts_per_round != self.prompts_per_round:
            raise ConfigError(
                f"rollout.prompts_per_round={r.prompts_per_round}, but global_batch_size x "
                f"updates_per_round / samples_per_prompt = {self.prompts_per_round}",
                hint="leave prompts_per_round unset, or change global_batch_size",
            )
        source = prompts_path(r.prompts, r.split or "train")
        self.prompts = read_prompts(source, prompt_key=r.prompt_key, id_key=r.id_key)
        self.sampler = StepSampler(
            len(self.prompts), self.prompts_per_round, seed=r.seed, shuffle=True
        )
        # Prompts that top a round up after dynamic sampling dropped some: their own stream.
        self.extra_sampler = StepSampler(len(self.prompts), 1, seed=r.seed + 7919, shuffle=True)
        self._extra_position = 0
        self.num_rows = self.rows_per_step * training.max_steps  # rows trained, epochs counted
        self.num_tokens = 0
        self.micro_batch_size = training.micro_batch_size
        self._token_ids: dict[int, list[int]] = {}
        self._rounds: dict[int, list[dict]] = {}
        self._meta: dict[int, dict] = {}
        self._pending: dict[int, int] = {}  # round -> generator key (server)
        self._pending_version: dict[int, int] = {}
        self._generator = None
        self._teacher = None
        self._push_dirs: list[Path] = []
        self._push_keys: list[int] = []
        self._gathered: dict | None = None
        self._pushed_version: int | None = None
        self._push_seconds = 0.0
        self.dropped_stale = 0
        self._version = 0  # optimizer updates so far (set by the trainer on resume)

    # ------------------------------------------------------------------ the trainer's side

    def micro_batches(self, step: int) -> list[Batch]:
        self._version = step
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
        the updates after the first: computed before the round's first update and kept in
        the round's directory (a run resumed mid-round reads them)."""
        mine = [row for j in range(self.minibatches)
                for row in self._mine(rows[j * self.rows_per_step : (j + 1) * self.rows_per_step])]  # fmt: skip
        if all("old_logprobs" in row for row in mine):
            return
        path = self.round_dir(index) / f"old-logps-rank{self.env.rank}.json"
        if path.exists():
            values = json.loads(path.read_text())
        else:
            values = []
            for batch in self._batches(mine, f"round {index}"):
                logps = self.token_logps(batch)
                sizes = torch.bincount(batch.token_sequence, minlength=batch.num_sequences)
                values += [part.tolist() for part in torch.split(logps, sizes.tolist())]
            atomic_write_json(path, values)
        for row, value in zip(mine, values, strict=True):
            row["old_logprobs"] = value

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
        if step % self.updates == 0:  # the round's own figures, logged with its first step
            metrics.update(self._meta.get(step // self.updates, {}).get("metrics", {}))
        return metrics

    def state_dict(self) -> dict:
        """Called as a full checkpoint is saved: the rounds in flight are waited for and
        written to the run directory first, so a run resumed from this checkpoint trains on
        the samples an uninterrupted run gets (drawn with the weights of when they were
        asked for), not on new ones drawn with the weights it resumes with."""
        if self.env.is_main:
            for index in sorted(self._pending):
                self._generate_round(index, keep_ahead=False)
        return {"dropped_stale": self.dropped_stale}

    def load_state_dict(self, state: dict) -> None:
        self.dropped_stale = int(state.get("dropped_stale", 0))

    def close(self) -> None:
        if self.rewards is not None:
            self.rewards.close()
        if self._generator is not None and hasattr(self._generator, "close"):
            self._generator.close()
        self._generator = None
        for d in self._push_dirs:
            shutil.rmtree(d, ignore_errors=True)

    # ------------------------------------------------------------------ rounds

    def round_dir(self, index: int) -> Path:
        return self.run_dir / "rounds" / f"round-{index:06d}"

    def _round(self, index: int) -> list[dict]:
        """The rows of round ``index``: from memory, from its directory, or generated
        (rank 0; the others read what it wrote)."""
        if index in self._rounds:
            return self._rounds[index]
        for old in [k for k in self._rounds if k < index]:
            self._rounds.pop(old)
        barrier()  # every rank decides on the same files
        missing = not (self.round_dir(index) / "rollouts.jsonl").exists()
        if missing and self.cfg.deepspeed.zero_stage == 3:
            # ZeRO-3 partitions the weights: gathering them for the generator takes every rank
            self._gathered = self.state_dict_of_policy()
        if missing and self.env.is_main:
            self._generate_round(index)
        elif self.env.is_main and self.rollout.schedule != "sync":
            # A round read back from the run directory (written before the run stopped): ask
            # for the rounds the schedule wants in flight from here, as when it was generated.
            self._keep_ahead(index)
        self._gathered = None
        barrier()
        rows = list(iter_rows(self.round_dir(index) / "rollouts.jsonl"))
        meta = json.loads((self.round_dir(index) / "meta.json").read_text())
        self._extra_position = max(self._extra_position, meta.get("extra_position", 0))
        start_version = index * self.updates
        for row in rows:
            row["staleness"] = start_version - row["weight_version"]
        self._meta[index] = meta
        self._rounds[index] = rows
        return rows

    def _requests(self, index: int):
        """The (prompt, sample, request, group) of every sample of round ``index``."""
        return [
            triple
            for position in self.sampler.global_batch(index)
            for triple in self._prompt_requests(position, [index])
        ]

    @functools.cached_property
    def _stop_token_ids(self) -> tuple[int, ...]:
        """Fixed for the run (its tokenizer, template and model files): read once, not every
        round (the generation config is a file, the end of turn a template rendering)."""
        from pt_rollout.prompts import stop_token_ids

        return stop_token_ids(self._stop_source(), self.tokenizer, template=self.rollout.template)

    def _sampling(self) -> dict:
        r = self.rollout
        return {
            "temperature": r.temperature,
            "top_p": r.top_p,
            "top_k": r.top_k,
            "max_tokens": r.max_tokens,
            "stop": tuple(r.stop),
            "stop_token_ids": self._stop_token_ids,
            "logprobs": True,
            "logprobs_mode": self.needs.logprobs_mode,
            "logprobs_top_k": self.needs.student_top_k,
            "seeding": r.seeding,
        }

    def _stop_source(self) -> str:
        m = self.cfg.model
        return m.name_or_path if m.name_or_path is not None else m.tokenizer_path

    def _score_request(self) -> dict | None:
        """What the teacher must add to each round, or None (no teacher declared)."""
        teacher = self.needs.teacher
        if teacher is None:
            return None
        return {"top_k": teacher.top_k, "at_student_topk": teacher.at_student_topk}

    # ------------------------------------------------------------------ generation (rank 0)

    def _generate_round(self, index: int, *, keep_ahead: bool = True) -> None:
        started = time.perf_counter()
        if self.rollout.generator == "local":
            result = self._generate_local(index)
        else:
            result = self._generate_server(index, keep_ahead=keep_ahead)
        wait_s = time.perf_counter() - started
        requests = self._requests(index)
        rows = []
        for (prompt, sample, request, group), completion, score in zip(
            requests, result["completions"], result.get("scores") or [None] * len(requests),
            strict=True,
        ):  # fmt: skip
            rows.append(self._row(index, prompt, sample, request, group, completion, score, result))
        metrics = self._prepare(rows)
        if self.needs.regroup_tries:
            rows, dynamic_metrics = self._dynamic_sampling(index, rows, self.needs.regroup_tries)
            metrics.update(dynamic_metrics)
        metrics.update(round_figures(rows))
        metrics.update(
            {
                "generate_s": round(result.get("generate_s", 0.0), 3),
                "score_s": round(result.get("score_s", 0.0), 3),
                "wait_s": round(wait_s, 3),
                "weight_push_s": round(self._push_seconds, 3),
                "completion_tokens_mean": float(
                    np.mean([len(r["completion_token_ids"]) for r in rows])
                ),
            }
        )
        self._push_seconds = 0.0
        directory = self.round_dir(index)
        directory.mkdir(parents=True, exist_ok=True)
        write_rows(directory / "rollouts.jsonl", rows)
        atomic_write_json(
            directory / "meta.json",
            {
                "round": index,
                "weight_version": result["version"],
                "extra_position": self._extra_position,
                "metrics": metrics,
            },
        )

    def _dynamic_sampling(self, index: int, rows: list[dict], max_tries: int):
        """DAPO's dynamic sampling: drop the groups whose rewards are all equal (they carry
        no gradient) and top the round up with groups of further prompts, at most
        ``max_tries`` times; what is still missing is filled with dropped groups."""
        n = self.rollout.samples_per_prompt
        groups = [rows[i : i + n] for i in range(0, len(rows), n)]
        kept = [g for g in groups if not g[0]["group_all_equal"]]
        dropped = [g for g in groups if g[0]["group_all_equal"]]
        tries = 0
        while len(kept) < self.prompts_per_round and tries < max_tries:
            tries += 1
            need = self.prompts_per_round - len(kept)
            requests = []
            for _ in range(need):
                position = self.extra_sampler.global_batch(self._extra_position)[0]
                self._extra_position += 1
                requests += self._prompt_requests(position, ["extra", self._extra_position])
            result = self._run_now([request for _, _, request, _ in requests])
            extra = [
                self._row(index, prompt, sample, request, group, completion, score, result)
                for (prompt, sample, request, group), completion, score in zip(
                    requests, result["completions"], result.get("scores") or [None] * len(requests),
                    strict=True,
                )
            ]  # fmt: skip
            self._prepare(extra)
            for i in range(0, len(extra), n):
                group = extra[i : i + n]
                (dropped if group[0]["group_all_equal"] else kept).append(group)
        short = max(0, self.prompts_per_round - len(kept))
        final = kept[: self.prompts_per_round] + dropped[:short]
        sampled = [row["reward"] for group in kept + dropped for row in group]
        return [row for group in final for row in group], {
            # every sample of the round, dropped groups too: the policy's success rate on
            # fresh prompts, where "reward" is that of the groups trained on
            "sampled_reward": float(np.mean(sampled)),
            "dynamic_sampling_tries": tries,
            "dynamic_sampling_dropped": len(dropped) - short,
            "dynamic_sampling_short": short,
        }

    def _prepare(self, rows: list[dict]) -> dict:
        """Rewards (when declared), then the objective's columns of the whole round."""
        metrics = self.rewards(rows) if self.rewards is not None else {}
        self.objective.prepare_round(rows)
        return metrics

    def _prompt_requests(self, position: int, seed_key: list):
        """(prompt, sample, request, group) for every sample of the prompt at ``position``."""
        from pt_rollout.engines import Request
        from pt_rollout.generate import sample_seed
        from pt_rollout.prompts import prompt_token_ids

        prompt = self.prompts[position]
        if position not in self._token_ids:
            self._token_ids[position] = prompt_token_ids(
                self.tokenizer, prompt.prompt, template=self.rollout.template,
                system=self.rollout.system,
            )  # fmt: skip
        group = json.dumps([*seed_key, prompt.id], default=str)  # the samples of one prompt
        return [
            (prompt, sample, Request(self._token_ids[position],
                                     sample_seed(self.rollout.seed, [*seed_key, prompt.id], sample)),
             group)
            for sample in range(self.rollout.samples_per_prompt)
        ]  # fmt: skip

    def _run_now(self, requests) -> dict:
        """Generate (and score) ``requests`` at once with the current generator."""
        if self.rollout.generator == "local":
            return self._generate_local_requests(requests)
        self._push_current()
        key = self._generator.submit_generate(requests, self._sampling(), self._score_request())
        result = self._generator.wait(key)
        result["completions"] = [dict(c) for c in result["completions"]]
        if result.get("scores") is not None:
            result["scores"] = [dict(c) for c in result["scores"]]
        return result

    def _row(self, index, prompt, sample, request, group, completion, score, result) -> dict:
        from pt_rollout.generate import completion_text

        c = completion if isinstance(completion, dict) else completion.__dict__
        row = {
            "id": prompt.id,
            "sample": sample,
            "round": index,
            "group": group,
            "prompt": prompt.prompt,
            "completion": completion_text(self.tokenizer, c["token_ids"], list(self.rollout.stop)),
            "prompt_token_ids": list(request.prompt_token_ids),
            "completion_token_ids": list(c["token_ids"]),
            "finish_reason": c["finish_reason"],
            "completion_logprobs": c["logprobs"],
            "weight_version": result["version"],
        }
        if c.get("topk_ids") is not None:
            row["student_topk_ids"] = c["topk_ids"]
            row["student_topk_logprobs"] = c["topk_logprobs"]
        if score is not None:
            s = score if isinstance(score, dict) else score.__dict__
            row["teacher_token_logprobs"] = s["token_logprobs"]
            if s.get("topk_ids") is not None:
                row["teacher_topk_ids"] = s["topk_ids"]
                row["teacher_topk_logprobs"] = s["topk_logprobs"]
            if s.get("at_ids_logprobs") is not None:
                row["teacher_student_topk_logprobs"] = s["at_ids_logprobs"]
        for key, value in prompt.columns.items():
            row.setdefault(key, value)
        return row

    def _generate_local(self, index: int) -> dict:
        return self._generate_local_requests(
            [request for _, _, request, _ in self._requests(index)]
        )

    def _generate_local_requests(self, requests) -> dict:
        from pt_rollout.engines import SamplingParams
        from pt_rollout.engines.hf import HFEngine

        model = self.policy()
        if self._generator is None:
            device = next(model.parameters()).device
            self._generator = HFEngine(
                model,
                tokenizer=self.tokenizer,
                device=str(device),
                seed=self.rollout.seed,
                decoder=self.rollout.decoder,
            )
        was_training = model.training
        model.eval()
        start = time.perf_counter()
        try:
            completions = self._generator.generate(requests, SamplingParams(**self._sampling()))
        finally:
            model.train(was_training)
        out = {
            "completions": completions,
            "version": self._version,
            "generate_s": time.perf_counter() - start,
        }
        score = self._score_request()
        if score is not None:
            start = time.perf_counter()
            with torch.inference_mode():
                out["scores"] = self._local_teacher().score(
                    [r.prompt_token_ids for r in requests],
                    [c.token_ids for c in completions],
                    top_k=score["top_k"],
                    at_ids=[c.topk_ids for c in completions] if score["at_student_topk"] else None,
                )
            out["score_s"] = time.perf_counter() - start
        return out

    def _local_teacher(self):
        if self._teacher is None:
            from pt_rollout.engines.hf import HFEngine

            path = self.needs.teacher.path
            if path is None:
                raise ConfigError(
                    "the online loop scores with the teacher: set objective.teacher.path"
                )
            self._teacher = HFEngine(path)
        return self._teacher

    # ------------------------------------------------------------------ the generator process

    def _keep_ahead(self, index: int) -> None:
        """The requests the schedule has in flight once round ``index`` is in hand."""
        if self._generator is None:
            self._start_server()
        self._top_up(index)
        if self.rollout.schedule == "async":
            self._top_up(index + 1)

    def _generate_server(self, index: int, *, keep_ahead: bool = True) -> dict:
        r = self.rollout
        if self._generator is None:
            self._start_server()
        if keep_ahead:
            self._top_up(index)
        while True:
            result = self._generator.wait(self._pending.pop(index))
            staleness = index * self.updates - result["version"]
            if r.schedule != "async" or staleness <= r.max_staleness or r.stale == "keep":
                break
            self.dropped_stale += 1
            log.info(
                "round %d was generated %d updates ago (> rollout.max_staleness=%d): "
                "generating it again",
                index,
                staleness,
                r.max_staleness,
            )
            self._push_current()
            self._request(index)
        if r.schedule == "async" and keep_ahead:
            self._top_up(index + 1)  # keep the generator busy as far as staleness allows
        result["completions"] = [dict(c) for c in result["completions"]]
        if result.get("scores") is not None:
            result["scores"] = [dict(c) for c in result["scores"]]
        return result

    def _top_up(self, current: int) -> None:
        """Ask the generator for the rounds the schedule wants in flight now: ``current``
        (sync), up to ``current + step_off`` (step_off), or every round whose staleness
        with the current weights would stay within ``max_staleness`` (async). Weights are
        pushed first when they changed, so a request is sampled with the newest ones."""
        r = self.rollout
        last = self.cfg.training.max_steps // self.updates - 1
        if r.schedule == "sync":
            wanted = [current]
        elif r.schedule == "step_off":
            wanted = range(current, min(current + r.step_off, last) + 1)
        else:
            wanted = [
                w
                for w in range(current, last + 1)
                if w * self.updates - self._version <= r.max_staleness
            ]
        todo = [
            w
            for w in wanted
            if w <= last
            and w not in self._pending
            and w not in self._rounds
            and not (self.round_dir(w) / "rollouts.jsonl").exists()
        ]
        if todo:
            self._push_current()
        for w in todo:
            self._request(w)

    def _request(self, index: int) -> None:
        requests = [request for _, _, request, _ in self._requests(index)]
        self._pending[index] = self._generator.submit_generate(
            requests, self._sampling(), self._score_request()
        )

    def _start_server(self) -> None:
        from pt_rollout.serve import RemoteGenerator

        r = self.rollout
        path = self._write_weights()
        teacher = self.needs.teacher.path if self.needs.teacher is not None else None
        self._generator = RemoteGenerator(
            str(path),
            python=r.python,
            engine=r.engine,
            teacher=teacher,
            teacher_engine="hf" if teacher and self._score_request()["at_student_topk"] else None,
            seed=r.seed,
            version=self._version,
            gpu_memory_utilization=r.gpu_memory_utilization,
            max_model_len=r.max_model_len,
            max_logprobs=max(20, self.needs.student_top_k,
                             self.needs.teacher.top_k if self.needs.teacher else 0),
            logprobs_mode=self.needs.logprobs_mode,
            decoder=r.decoder,
        )  # fmt: skip
        self._pushed_version = self._version

    def _push_current(self) -> None:
        """Send the current weights to the generator unless it has them; without waiting
        for it to load them (it answers in order, after the rounds queued before)."""
        if self._pushed_version == self._version:
            return
        start = time.perf_counter()
        path = self._write_weights()
        self._push_keys.append(self._generator.submit_load_weights(str(path), self._version))
        self._pushed_version = self._version
        self._push_seconds += time.perf_counter() - start

    def _write_weights(self) -> Path:
        """The policy's weights as a checkpoint directory in memory (``/dev/shm`` where it
        exists), two alternating so a push never overwrites what the generator may still
        be reading."""
        if not self._push_dirs:
            base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
            for name in ("a", "b"):
                d = Path(tempfile.mkdtemp(prefix=f"pt-weights-{name}-", dir=base))
                self.tokenizer.save_pretrained(str(d))
                self._push_dirs.append(d)
            self._push_turn = 0
        target = self._push_dirs[self._push_turn % 2]
        self._push_turn += 1
        if len(self._push_keys) >= 2:  # the push that used this directory must be loaded
            self._generator.wait(self._push_keys.pop(0))
        from pt_train.checkpoint import save_model_weights

        state = self._gathered if self._gathered is not None else self.state_dict_of_policy()
        for old in target.glob("*.safetensors"):
            old.unlink()
        save_model_weights(self.policy(), target, state)
        return target


def round_figures(rows: list[dict]) -> dict:
    """A round's figures as it is trained (after dynamic sampling): the completions'
    length, and where the rows have them, the rewards, grades and advantages."""
    figures = {"completion_length": float(np.mean([len(r["completion_token_ids"]) for r in rows]))}
    if "reward" in rows[0]:
        rewards = np.array([r["reward"] for r in rows])
        figures["reward"] = float(rewards.mean())
        figures["reward_std"] = float(rewards.std())
    if "correct" in rows[0]:
        figures["accuracy"] = float(np.mean([bool(r.get("correct")) for r in rows]))
    if "advantage" in rows[0]:
        advantages = np.array([r["advantage"] for r in rows])
        figures["advantage"] = float(advantages.mean())
        figures["advantage_abs"] = float(np.abs(advantages).mean())
    if "group_all_equal" in rows[0]:
        equal = {r["group"]: r["group_all_equal"] for r in rows}
        figures["groups_all_equal"] = float(np.mean(list(equal.values())))
    return figures
