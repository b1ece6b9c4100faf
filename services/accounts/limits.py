"""Sign-in attempts, limited per account-and-address, per account, and slowed per address (bounded memory).

An attempt is counted when it starts, before its password is hashed: guesses sent all at once are
counted one by one as they arrive, so no more than the limit are ever checked (a limit checked
before the hash but counted after it let 24 wrong and 1 right guess sent together all be checked).
A success takes its own attempt back and clears its account-and-address failures; a failure stays.

Three keys, each a sliding window of attempt times:
- account and address (SIGN_IN_MAX_FAILURES): someone guessing one account from one place waits
  SIGN_IN_LOCKOUT_SECONDS from their latest attempt;
- account (SIGN_IN_MAX_FAILURES_PER_ACCOUNT): many places guessing one account; the same wait. It is
  kept above the address's count, so one address alone can never lock an account (the admin) out;
- address (SIGN_IN_MAX_FAILURES_PER_ADDRESS): one place guessing many accounts (credential stuffing)
  is slowed, not locked out: past that many attempts in the window, each further one waits
  SIGN_IN_ADDRESS_DELAY_SECONDS after the address's latest, twice as long with each further attempt,
  at most SIGN_IN_LOCKOUT_SECONDS. Everyone behind one NAT address shares it, so a script there
  delays its neighbours instead of shutting them out for the whole lockout.
A browser that signed in to the account before (its device cookie: devices.py) is judged only by
its own failures for that account (account and device): not by its address, nor by the account's
count from everywhere, which an attacker elsewhere could fill.
An IPv6 address counts by its /64 network (one host usually owns a whole /64).
The tables are bounded LRU caches: an attacker cycling names or addresses pushes out the oldest
entries, not the memory limit. These tables are this process's: shared_attempts.py also counts
every attempt in the database when replicas share one (SHARED_LIMITS), and uses these rules.
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import time
from collections import deque
from collections.abc import Callable, Sequence

from cachetools import LRUCache

MAX_TRACKED_KEYS = 10_000
IPV6_PREFIX = 64


def address_key(address: str | None) -> str | None:
    """The key an address counts under: itself, or its /64 network for IPv6; None when unknown."""
    if not address:
        return None
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address[:64]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/{IPV6_PREFIX}", strict=False))
    return str(ip)


class SignInLimiter:
    """Answers "may this account, from this address (or this known browser), try now?" and counts the
    attempts."""

    def __init__(
        self,
        max_per_pair: int,
        max_per_address: int,
        max_per_account: int,
        window_seconds: float,
        lockout_seconds: float,
        address_delay_seconds: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = {
            "pair": max_per_pair,
            "address": max_per_address,
            "account": max(max_per_account, max_per_address + 1),
        }
        self.window_seconds = window_seconds
        self.lockout_seconds = lockout_seconds
        self.address_delay_seconds = address_delay_seconds
        doublings = math.ceil(math.log2(max(lockout_seconds / address_delay_seconds, 1))) + 1
        self.kept = {**self.limits, "address": max_per_address + doublings}  # attempts each key keeps
        self._clock = clock
        self._times: dict[str, LRUCache] = {kind: LRUCache(MAX_TRACKED_KEYS) for kind in self.limits}

    def wait_seconds(self, kind: str, times: Sequence[float], now: float) -> float:
        """How long a key with these attempt times (oldest first) must still wait; <= 0: it may try."""
        count = len(times)
        if count < self.limits[kind]:
            return 0.0
        if kind != "address":
            return times[-1] + self.lockout_seconds - now
        delay = self.address_delay_seconds * 2 ** (count - self.limits[kind])
        return times[-1] + min(delay, self.lockout_seconds) - now

    def attempt(self, account: str, address: str | None, device: str | None = None) -> int:
        """Start an attempt: 0 = go (it is counted now), else the seconds to wait (nothing counted).
        `device`: the browser's device, when its device cookie is good for this account."""
        now = self._clock()
        keys = self.keys(account, address, device)
        windows = [(kind, key, self._recent(kind, key, now)) for kind, key in keys]
        wait = max((self.wait_seconds(kind, times, now) for kind, _, times in windows), default=0.0)
        if wait > 0:
            return math.ceil(wait)
        for kind, key, times in windows:  # no await since the check: nothing can slip in between
            times.append(now)
            self._times[kind][key] = times
        return 0

    def count(self, account: str, address: str | None, device: str | None = None) -> None:
        """Count an attempt the shared count let go (shared_attempts.py), for when it cannot answer."""
        now = self._clock()
        for kind, key in self.keys(account, address, device):
            times = self._recent(kind, key, now)
            times.append(now)
            self._times[kind][key] = times

    def succeeded(self, account: str, address: str | None, device: str | None = None) -> None:
        """The attempt was right: it does not count, and this account-and-address (or device) starts
        afresh."""
        self.withdraw(account, address, device)
        self._times["pair"].pop(self.keys(account, address, device)[0][1], None)

    def withdraw(self, account: str, address: str | None, device: str | None = None) -> None:
        """Take one started attempt back (it was right, or it could not be checked at all)."""
        for kind, key in self.keys(account, address, device):
            with contextlib.suppress(IndexError):
                (self._times[kind].get(key) or deque()).pop()

    def keys(self, account: str, address: str | None, device: str | None = None) -> list[tuple[str, str]]:
        """The keys an attempt counts under, the account-and-place one first."""
        if device is not None:
            return [("pair", f"{account}\ndevice {device}")]
        network = address_key(address)
        keys = [("pair", f"{account}\n{network or ''}"), ("account", account)]
        return keys + ([("address", network)] if network else [])

    def _recent(self, kind: str, key: str, now: float) -> deque[float]:
        times: deque[float] = self._times[kind].get(key) or deque(maxlen=self.kept[kind])
        horizon = now - max(self.window_seconds, self.lockout_seconds)
        while times and times[0] < horizon:
            times.popleft()
        return times
