"""How completions are sampled, spelled one way for every stage that samples:
``pt-rollout generate``'s flags, the online loop's ``rollout:`` section and evaluation
during training (``eval.generate``).

- ``temperature``: 0 is greedy;
- ``top_k``: only the k most likely tokens (0: all), then
- ``top_p``: only the smallest set of most likely tokens whose mass reaches p (1: all);
  what is kept is renormalised;
- ``max_tokens``: the most tokens a completion gets;
- ``seed`` and ``seeding``: ``per_sample``, every sample has its own seed (from ``seed``
  and its id and sample number), so a completion does not depend on its batch or on
  where it runs (exact resume); ``engine``, the engine samples a batch from one
  generator seeded once with ``seed`` (faster on GPUs; completions depend on batching).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pt_core.config import Section

Seeding = Literal["per_sample", "engine"]
SEEDING: tuple[str, ...] = ("per_sample", "engine")


def seeding_value(value: str) -> str:
    """``per-sample`` (a command line's spelling) is ``per_sample``."""
    return value.replace("-", "_")


class SamplingConfig(Section):
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = Field(default=0, ge=0)
    max_tokens: int = Field(default=256, ge=1)
    seed: int = 0
    seeding: Seeding = "per_sample"

    @property
    def truncated(self) -> bool:
        """Whether some tokens can never be sampled (top-k or top-p below the whole)."""
        return self.top_k > 0 or self.top_p < 1.0
