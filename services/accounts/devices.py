"""Device cookies: a browser that signed in to an account before is let in by its own failures only.

Without them, anyone behind the same address (an office's NAT) or anywhere (many addresses guessing
one account) could make the person wait: limits on an address or an account cannot tell the
person's own browser from the guesser's. After each good password sign-in, the browser gets a cookie
(`vc_device`: HttpOnly, SameSite=Strict, SIGN_IN_DEVICE_DAYS) holding a random device id and its
issue time, signed with an HMAC bound to the account, under a key derived from the cookie-signing
secret (so every replica checks it, and nothing is stored). A sign-in to that account that carries a
good one counts against that device only (limits.py): five failures lock that browser out for that
account like any other. It proves nothing by itself: the password is checked as always. (OWASP,
"Slow Down Online Guessing Attacks with Device Cookies".)
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import os
import secrets
import time
from collections.abc import Callable

from services.accounts.secret import ENV_NAME

COOKIE_NAME = "vc_device"
PURPOSE = b"vllm-chat device cookie v1"
MAX_COOKIE_CHARS = 200  # a longer value is not ours: not even split
CLOCK_SKEW_SECONDS = 300  # replicas' clocks may differ this much


def _key() -> bytes | None:
    secret = os.environ.get(ENV_NAME, "")
    return hmac.new(secret.encode(), PURPOSE, hashlib.sha256).digest() if secret else None


def _mac(key: bytes, account: str, device: str, issued: str) -> str:
    digest = hmac.new(key, f"{account}\n{device}\n{issued}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


class DeviceCookies:
    """Issues device cookies and says which device a good one names."""

    def __init__(self, lifetime_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.lifetime_seconds = lifetime_seconds
        self._clock = clock

    def issue(self, account: str) -> str | None:
        """A new cookie value for a browser that just signed in to `account`; None when turned off."""
        key = _key()
        if key is None or self.lifetime_seconds <= 0:
            return None
        device, issued = secrets.token_urlsafe(16), str(int(self._clock()))
        return f"{device}.{issued}.{_mac(key, account, device, issued)}"

    def device_of(self, cookie: str | None, account: str) -> str | None:
        """The device id of a good, unexpired cookie issued for `account`; None for anything else."""
        key = _key()
        if key is None or not cookie or len(cookie) > MAX_COOKIE_CHARS or cookie.count(".") != 2:
            return None
        device, issued, mac = cookie.split(".")
        if not hmac.compare_digest(_mac(key, account, device, issued).encode(), mac.encode()):
            return None
        age = self._clock() - int(issued) if issued.isdigit() else -math.inf
        return device if -CLOCK_SKEW_SECONDS <= age <= self.lifetime_seconds else None

    def set_cookie(self, value: str) -> str:
        """The Set-Cookie header's value (Secure is added over https: services/web/headers.py)."""
        max_age = int(self.lifetime_seconds)
        return f"{COOKIE_NAME}={value}; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict"
