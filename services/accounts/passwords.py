"""Password hashing with argon2id (memory-hard), off the event loop, a few at a time.

Each hash or check takes ~0.3 s and 64 MiB (RFC 9106's low-memory profile, argon2-cffi's
default), so they run in threads, at most HASHING_CONCURRENCY at once: a burst of sign-ins
waits instead of taking 64 MiB each.
"""

from __future__ import annotations

import asyncio
import secrets
import threading

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError, VerifyMismatchError

HASHING_CONCURRENCY = 2
MIN_PASSWORD_CHARS = 8

_hasher = PasswordHasher()
_slots = threading.BoundedSemaphore(HASHING_CONCURRENCY)  # held inside the worker thread
# Checked when the account does not exist, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def check_password(password_hash: str | None, password: str) -> bool:
    """True when `password` matches; a missing or malformed hash never matches (in the same time)."""
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerifyMismatchError, VerificationError, InvalidHashError):
        return False


def needs_rehash(password_hash: str) -> bool:
    """True when the hash was made with weaker parameters than today's."""
    try:
        return _hasher.check_needs_rehash(password_hash)
    except InvalidHashError:
        return True


def _one_at_a_slot(function, *args):  # type: ignore[no-untyped-def]
    with _slots:
        return function(*args)


async def check_password_async(password_hash: str | None, password: str) -> bool:
    return await asyncio.to_thread(_one_at_a_slot, check_password, password_hash, password)


async def hash_password_async(password: str) -> str:
    return await asyncio.to_thread(_one_at_a_slot, hash_password, password)


def generated_password() -> str:
    return secrets.token_urlsafe(15)  # 20 characters, 120 bits


def password_problem(password: str) -> str | None:
    """Why a new password is refused, or None."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"a password needs at least {MIN_PASSWORD_CHARS} characters"
    return None
