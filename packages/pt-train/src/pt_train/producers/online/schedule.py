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
