"""The loop guard: ends a stream whose tail repeats itself, for every request of `ChatEngine.generate`.

A small model sometimes falls into a loop: the same sentence, or the same
two sentences, over and over until the token cap. The detector watches the
output token ids and fires when the tail is periodic: some unit of 1 to
`max_period` tokens has been repeated exactly, `min_repeats` times in a row,
over at least `min_tokens` tokens.

Lists and tables are not loops: they repeat their markup (bullets, numbers,
pipes, separator rows) but each item or row brings new content, and every new
token that differs from the token one period back resets the count. Only an
exact re-emission of the same unit, several times over, fires. A unit with no
letter or digit at all (a long separator row of a wide table, a rule of dashes)
needs SYMBOL_ONLY_FACTOR times as many repeated tokens. The guard keeps
the text before the repetition started (one copy of the unit) for the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.engine.errors import RepetitionError

SYMBOL_ONLY_FACTOR = 4  # a unit of pure markup ("|---") must repeat this many times longer


@dataclass(frozen=True)
class LoopGuardConfig:
    """When a repeating tail counts as a loop (see LOOP_GUARD_* settings)."""

    min_tokens: int = 32  # repeated tokens before the guard fires; 0 = the guard is off
    min_repeats: int = 3  # copies of the unit in the tail, the first one included
    max_period: int = 256  # longest unit, in tokens, looked for

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0


class RepetitionDetector:
    """Feeds on output token ids; raises RepetitionError when the tail loops.

    For each period p it keeps the run of trailing tokens equal to the token p
    positions earlier: O(max_period) per token, memory bounded by the answer.
    """

    def __init__(self, config: LoopGuardConfig, decode: Callable[[list[int]], str]) -> None:
        self.config = config
        self._decode = decode
        self._ids: list[int] = []
        self._runs = [0] * (config.max_period + 1)
        self.fired = False

    def feed(self, token_ids: Iterable[int]) -> None:
        """Account new tokens; raise RepetitionError if the answer now loops."""
        if not self.config.enabled:
            return
        for token in token_ids:
            self._ids.append(token)
            period = self._periodic_tail()
            if period:
                repeated = self._runs[period]
                kept = self._ids[: len(self._ids) - repeated]
                self.fired = True
                raise RepetitionError(period, repeated, self._decode(kept))

    def _periodic_tail(self) -> int:
        """The shortest period whose repetition now reaches the thresholds, else 0."""
        ids, runs, config = self._ids, self._runs, self.config
        last, count = ids[-1], len(ids)
        found = 0
        for period in range(1, min(config.max_period, count - 1) + 1):
            runs[period] = runs[period] + 1 if ids[count - 1 - period] == last else 0
            needed = max(config.min_tokens, (config.min_repeats - 1) * period)
            if not found and runs[period] >= needed and self._long_enough(period, needed):
                found = period
        return found

    def _long_enough(self, period: int, needed: int) -> bool:
        """A unit with words in it fires at `needed`; pure markup only at SYMBOL_ONLY_FACTOR times that."""
        if self._runs[period] >= needed * SYMBOL_ONLY_FACTOR:
            return True
        unit = self._decode(self._ids[-period:])
        return any(char.isalnum() for char in unit)


def repeats_in(
    token_ids: list[int], config: LoopGuardConfig, decode: Callable[[list[int]], str]
) -> RepetitionError | None:
    """Whether a finished answer would have tripped the guard (benchmarks, tests)."""
    detector = RepetitionDetector(config, decode)
    try:
        detector.feed(token_ids)
    except RepetitionError as error:
        return error
    return None
