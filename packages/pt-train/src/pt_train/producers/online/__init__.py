"""The online loop (``rollout.prompts``), one job a module:

- :mod:`.producer`: what the trainer calls (:class:`OnlineProducer`): the rounds' rows as
  micro-batches, their figures, the old log-probs of updates after a round's first;
- :mod:`.schedule`: which rounds to ask for when (sync, step_off, async), staleness, drops;
- :mod:`.prompts`: the prompts a round takes and their requests and seeds;
- :mod:`.generators`: where samples come from (local, colocate, server), one protocol;
- :mod:`.push`: how new weights reach a generator (files, transfer, memory), one factory;
- :mod:`.build`: a round's rows from a generation: rewards, the objective's columns,
  dynamic sampling;
- :mod:`.rounds`: rounds in memory, written for resume only.
"""

from pt_train.producers.online.producer import OnlineProducer
from pt_train.producers.online.push import pairs_to_send
from pt_train.producers.online.rounds import round_figures

__all__ = ["OnlineProducer", "pairs_to_send", "round_figures"]
