"""Uploads not yet sent in a message: how many files and bytes a chat and a person may hold, and
when they expire (pure logic; upload_bounds.py applies it to Chainlit's upload route and files).

Chainlit 2.12 keeps every upload (`POST /project/file`) in the session's folder and its `files` dict
until the session ends, sent or not, and only the page limits how many: a client posted 20 MB files
without end, each staying while its page stayed connected. Here each upload is held from its request
until a message sends it (`sent`: the message's turn reads it, and its file goes when the message has
been handled) or it expires (`expired`); a new one that would pass a bound is refused with a sentence
the page shows ("Failed to upload <name>: <detail>").
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.config import Settings

MB = 1024 * 1024
TOO_MANY_FILES = 429  # files expire or get sent: trying again later can work
TOO_MANY_BYTES = 413
GONE = "upload_gone"  # a message names a file that is no longer held (expired, or another replica's)


@dataclass(frozen=True)
class UploadBounds:
    """The bounds on unsent uploads (Settings: UNSENT_UPLOAD*)."""

    files_per_session: int
    bytes_per_session: int
    files_per_person: int
    bytes_per_person: int
    expiry_seconds: float

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadBounds:
        s = settings
        return cls(
            s.unsent_uploads_per_session,
            s.unsent_upload_mb_per_session * MB,
            s.unsent_uploads_per_person,
            s.unsent_upload_mb_per_person * MB,
            s.unsent_upload_seconds,
        )


@dataclass(frozen=True)
class Refusal:
    """An upload refused: its HTTP status and the sentence the uploader reads."""

    status: int
    detail: str


@dataclass(frozen=True)
class Pending:
    """An upload admitted and being written: it counts until `keep` or `release`."""

    session_id: str
    key: str


@dataclass
class _Held:
    person: str
    size_bytes: int
    since: float
    file_id: str | None  # None while its request runs


@dataclass
class _Tally:
    files: int = 0
    size_bytes: int = 0


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: "15 minutes", "1 minute", "30 seconds"."""
    if seconds >= 60:
        minutes = round(seconds / 60)
        return f"{minutes} minute{'s' * (minutes != 1)}"
    whole = round(seconds)
    return f"{whole} second{'s' * (whole != 1)}"


def size_text(size_bytes: int) -> str:
    return f"{size_bytes / MB:.1f}".removesuffix(".0") + " MB"


class UnsentUploads:
    """The uploads of every chat that no message has sent yet, with per-chat and per-person totals.

    Bounded: a chat holds at most `files_per_session` entries, people's totals are dropped at zero,
    and a chat whose page is gone is forgotten (`prune`)."""

    def __init__(self, bounds: UploadBounds, clock: Callable[[], float] = time.monotonic) -> None:
        self.bounds = bounds
        self.clock = clock
        self._held: dict[str, dict[str, _Held]] = {}  # session id -> file id (or pending key) -> held
        self._sessions: dict[str, _Tally] = {}
        self._people: dict[str, _Tally] = {}
        self._keys = itertools.count()

    def admit(self, session_id: str, person: str, declared_bytes: int) -> Pending | Refusal:
        """Hold a place for an upload of about `declared_bytes` (its Content-Length, 0 if unknown), or
        refuse it when the chat or the person would pass a bound."""
        refusal = self._over(session_id, person, declared_bytes)
        if refusal is not None:
            return refusal
        pending = Pending(session_id, f"pending-{next(self._keys)}")
        self._add(session_id, pending.key, _Held(person, declared_bytes, self.clock(), None))
        return pending

    def keep(self, pending: Pending, file_id: str, size_bytes: int) -> Refusal | None:
        """The upload was written as `file_id` of `size_bytes`: held from now on, unless its real size
        passes a bound (a body without Content-Length), then refused (the caller deletes the file)."""
        held = self._remove(pending.session_id, pending.key)
        if held is None:  # its chat was forgotten meanwhile: nothing to hold it under
            return None
        refusal = self._over(pending.session_id, held.person, size_bytes, files=0)
        if refusal is not None:
            return refusal
        self._add(pending.session_id, file_id, _Held(held.person, size_bytes, held.since, file_id))
        return None

    def release(self, pending: Pending) -> None:
        """The upload failed or was refused: its place is free again (idempotent)."""
        self._remove(pending.session_id, pending.key)

    def sent(self, session_id: str, file_ids: Iterable[str]) -> list[str]:
        """A message of this chat sent these files: they are its message's now, never expired. Returns
        the ones that were held (uploads, not files the app attached to its answers)."""
        return [file_id for file_id in file_ids if self._remove(session_id, file_id) is not None]

    def expired(self) -> list[tuple[str, str]]:
        """(session id, file id) of every upload held `expiry_seconds` or longer, no longer held."""
        cutoff = self.clock() - self.bounds.expiry_seconds
        old = [
            (session_id, held.file_id)
            for session_id, files in self._held.items()
            for held in files.values()
            if held.file_id is not None and held.since <= cutoff
        ]
        for session_id, file_id in old:
            self._remove(session_id, file_id)
        return old

    def prune(self, alive: Callable[[str], bool]) -> None:
        """Forget the chats `alive` says are gone (Chainlit deleted their folder with them)."""
        for session_id in [s for s in self._held if not alive(s)]:
            for key in list(self._held.get(session_id, {})):
                self._remove(session_id, key)

    def held(self, session_id: str) -> int:
        """Uploads this chat holds unsent (being written included)."""
        return len(self._held.get(session_id, {}))

    def session_ids(self) -> list[str]:
        return list(self._held)

    def person_total(self, person: str) -> tuple[int, int]:
        """(files, bytes) this person holds unsent, across their chats."""
        tally = self._people.get(person, _Tally())
        return tally.files, tally.size_bytes

    def _over(self, session_id: str, person: str, size_bytes: int, files: int = 1) -> Refusal | None:
        b = self.bounds
        chat = self._sessions.get(session_id, _Tally())
        theirs = self._people.get(person, _Tally())
        if chat.files + files > b.files_per_session:
            status, told = TOO_MANY_FILES, f"This chat already holds {chat.files} uploaded files not yet sent"
            told += f" (at most {b.files_per_session})."
        elif theirs.files + files > b.files_per_person:
            status, told = TOO_MANY_FILES, f"You already hold {theirs.files} uploaded files not yet sent"
            told += f" across your chats (at most {b.files_per_person})."
        elif chat.size_bytes + size_bytes > b.bytes_per_session:
            status, told = TOO_MANY_BYTES, "Uploaded files not yet sent may take"
            told += f" {size_text(b.bytes_per_session)} per chat."
        elif theirs.size_bytes + size_bytes > b.bytes_per_person:
            status, told = TOO_MANY_BYTES, "Uploaded files not yet sent may take"
            told += f" {size_text(b.bytes_per_person)} across your chats."
        else:
            return None
        later = (
            f"Send them with a message first; files not sent within {duration(b.expiry_seconds)} are deleted."
        )
        return Refusal(status, f"{told} {later}")

    def _add(self, session_id: str, key: str, held: _Held) -> None:
        self._held.setdefault(session_id, {})[key] = held
        for tally in (
            self._sessions.setdefault(session_id, _Tally()),
            self._people.setdefault(held.person, _Tally()),
        ):
            tally.files += 1
            tally.size_bytes += held.size_bytes

    def _remove(self, session_id: str, key: str) -> _Held | None:
        files = self._held.get(session_id)
        held = files.pop(key, None) if files is not None else None
        if held is None:
            return None
        for totals, name in ((self._sessions, session_id), (self._people, held.person)):
            tally = totals[name]
            tally.files -= 1
            tally.size_bytes -= held.size_bytes
            if tally.files == 0:
                del totals[name]
        if not files:
            del self._held[session_id]
        return held


def gone_detail(expiry_seconds: float) -> str:
    """What the sender of a message reads when it names a file no longer held."""
    return (
        "This message was not sent: a file attached to it is no longer here (files not sent within "
        f"{duration(expiry_seconds)} are deleted). Please attach it again."
    )
