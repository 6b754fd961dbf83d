"""When rounds are generated (``rollout.schedule``), and what is done with a stale one.

- ``sync``: round r is generated when round r starts, with the weights of that moment;
- ``step_off: N``: round r+N is asked for when round r starts, so it is generated while
  round r trains (the first N+1 rounds with the starting weights);
- ``async``: the generator is kept busy with every round whose staleness would stay within
  ``max_staleness`` (optimizer updates), each asked for as soon as a place is free; a
  round whose staleness exceeds it is dropped and generated again (``stale: drop``, as TRL
  does, counted in ``dropped_stale``) or trained on anyway (``stale: keep``, as AsyncOPD
  does). With ``in_flight`` the newest weights are pushed before a round is waited for, so
  they reach its generation while it runs.

A round's staleness is the updates between the weights that generated it and those its
training starts from: 0 for ``sync``, ``N x U`` in the steady state of ``step_off``
(``U``: optimizer steps per round).
"""

from __future__ import annotations

from pt_core.errors import ConfigError


class Schedule:
    def __init__(self, rollout, updates_per_round: int, rounds: int):
        self.kind = rollout.schedule
        self.step_off = getattr(rollout, "step_off", 1)
        self.max_staleness = getattr(rollout, "max_staleness", 0)
        self.stale = getattr(rollout, "stale", "drop")
        self.in_flight = getattr(rollout, "in_flight", False)
        self.updates = updates_per_round
        self.last = rounds - 1

    @property
    def overlaps(self) -> bool:
        """Whether rounds are generated ahead of the one being trained."""
        return self.kind != "sync"

    def wanted(self, current: int, version: int) -> list[int]:
        """The rounds to have asked for once round ``current`` is in hand, with the weights
        at ``version`` updates."""
        if self.kind == "sync":
            wanted = [current]
        elif self.kind == "step_off":
            wanted = list(range(current, min(current + self.step_off, self.last) + 1))
        else:
            wanted = [
                w
                for w in range(current, self.last + 1)
                if w * self.updates - version <= self.max_staleness
            ]
        return [w for w in wanted if w <= self.last]

    def staleness(self, index: int, version: int) -> int:
        return index * self.updates - version

    def drops(self, index: int, version: int) -> bool:
        """Whether round ``index``, generated with the weights of ``version``, is too stale
        to train on and must be generated again."""
        return (
            self.kind == "async"
            and self.staleness(index, version) > self.max_staleness
            and self.stale == "drop"
        )


def round_layout(cfg) -> tuple[int, int]:
    """Mini-batches per round and optimizer steps per round, checked against the run's
    length and batch."""
    r, training = cfg.rollout, cfg.training
    if training.max_steps is None:
        raise ConfigError(
            "the online loop runs training.max_steps optimizer steps; other training "
            "lengths count fixed rows",
            hint="set training.max_steps (rounds = max_steps / (rollout.updates_per_round "
            "x rollout.epochs_per_round))",
        )
    updates = r.updates_per_round * r.epochs_per_round
    if training.max_steps % updates:
        raise ConfigError(
            f"training.max_steps={training.max_steps} is not a whole number of rounds of "
            f"{updates} steps (rollout.updates_per_round={r.updates_per_round} x "
            f"rollout.epochs_per_round={r.epochs_per_round})",
            hint="make max_steps a multiple of updates_per_round x epochs_per_round",
        )
    rows_per_round = training.global_batch_size * r.updates_per_round
    if rows_per_round % r.samples_per_prompt:
        raise ConfigError(
            f"a round of {rows_per_round} rows (training.global_batch_size x "
            f"rollout.updates_per_round) is not a whole number of prompts of "
            f"rollout.samples_per_prompt={r.samples_per_prompt}",
            hint="make global_batch_size x updates_per_round a multiple of samples_per_prompt",
        )
    prompts = rows_per_round // r.samples_per_prompt
    if r.prompts_per_round is not None and r.prompts_per_round != prompts:
        raise ConfigError(
            f"rollout.prompts_per_round={r.prompts_per_round}, but global_batch_size x "
            f"updates_per_round / samples_per_prompt = {prompts}",
            hint="leave prompts_per_round unset, or change global_batch_size",
        )
    return r.updates_per_round, updates
