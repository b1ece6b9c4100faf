"""Summaries kept by content hash: bounded by entries, total bytes and age."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from cachetools import TTLCache


def summary_key(text: str, settings_fingerprint: str) -> str:
    """Cache key of a summary: sha256 of the settings fingerprint and the text."""
    digest = hashlib.sha256()
    fingerprint = settings_fingerprint.encode("utf-8", errors="surrogatepass")
    digest.update(len(fingerprint).to_bytes(8, "big") + fingerprint)
    digest.update(text.encode("utf-8", errors="surrogatepass"))
    return digest.hexdigest()


def _utf8_size(summary: str) -> int:
    return len(summary.encode("utf-8", errors="surrogatepass"))


class SummaryCache:
    """Summaries by `summary_key`, bounded by entries, total UTF-8 bytes and age."""

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_seconds: float,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries < 1 or max_bytes < 1 or ttl_seconds <= 0:
            raise ValueError("SummaryCache limits must be positive")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._cache: TTLCache[str, str] = TTLCache(
            maxsize=max_bytes, ttl=ttl_seconds, timer=timer, getsizeof=_utf8_size
        )
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._cache.get(key)

    def put(self, key: str, summary: str) -> bool:
        """Store a summary; False (not cached) when it alone is larger than max_bytes."""
        if _utf8_size(summary) > self.max_bytes:
            return False
        with self._lock:
            self._cache[key] = summary
            while len(self._cache) > self.max_entries:
                self._cache.popitem()  # least recently used first
        return True

    @property
    def size_bytes(self) -> int:
        with self._lock:
            self._cache.expire()
            return int(self._cache.currsize)

    def __len__(self) -> int:
        with self._lock:
            self._cache.expire()
            return len(self._cache)
