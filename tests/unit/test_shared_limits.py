"""The pure rules of the limits replicas share (services/admission/shared_limits.py,
services/accounts/shared_attempts.py): when they apply, how people are stored, and that a shared
count gives the refusals this process's tables give for the same use."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from services.accounts.limits import SignInLimiter
from services.admission.limits import UserLimits
from services.admission.refusals import Refused
from services.admission.shared_database import SharedDatabase, digest, lock_key
from services.admission.shared_limits import SharedLimits, spread, turn_refusal
from services.config import Settings, SettingsError
from tests.fakes import FakeClock


def settings(**changes: object) -> Settings:
    return Settings.from_env({}).replace(**changes)


@pytest.mark.parametrize(
    ("mode", "url", "shared"),
    [
        ("auto", "", False),  # SQLite in DATA_DIR: one process, its own tables
        ("auto", "sqlite:////data/chat.db", False),
        ("auto", "postgresql://app@db/chat", True),
        ("auto", "postgres://app@db/chat", True),
        ("off", "postgresql://app@db/chat", False),
        ("on", "postgresql://app@db/chat", True),
    ],
)
def test_limits_are_shared_with_postgresql_unless_turned_off(mode: str, url: str, shared: bool) -> None:
    assert Settings.from_env({"SHARED_LIMITS": mode, "DATABASE_URL": url}).limits_shared is shared


def test_shared_limits_on_without_postgresql_or_an_unknown_mode_is_refused() -> None:
    with pytest.raises(SettingsError, match="SHARED_LIMITS=on needs DATABASE_URL to be PostgreSQL"):
        Settings.from_env({"SHARED_LIMITS": "on"})
    with pytest.raises(SettingsError, match="SHARED_LIMITS='yes' is not one of auto, on, off"):
        Settings.from_env({"SHARED_LIMITS": "yes"})


def test_people_are_stored_as_digests_and_locked_by_a_32_bit_key() -> None:
    stored = digest("user:alice")
    assert stored == digest("user:alice") and stored != digest("user:alicf") and len(stored) == 32
    assert "alice" not in stored
    keys = [lock_key(digest(f"user:{n}")) for n in range(2000)]
    assert all(-(2**31) <= key < 2**31 for key in keys) and len(set(keys)) > 1990


def test_counts_per_second_spread_into_one_time_each_within_the_window() -> None:
    assert spread([(10, 2), (12, 1), (20, 3)], after=11) == [12.0, 20.0, 20.0, 20.0]
    assert spread([], after=0) == []


def test_a_shared_count_gives_the_refusals_this_processs_tables_give() -> None:
    """The same use, counted here (UserLimits) and from the database's rows: the same words."""
    clock = FakeClock(1_000_000.0)
    rules = settings(user_max_concurrent_turns=2, user_tokens_per_minute=100, user_documents_per_hour=3)
    local = UserLimits(rules, clock)
    usage = local.usage("user:alice")
    local.record_documents(usage, 2)
    local.record_tokens(usage, 60)
    clock.now += 20
    local.record_tokens(usage, 50)
    rows = [
        ("documents", int(clock.now) - 20, 2),
        ("tokens", int(clock.now) - 20, 60),
        ("tokens", int(clock.now), 50),
    ]
    with pytest.raises(Refused) as here:
        local.check(usage)
    shared = turn_refusal(rules, [("turns", 0, 0), *rows], 0, clock.now)
    assert shared is not None and (shared.reason, str(shared)) == (here.value.reason, str(here.value))
    assert shared.retry_after_seconds == pytest.approx(here.value.retry_after_seconds, abs=1)
    clock.now += 45  # the first 60 tokens aged out: documents next
    with pytest.raises(Refused) as here:
        local.check(usage, documents=2)
    shared = turn_refusal(rules, [("turns", 0, 0), *rows], 2, clock.now)
    assert shared is not None and shared.reason == here.value.reason == "user_documents_per_hour"
    assert str(shared).split(" Please")[0] == str(here.value).split(" Please")[0]
    assert turn_refusal(rules, [("turns", 0, 0), *rows], 1, clock.now) is None, "one more fits"
    assert turn_refusal(rules, [("turns", 0, 2)], 0, clock.now).reason == "user_concurrent_turns"  # type: ignore[union-attr]
    assert turn_refusal(settings(user_max_concurrent_turns=0), [("turns", 0, 99)], 0, clock.now) is None


def test_a_sign_in_attempt_the_shared_count_let_go_is_kept_here_for_a_fallback() -> None:
    clock = FakeClock(1_000_000.0)
    limiter = SignInLimiter(2, 20, 25, 900, 300, clock=clock)
    limiter.count("alice", "10.0.0.1")
    limiter.count("alice", "10.0.0.1")
    assert limiter.attempt("alice", "10.0.0.1") == 300, "the database down: this process's count decides"
    clock.now += 301
    assert limiter.attempt("alice", "10.0.0.1") == 0


class Connection:
    """A connection on which every statement succeeds and finds no rows."""

    async def execute(self, *_: Any) -> list:
        return []


class Database:
    """An AsyncEngine whose transactions succeed (finding no rows), or raise while `down`."""

    def __init__(self) -> None:
        self.down = False

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[Any]:
        if self.down:
            raise ConnectionRefusedError("connection refused")
        yield Connection()


@pytest.mark.asyncio
async def test_shared_limits_say_failing_through_a_whole_outage_not_only_after_their_own_error() -> None:
    """The history's breaker opens on the first failed statement (anyone's) and then every shared
    transaction is skipped: /status must say the replicas count alone all that time."""
    database, breaker_open = Database(), [False]
    shared = SharedDatabase(database, 1.0, available=lambda: not breaker_open[0])  # type: ignore[arg-type]
    limits = SharedLimits(settings(user_messages_per_minute=10), shared)
    assert await limits.count_message("user:ann") and limits.status()["failing"] is False
    database.down = breaker_open[0] = True  # the history noticed first: nothing is tried
    assert await limits.count_message("user:ann") is False
    assert limits.status() == {"leases_held": 0, "fallbacks": 1, "failing": True}
    breaker_open[0] = False  # the breaker's probe got through, but the database fails again
    assert await limits.count_message("user:ann") is False and limits.status()["failing"] is True
    database.down = False
    assert await limits.count_message("user:ann") and limits.status()["failing"] is False
