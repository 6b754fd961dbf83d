"""Producers: what hands the trainer the micro-batches of every optimizer step.

The trainer asks :meth:`Producer.micro_batches` for this rank's share of step ``s`` and
trains on them; it knows nothing of where they come from. Fixed data (token rows,
preference pairs) is a pure function of the step, so a resumed run needs only the step;
a producer with state of its own keeps it in :meth:`Producer.state_dict`, which goes
into every full checkpoint.
"""

from __future__ import annotations

from pt_train.producers.base import Producer
from pt_train.producers.fixed import FixedData, pairs_producer, rows_producer

__all__ = ["FixedData", "Producer", "pairs_producer", "rows_producer"]
