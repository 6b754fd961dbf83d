"""The interface between producers and the trainer."""

from __future__ import annotations

from pt_train.batch import Batch


class Producer:
    """Subclasses implement :meth:`micro_batches`; ``num_rows``/``num_tokens`` size the run
    when its length is given in epochs, samples or tokens."""

    num_rows: int = 0
    num_tokens: int = 0

    def micro_batches(self, step: int) -> list[Batch]:
        """This rank's micro-batches of optimizer step ``step`` (0-based)."""
        raise NotImplementedError

    def after_step(self, step: int) -> dict:
        """Called after optimizer step ``step`` (0-based) was taken; returns metrics of the
        producer for that step (e.g. how stale its samples were)."""
        return {}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 (optional hook)
        pass

    def close(self) -> None:  # noqa: B027 (optional hook)
        pass
