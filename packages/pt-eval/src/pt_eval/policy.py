"""What counts as the same answer: the settings a grader may change.

Policy()                         # the default: exact, decimals at the gold's precision
Policy(numeric_tolerance=1e-4)   # numbers within a relative 1e-4 also match (Qwen/DFT)
Policy(last_number=False)        # never fall back to the last number of a response
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Policy:
    # relative tolerance for two numbers (|a - b| <= tol * max(|a|, |b|)); None: exact, with a
    # decimal gold judged at the precision it is written with
    numeric_tolerance: float | None = None
    # None: fall back to the last math span / number of a finished response only;
    # True: of every response, cut-off ones too; False: never to the last number
    last_number: bool | None = None

    def __post_init__(self):
        tol = self.numeric_tolerance
        if tol is not None and not (0 <= tol < 1):
            raise ValueError(f"numeric_tolerance must be in [0, 1), got {tol}")

    @property
    def tolerance(self) -> Fraction | None:
        """The tolerance as an exact fraction of its decimal spelling (1e-4 is 1/10000)."""
        if self.numeric_tolerance is None:
            return None
        return Fraction(repr(float(self.numeric_tolerance)))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> Policy:
        return cls(**(data or {}))


DEFAULT_POLICY = Policy()
