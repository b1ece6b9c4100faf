"""What running chat streams actually get: when the slowest falls under the reading pace, fewer run.

The capacity model (capacity.py) predicts step times from decode windows and
leaves out the windows where the engine read prompts. But a person reads the
stream they get, prefill included: in the third overload run the model allowed
six streams while they got 2.6 tokens/s at the median and 1.1 at P5, because
document parts' prefill chunks made the steps several times longer than decode
alone. `StreamPace` watches the result instead: the tokens each running chat
stream received over its last PACE_WINDOW_SECONDS. Every ADJUST_SECONDS at most,
when the slowest is under the pace (counted MARGIN, 10%, above the setting), it
caps the running limit at the share of what runs that the slowest's rate says
keeps the pace (six running at 3 tokens/s for a pace of 5: three), at least one
below what runs: a burst of admissions is undone in one move, not one stream per
ADJUST_SECONDS. When every stream keeps HEADROOM times the pace while the cap is
reached, the cap rises by one, and it goes away once it reaches the model's limit.

A cap that held PROBE_SECONDS while every stream kept the pace (not HEADROOM times it) rises by
one too, as a probe: the next adjustment takes it back if the streams fall under the pace. Without
it, a burst slowed by something passing (fifty pages connecting at once on the engine's cores)
lowered the cap for good: where a step's fixed cost dominates (prefill chunks, a small model on a
CPU), fewer streams do not get faster, so none reached HEADROOM times the pace again, and two
replicas ran 3.6 requests on average against 6.7 in one process.

App replicas at one engine (shared_line.py) pace it together: each shares its slowest stream, its
running count and its cap, and each one's cap then bounds the app's requests on every replica
(`others_slowest`, `others_cap`, the running count `adjust` is given): the lowest cap is the
engine's. A cut by any replica restarts every replica's clock: each cut gets ADJUST_SECONDS to
show before the next, as in one process (each replica cutting on its own clock cut the cap twice
as often, each time on windows still slow from before the last cut). A cap per replica, each from
its own streams, fell to 2-3 streams each through two replicas at 50 people (5 running against 13
in one process), and a capped replica's turns kept their place first in line, so the other replica
left the slot idle.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import TypeVar

Number = TypeVar("Number", int, float)

PACE_WINDOW_SECONDS = 10.0  # a stream's pace is the tokens it received in this window
MIN_STREAM_SECONDS = 4.0  # younger streams have no pace yet (the first token may take a prefill)
ADJUST_SECONDS = 5.0  # the cap moves at most this often: each change gets time to show
HEADROOM = 1.5  # grow at once while every stream keeps this multiple of the pace
PROBE_SECONDS = 20.0  # a cap held this long while every stream keeps the pace tries one more
# Lower while the slowest stream gets less than this multiple of the pace: answers shorter than
# MIN_STREAM_SECONDS are never seen here, and one prefill step costs them more of their rate.
MARGIN = 1.1
MAX_TIMES_PER_STREAM = 4096  # token times kept per stream (a bound, far above any pace in the window)


class StreamPace:
    """Token arrival times of the running chat streams, and the cap on the running limit they imply."""

    def __init__(self, pace_tokens_per_second: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.pace = pace_tokens_per_second
        self.clock = clock
        self.cap: int | None = None  # None: the capacity model's limit stands
        self.lowered_total = 0
        self._streams: dict[Hashable, tuple[float, deque[float]]] = {}  # owned by running requests
        self._changed_at = -math.inf
        # Other app replicas at the same engine (shared_line.py): the slowest of their streams and the
        # lowest of their caps; None when none is known.
        self.others_slowest: float | None = None
        self.others_cap: int | None = None

    def share(self, others_slowest: float | None, others_cap: int | None) -> None:
        """Other replicas' slowest stream and lowest cap. When one of them just cut the engine's cap,
        this one's clock starts again as if it had cut it: the replicas then cut once per
        ADJUST_SECONDS between them, not once each on the same slow windows."""
        held = self.engine_cap
        self.others_slowest = others_slowest
        self.others_cap = others_cap
        if others_cap is not None and (held is None or others_cap < held):
            self._changed_at = self.clock()

    def token(self, stream: Hashable) -> None:
        """`stream` received a token; its pace is timed from its first one (a prefill comes before)."""
        now = self.clock()
        if (entry := self._streams.get(stream)) is None:
            entry = self._streams[stream] = (now, deque(maxlen=MAX_TIMES_PER_STREAM))
        entry[1].append(now)

    def ended(self, stream: Hashable) -> None:
        self._streams.pop(stream, None)

    def __len__(self) -> int:
        return len(self._streams)

    def own_slowest(self) -> float | None:
        """The lowest tokens/s among this process's streams old enough to have a pace; None when there
        is none."""
        now = self.clock()
        rates = []
        for started_at, times in self._streams.values():
            age = now - started_at
            if age < MIN_STREAM_SECONDS:
                continue
            while times and times[0] < now - PACE_WINDOW_SECONDS:
                times.popleft()
            rates.append(len(times) / min(age, PACE_WINDOW_SECONDS))
        return min(rates) if rates else None

    def slowest(self) -> float | None:
        """The lowest tokens/s among the app's streams: this process's and other replicas'."""
        return lowest(self.own_slowest(), self.others_slowest)

    @property
    def engine_cap(self) -> int | None:
        """The cap on the app's requests: the lowest of this process's and other replicas'."""
        return lowest(self.cap, self.others_cap)

    def adjust(self, running: int, model_limit: int) -> None:
        """Lower the cap below `running` (the app's requests: ours and other replicas') when a stream
        is too slow (under MARGIN times the pace); raise it when all keep HEADROOM times the pace, or
        the pace since PROBE_SECONDS."""
        if self.pace <= 0:
            return
        now = self.clock()
        if now - self._changed_at < ADJUST_SECONDS:
            return
        slowest = self.slowest()
        if slowest is None:
            return
        floor = MARGIN * self.pace
        if slowest < floor and running > 1:
            # Streams share the steps: at slowest/floor of the rate, about that share of them keeps it.
            keeps_pace = math.floor(running * slowest / floor)
            self.cap = max(1, min(running - 1, self.cap or running, keeps_pace))
            self.lowered_total += 1
            self._changed_at = now
        elif self.cap is not None and running >= self.cap and self._may_grow(slowest, now):
            self.cap = None if self.cap + 1 >= model_limit else self.cap + 1
            self._changed_at = now

    def _may_grow(self, slowest: float, now: float) -> bool:
        """Every stream keeps HEADROOM times the pace, or the pace itself since PROBE_SECONDS."""
        held = now - self._changed_at >= PROBE_SECONDS
        return slowest >= HEADROOM * self.pace or (held and slowest >= MARGIN * self.pace)

    def limit(self, model_limit: int, outside: int = 0) -> int:
        """The running limit at the engine: the model's, or the cap on the app's requests plus
        `outside` (requests at the same engine of clients that share no pace) when lower. The cap
        bounds what paced replicas run, never what others do: counted against requests it cannot
        see, a replica whose cap fell below their count never ran a stream again to raise it by."""
        cap = self.engine_cap
        return model_limit if cap is None else min(model_limit, cap + outside)

    def status(self) -> dict[str, float | int | None]:
        slowest = self.slowest()
        return {
            "slowest_stream_tokens_per_second": None if slowest is None else round(slowest, 2),
            "cap": self.cap,
            "engine_cap": self.engine_cap,
            "lowered_total": self.lowered_total,
        }


def lowest(*values: Number | None) -> Number | None:
    """The lowest of the known `values`; None when none is known."""
    known = [value for value in values if value is not None]
    return min(known) if known else None
