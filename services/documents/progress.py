"""What the user sees while a document is read: tokens read out of the total, parts done, loops cut.

vLLM says nothing about a prompt until its first token, so the tokens read
are estimated from the engine's measured prefill speed (`PrefillMeter`) and
shown with a "~"; finished parts of a map-reduce summary are exact.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.engine import PrefillMeter


@dataclass(frozen=True)
class SummaryProgress:
    """One progress report of a summary."""

    tokens_total: int
    tokens_read: int | None  # None: the engine's speed is not measured yet
    elapsed_seconds: float
    parts_total: int = 0  # 0: one pass
    parts_done: int = 0
    parts_looped: int = 0  # parts whose summary started repeating itself and was cut short
    combining: bool = False  # the parts are done; their summaries are being combined
    finished: bool = False  # the first words of the summary have arrived

    def describe(self) -> str:
        """One or two lines for the user."""
        seconds = f"{self.elapsed_seconds:.0f} s"
        if self.finished:
            parts = f" in {self.parts_total} parts" if self.parts_total else ""
            line = f"Read {self.tokens_total:,} tokens{parts} in {seconds}."
        elif self.combining:
            line = f"Read all {self.tokens_total:,} tokens in {self.parts_total} parts"
            line += f"; combining their summaries… ({seconds})"
        elif self.tokens_read is None:
            line = f"Reading {self.tokens_total:,} tokens… ({seconds})"
        else:
            share = 100 * self.tokens_read / max(self.tokens_total, 1)
            line = f"Read ~{self.tokens_read:,} of {self.tokens_total:,} tokens ({share:.0f}%, {seconds})"
        if self.parts_total and not (self.combining or self.finished):
            line += f"; {self.parts_done} of {self.parts_total} parts summarized"
        if self.parts_looped:
            which = "1 part's summary" if self.parts_looped == 1 else f"{self.parts_looped} parts' summaries"
            line += (
                f"\n{which} started repeating itself and was stopped; the text before the repetition is kept."
            )
        return line


Progress = Callable[[SummaryProgress], Awaitable[None]]


class ProgressTracker:
    """Counts a summary's parts and turns elapsed time into an estimate of the tokens read."""

    def __init__(self, report: Progress | None, meter: PrefillMeter, tokens_total: int) -> None:
        self._report = report
        self._meter = meter
        self.tokens_total = tokens_total
        self.started_at = time.monotonic()
        self.parts_total = 0
        self.parts_done = 0
        self.parts_looped = 0
        self.tokens_done = 0  # tokens of the finished parts: read for sure
        self.piece_tokens = tokens_total  # size of one prompt of the job (a part, or the whole)
        self.combining = False
        self.reported = False

    def split(self, parts_total: int, piece_tokens: int) -> None:
        self.parts_total = parts_total
        self.piece_tokens = piece_tokens

    def snapshot(self) -> SummaryProgress:
        elapsed = time.monotonic() - self.started_at
        estimate = self._meter.tokens_read(elapsed, self.piece_tokens, self.tokens_total)
        read = None if estimate is None else max(estimate, self.tokens_done)
        if read is None and self.tokens_done:
            read = self.tokens_done
        return SummaryProgress(
            self.tokens_total,
            read,
            elapsed,
            self.parts_total,
            self.parts_done,
            self.parts_looped,
            self.combining,
        )

    async def tick(self) -> None:
        if self._report is not None:
            await self._report(self.snapshot())
            self.reported = True

    async def finish(self) -> None:
        """The first words are out: close the report with the real numbers (if one was shown)."""
        if self._report is not None and self.reported:
            snapshot = dataclasses.replace(self.snapshot(), tokens_read=self.tokens_total, finished=True)
            await self._report(snapshot)

    async def part_done(self, tokens: int, looped: bool) -> None:
        self.parts_done += 1
        self.tokens_done += tokens
        self.parts_looped += looped
        await self.tick()
