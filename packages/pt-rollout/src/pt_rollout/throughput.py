"""A progress bar on stderr that shows prompts/s and generated tokens/s, and the totals the
manifest reports."""

from __future__ import annotations

import time

from rich.progress import TextColumn

from pt_core.log import get_logger, progress

log = get_logger(__name__)


class Throughput:
    """Counts rows and tokens done in this run; ``n`` rows make one prompt."""

    def __init__(self, description: str, *, total: int, done: int = 0, n: int = 1, unit="prompts"):
        self.description = description
        self.total = total
        self.initial = done
        self.n = n
        self.unit = unit
        self.rows = 0
        self.tokens = 0
        self._started = None
        self._ended = None
        self._bar = None
        self._task = None

    def __enter__(self):
        self._started = time.perf_counter()
        self._bar = progress(TextColumn("{task.fields[rates]}"))
        self._bar.__enter__()
        self._task = self._bar.add_task(
            self.description, total=self.total, completed=self.initial, rates=""
        )
        return self

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        if self._bar is not None and self._task is not None:  # both set in __enter__
            self._bar.update(self._task, advance=rows, rates=self.rates())

    def set_done(self, rows: int, tokens: int) -> None:
        """For progress counted elsewhere (data-parallel workers)."""
        self.advance(rows - self.rows, tokens - self.tokens)

    @property
    def seconds(self) -> float:
        if self._started is None:
            return 0.0
        return (self._ended or time.perf_counter()) - self._started

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def rates(self) -> str:
        seconds = max(self.seconds, 1e-9)
        return (
            f"{self.rows / self.n / seconds:.2f} {self.unit}/s, {self.tokens / seconds:.0f} tok/s"
        )

    def __exit__(self, *exc):
        self._ended = time.perf_counter()
        if self._bar is not None:
            self._bar.__exit__(*exc)
        if exc[0] is None and self.rows:
            log.info(
                "%s: %d rows, %d tokens in %.1f s (%s)",
                self.description,
                self.rows,
                self.tokens,
                self.seconds,
                self.rates(),
            )
