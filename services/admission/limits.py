"""Fair share between people: concurrent turns, answer tokens per minute, documents per hour and
messages per minute, per user.

A person is the key `user_key` makes: the signed-in user's name when there is
one (their chat and their API keys share it), else the client's address. Usage
lives in a TTL table bounded by USER_TABLE_ENTRIES; each record holds at most a
minute of token counts (one entry per second), at most USER_DOCUMENTS_PER_HOUR
upload times and at most USER_MESSAGES_PER_MINUTE message times.

These tables are this process's. With replicas on one PostgreSQL, shared_limits.py also counts each
person in the database, so one person gets each limit once, not once per replica; the rules (the
`*_refusal` functions below) are the same for both, and these tables stay the fallback while the
database cannot answer.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from cachetools import TTLCache

from services.admission.grants import Room
from services.admission.refusals import (
    CAPACITY,
    RESENT_EARLY,
    USER_CONCURRENT_TURNS,
    USER_DOCUMENTS_PER_HOUR,
    USER_MESSAGES_PER_MINUTE,
    USER_TOKENS_PER_MINUTE,
    Refused,
    rounded_seconds,
)
from services.config import Settings

TOKEN_WINDOW_SECONDS = 60.0
MESSAGE_WINDOW_SECONDS = 60.0
DOCUMENT_WINDOW_SECONDS = 3600.0
# People whose usage is remembered at once (each is forgotten an hour after their last request).
USER_TABLE_ENTRIES = 100_000


def user_key(user: str | None, address: str | None = None) -> str:
    """The key a person's limits are kept under: `user:<name>` when signed in, else `address:<address>`."""
    if user is not None:
        return f"user:{user}"
    return f"address:{'unknown' if address is None else address}"


@dataclass
class UserUsage:
    """What one person is using now and used lately."""

    turns: int = 0  # running or waiting, across all their tabs
    tokens: deque[tuple[int, int]] = field(default_factory=deque)  # (second, tokens), last minute only
    documents: deque[float] = field(default_factory=deque)  # upload times, last hour only
    messages: deque[float] = field(default_factory=deque)  # message times, last minute only
    told_until: float = 0.0  # a capacity refusal asked them to try again at this time
    reserved_tokens: int = 0  # answer tokens granted to their requests still running (grants.py)

    def tokens_since(self, moment: float) -> int:
        return sum(count for second, count in self.tokens if second >= moment)

    def add_tokens(self, now: float, count: int) -> None:
        second = int(now)
        if self.tokens and self.tokens[-1][0] == second:
            self.tokens[-1] = (second, self.tokens[-1][1] + count)
        else:
            self.tokens.append((second, count))
        while self.tokens and self.tokens[0][0] < now - TOKEN_WINDOW_SECONDS:
            self.tokens.popleft()


class UserLimits:
    """Checks and accounts each person's share; refusals say when to try again."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self._users: TTLCache[str, UserUsage] = TTLCache(
            USER_TABLE_ENTRIES, DOCUMENT_WINDOW_SECONDS, timer=clock
        )

    def __len__(self) -> int:
        return len(self._users)

    def usage(self, user_key: str) -> UserUsage:
        """The user's record, created on first use; any use keeps it for another hour."""
        usage = self._users.get(user_key)
        if usage is None:
            usage = UserUsage()
        self._users[user_key] = usage
        return usage

    def check(self, usage: UserUsage, documents: int = 0) -> None:
        """Raise Refused when starting a turn (with `documents` new uploads) would pass a limit."""
        self._check_turns(usage)
        self._check_tokens(usage)
        if documents:
            self._check_documents(usage, documents)

    def _check_turns(self, usage: UserUsage) -> None:
        if (refusal := turns_refusal(usage.turns, self.settings.user_max_concurrent_turns)) is not None:
            raise refusal

    def _check_tokens(self, usage: UserUsage) -> None:
        refusal = tokens_refusal(usage.tokens, self.settings.user_tokens_per_minute, self.clock())
        if refusal is not None:
            raise refusal

    def _check_documents(self, usage: UserUsage, documents: int) -> None:
        now = self.clock()
        while usage.documents and usage.documents[0] <= now - DOCUMENT_WINDOW_SECONDS:
            usage.documents.popleft()
        refusal = documents_refusal(usage.documents, documents, self.settings.user_documents_per_hour, now)
        if refusal is not None:
            raise refusal

    def record_documents(self, usage: UserUsage, documents: int) -> None:
        limit = self.settings.user_documents_per_hour
        if not limit:
            return
        usage.documents.extend([self.clock()] * documents)
        while len(usage.documents) > limit:
            usage.documents.popleft()

    def tokens_room(self, usage: UserUsage) -> Room | None:
        """What is left of the person's answer tokens this minute, those granted to their running
        requests counted as received; None without a limit."""
        limit = self.settings.user_tokens_per_minute
        if not limit:
            return None
        now = self.clock()
        held = [*usage.tokens, (int(now), usage.reserved_tokens)]
        left = limit - usage.tokens_since(now - TOKEN_WINDOW_SECONDS) - usage.reserved_tokens
        return Room(left, False, lambda needed: tokens_over(held, limit, now, needed))

    def record_tokens(self, usage: UserUsage, count: int) -> None:
        if count > 0:
            usage.add_tokens(self.clock(), count)

    def told(self, usage: UserUsage, refusal: Refused) -> None:
        """The person was refused for capacity and told when to try again: until then their messages
        get that answer at once, without new work (`count_message`)."""
        if refusal.reason in CAPACITY and refusal.retry_after_seconds:
            usage.told_until = self.clock() + refusal.retry_after_seconds

    def count_message(self, usage: UserUsage, service_full: bool = True) -> None:
        """Count one chat message; raise Refused (not counted) before the time a capacity refusal gave
        while the service is still full, and when the minute already holds the limit."""
        now = self.clock()
        if not service_full:
            usage.told_until = 0.0
        if now < usage.told_until:
            wait = usage.told_until - now
            raise Refused(
                RESENT_EARLY,
                f"The service is still busy: please try again in ~{rounded_seconds(wait)}, as your last "
                "message was told. This one was not sent.",
                wait,
            )
        limit = self.settings.user_messages_per_minute
        if not limit:
            return
        while usage.messages and usage.messages[0] <= now - MESSAGE_WINDOW_SECONDS:
            usage.messages.popleft()
        if (refusal := messages_refusal(usage.messages, limit, now)) is not None:
            raise refusal
        usage.messages.append(now)

    def uncount_message(self, usage: UserUsage) -> None:
        """Take back the message just counted (the shared count refused it: a refusal is not counted)."""
        if usage.messages:
            usage.messages.pop()


def turns_refusal(turns: int, limit: int) -> Refused | None:
    """The refusal of one more turn for a person with `turns` running or waiting; None under `limit`."""
    if not limit or turns < limit:
        return None
    return Refused(
        USER_CONCURRENT_TURNS,
        f"You already have {turns} answer{'s' if turns != 1 else ''} in progress "
        f"(in this or another tab); the limit is {limit} at a time. Please try again when one "
        "has finished, or stop it.",
    )


def tokens_refusal(
    tokens: Iterable[tuple[int, int]], limit: int, now: float, needed: int = 1
) -> Refused | None:
    """The refusal of a request that needs `needed` answer tokens, for a person who received `tokens`
    ((second, count), oldest first) lately; None while the last minute leaves room for them under
    `limit` (0 = no limit)."""
    recent = [(second, count) for second, count in tokens if second >= now - TOKEN_WINDOW_SECONDS]
    if not limit or sum(count for _, count in recent) + needed <= limit:
        return None
    return tokens_over(recent, limit, now, needed)


def tokens_over(tokens: Iterable[tuple[int, int]], limit: int, now: float, needed: int) -> Refused:
    """The refusal of a request that needs `needed` answer tokens when the last minute's `tokens`
    leave less than that under `limit`: with the time when enough of them have aged out."""
    recent = [(second, count) for second, count in tokens if second >= now - TOKEN_WINDOW_SECONDS]
    total = sum(count for _, count in recent)
    # Retry once enough of the minute's tokens have aged out to leave room again.
    excess = total + needed - limit
    retry = TOKEN_WINDOW_SECONDS
    for second, count in recent:
        excess -= count
        if excess <= 0:
            retry = second + TOKEN_WINDOW_SECONDS + 1 - now
            break
    if total >= limit:
        told = f"You have received over {limit:,} answer tokens in the last minute, the limit per person."
    else:
        told = (
            f"This request needs at least {needed:,} answer tokens, and {limit - total:,} of your "
            f"{limit:,} per minute are left (answers still running count in full)."
        )
    return Refused(USER_TOKENS_PER_MINUTE, f"{told} Please try again in ~{rounded_seconds(retry)}.", retry)


def documents_refusal(times: Sequence[float], documents: int, limit: int, now: float) -> Refused | None:
    """The refusal of `documents` new uploads for a person who uploaded at `times` (oldest first, the
    last hour only); None within `limit` per hour (0 = no limit)."""
    if not limit or len(times) + documents <= limit:
        return None
    if documents > limit:
        return Refused(
            USER_DOCUMENTS_PER_HOUR,
            f"You can upload at most {limit} document(s) per hour; please send fewer at once.",
        )
    needed = len(times) + documents - limit  # uploads that must age out first
    retry = times[needed - 1] + DOCUMENT_WINDOW_SECONDS - now
    return Refused(
        USER_DOCUMENTS_PER_HOUR,
        f"You have uploaded {len(times)} document(s) in the last hour; the limit is "
        f"{limit} per hour. Please try again in ~{rounded_seconds(retry)}.",
        retry,
    )


def messages_refusal(times: Sequence[float], limit: int, now: float) -> Refused | None:
    """The refusal of one more message for a person who sent at `times` (oldest first, the last minute
    only); None under `limit` per minute (0 = no limit)."""
    if not limit or len(times) < limit:
        return None
    retry = times[0] + MESSAGE_WINDOW_SECONDS - now
    return Refused(
        USER_MESSAGES_PER_MINUTE,
        f"You have sent {len(times)} messages in the last minute; the limit is {limit} "
        f"per minute. Please try again in ~{rounded_seconds(retry)}.",
        retry,
    )
