"""Failed sign-ins, limited per account and per client address (bounded memory, no database).

Each key keeps the times of its recent failures (a sliding window). Past the limit, the key must
wait SIGN_IN_LOCKOUT_SECONDS from its latest failure; a success clears the account's failures.
The tables are bounded LRU caches: an attacker cycling names or addresses pushes out the oldest
entries, not the memory limit. Per process: with several replicas each counts its own.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from cachetools import LRUCache

MAX_TRACKED_KEYS = 10_000


class SignInLimiter:
    """Answers "may this account/address try now?" and records failures."""

    def __init__(
        self,
        max_per_account: int,
        max_per_address: int,
        window_seconds: float,
        lockout_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = {"account": max_per_account, "address": max_per_address}
        self.window_seconds = window_seconds
        self.lockout_seconds = lockout_seconds
        self._clock = clock
        self._failures: dict[str, LRUCache] = {kind: LRUCache(MAX_TRACKED_KEYS) for kind in self.limits}

    def wait_seconds(self, account: str, address: str | None) -> int:
        """Seconds until this account (and address) may try again; 0 = now."""
        now = self._clock()
        wait = 0.0
        for kind, key in (("account", account), ("address", address)):
            if key is None:
                continue
            times = self._recent(kind, key, now)
            if len(times) >= self.limits[kind]:
                wait = max(wait, times[-1] + self.lockout_seconds - now)
        return math.ceil(wait) if wait > 0 else 0

    def failed(self, account: str, address: str | None) -> None:
        now = self._clock()
        for kind, key in (("account", account), ("address", address)):
            if key is not None:
                times = self._recent(kind, key, now)
                times.append(now)
                self._failures[kind][key] = times

    def succeeded(self, account: str) -> None:
        self._failures["account"].pop(account, None)

    def _recent(self, kind: str, key: str, now: float) -> deque[float]:
        times: deque[float] = self._failures[kind].get(key) or deque(maxlen=self.limits[kind])
        horizon = now - max(self.window_seconds, self.lockout_seconds)
        while times and times[0] < horizon:
            times.popleft()
        return times
