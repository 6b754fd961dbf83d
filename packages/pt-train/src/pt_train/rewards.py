"""The online loop's reward component: one float per sampled completion.

    reward:
      answer_key: answer        # grade against the prompt's gold answer (pt-eval's grader)
      format_reward: 0.0        # + this when the completion has a \\boxed{...}
      function: null            # "module:function": rows -> one float per row
      function_weight: null     # with function: reward = graded + weight x function(rows)
      timeout: 5.0              # seconds per completion in the grading workers
      workers: null             # grading worker processes (null: the CPU count)

The reward of a completion is 1 when pt-eval grades it correct against the prompt's gold
answer, else 0 (a grading timeout or error is 0 and counted), ``+ format_reward`` when
it has a ``\\boxed{...}``. With ``function`` alone it is the function's value and nothing
is graded (``format_reward``, ``answer_key``, ``timeout`` and ``workers`` are then
refused); with ``function`` and ``function_weight`` it is the graded reward plus
``function_weight`` times the function's value (a weighted mix).

The online loop owns the component: it grades every round once it is generated and
before the objective reads the rows (``reward`` and, when graded, ``correct``,
``grade_status`` and ``extracted`` in each row); it holds the grading worker pool and
closes it with the run. An objective asks for rewards by declaring ``Needs(reward=True)``.
"""

from __future__ import annotations

import re
import time

import numpy as np
from pydantic import Field, model_validator

from pt_core.config import Section
from pt_core.errors import ConfigError

BOXED = re.compile(r"\\boxed\s*\{")
GRADING_KEYS = ("format_reward", "answer_key", "timeout", "workers")


class RewardConfig(Section):
    answer_key: str = "answer"
    format_reward: float = 0.0
    function: str | None = None  # "module:function": rows -> one float per row
    function_weight: float | None = None
    timeout: float = Field(default=5.0, gt=0)
    workers: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self):
        # Keys at a value other than their default (a run's frozen config.yaml lists every
        # key, so that is what "given" can mean; a default changes nothing).
        given = self.model_dump(exclude_defaults=True)
        if self.function is None and "function_weight" in given:
            raise ValueError(
                f"reward.function_weight={self.function_weight} has no effect without "
                "reward.function; set a function or remove it"
            )
        if self.function is not None and self.function_weight is None:
            for key in GRADING_KEYS:
                if key in given:
                    fix = "add the bonus inside the function" if key == "format_reward" else (
                        "remove it")  # fmt: skip
                    raise ValueError(
                        f"reward.{key}={getattr(self, key)} has no effect beside "
                        "reward.function: the function's value is the whole reward and "
                        f"nothing is graded; {fix}, or set reward.function_weight to add the "
                        "function to the graded reward"
                    )
        return self

    @property
    def graded(self) -> bool:
        return self.function is None or self.function_weight is not None


class Rewards:
    """The rewards of a round's rows (see the module docstring)."""

    def __init__(self, cfg: RewardConfig):
        self.cfg = cfg
        self._pool = None
        self._function = None

    def __call__(self, rows: list[dict]) -> dict:
        """Write ``reward`` (and the grade's columns) into each row; return the counts."""
        start = time.perf_counter()
        rewards = np.zeros(len(rows))
        counts: dict = {}
        if self.cfg.graded:
            graded, counts = self._graded(rows)
            rewards += graded
        if self.cfg.function is not None:
            weight = 1.0 if self.cfg.function_weight is None else self.cfg.function_weight
            rewards += weight * self._custom_values(rows)
        for row, reward in zip(rows, rewards, strict=True):
            row["reward"] = float(reward)
        return {"reward_s": round(time.perf_counter() - start, 3), **counts}

    def _custom_values(self, rows: list[dict]) -> np.ndarray:
        cfg = self.cfg
        values = self._custom()(rows)
        if len(values) != len(rows):
            raise ConfigError(
                f"reward.function {cfg.function} returned {len(values)} rewards for "
                f"{len(rows)} rows"
            )
        return np.asarray(values, dtype=np.float64)

    def _graded(self, rows: list[dict]) -> tuple[np.ndarray, dict]:
        from pt_eval.grade import GradeOptions, grade_rows

        cfg = self.cfg
        if any(cfg.answer_key not in r for r in rows):
            raise ConfigError(
                f"the reward grades against each prompt's gold answer, but the prompts have "
                f"no {cfg.answer_key!r} column",
                hint="set reward.answer_key, or a reward function (reward.function)",
            )
        graded, _ = grade_rows(
            # finish_reason: a completion cut at max_tokens gets no last-number fallback
            [{"id": i, "completion": r["completion"], "answer": r[cfg.answer_key],
              "finish_reason": r.get("finish_reason")}
             for i, r in enumerate(rows)],
            GradeOptions(pred_key="completion", gold_key="answer", id_key="id"),
            pool=self._grading_pool(),
            show_progress=False,  # a round's grading is part of the step the trainer's bar shows
        )  # fmt: skip
        statuses = {"timeout": 0, "error": 0, "no_answer": 0}
        rewards = np.zeros(len(rows))
        for i, (row, g) in enumerate(zip(rows, graded, strict=True)):
            row["correct"], row["grade_status"], row["extracted"] = (
                g["correct"], g["grade_status"], g["extracted"],
            )  # fmt: skip
            if g["grade_status"] in statuses:
                statuses[g["grade_status"]] += 1
            rewards[i] = 1.0 if g["correct"] else 0.0
            if cfg.format_reward and BOXED.search(row["completion"] or ""):
                rewards[i] += cfg.format_reward
        return rewards, {f"graded_{k}": v for k, v in statuses.items()}

    def _grading_pool(self):
        if self._pool is None:
            from pt_eval.worker import GradingPool

            self._pool = GradingPool(self.cfg.workers, self.cfg.timeout)
        return self._pool

    def _custom(self):
        if self._function is None:
            from pt_core.objects import load_object

            assert self.cfg.function is not None  # called only with reward.function set
            self._function = load_object(self.cfg.function, key="reward.function")
        return self._function

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
