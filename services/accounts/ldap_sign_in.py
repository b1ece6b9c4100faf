"""LDAP sign-in (AUTH_MODE=ldap): Chainlit's password form, answered by the directory.

A directory person is `ldap:<name>` (a provider identity, as OAuth's are: services/accounts/oauth.py),
never the local account that shares the name; only an administrator's link
(`python -m services.accounts link alice ldap:alice`) makes them sign in as a local account, which
then keeps its own role. Otherwise the role is the directory's, read at every sign-in: a member of
LDAP_ADMIN_GROUP_DN is an admin, anyone else a user; a changed role moves the account's session
generation, so sign-ins made under the old role end. An account an administrator removed stays
refused whatever the directory says.

Each try is counted (services/accounts/shared_attempts.py) before the name is checked or the directory asked.
With a service account (LDAP_BIND_DN), a signed-in person is looked up again at most every
SIGN_IN_CHECK_SECONDS (services/accounts/sessions.py calls `session_problem`): gone from the directory,
or in or out of the admins' group since, and their sign-in ends. Without one, nothing can be asked
without their password: a removed person's sign-in lasts until SIGN_IN_LIFETIME_SECONDS.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from cachetools import TTLCache
from chainlit.user import User
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from services.accounts.ldap_directory import DirectoryUnavailable, LdapDirectory, directory_name
from services.accounts.names import provider_identity
from services.accounts.shared_attempts import SignInAttempts
from services.accounts.store import NEXT_GENERATION, AccountStore
from services.config import Settings
from services.history import conversations

logger = logging.getLogger(__name__)

PROVIDER = "ldap"
MAX_TRACKED_PEOPLE = 10_000
UNAVAILABLE = "Sign-in is unavailable right now: the directory cannot be reached. Try again shortly."
Refuse = Callable[..., None]  # services/accounts/sign_in.py: refuse(status, detail, retry_after_seconds)


def ldap_sign_in_for(
    settings: Settings, mode: str, accounts: AccountStore | None, limiter: SignInAttempts
) -> LdapSignIn | None:
    """LDAP mode's sign-in over the directory of LDAP_URL; None in any other mode."""
    if mode != PROVIDER:
        return None
    return LdapSignIn(LdapDirectory(settings), accounts, limiter, settings.sign_in_check_seconds)


class LdapSignIn:
    """Signs people in against the directory and says when a signed-in person's sign-in must end."""

    def __init__(
        self,
        directory: LdapDirectory,
        accounts: AccountStore | None,
        limiter: SignInAttempts,
        check_seconds: float,
    ) -> None:
        self.directory = directory
        self.accounts = accounts
        self.limiter = limiter
        self._seen: TTLCache = TTLCache(maxsize=MAX_TRACKED_PEOPLE, ttl=check_seconds)  # name: state

    async def sign_in(
        self, username: str, password: str, address: str | None, refuse: Refuse
    ) -> tuple[User, int] | None:
        """The user and their session generation; None (401, or what `refuse` was told) otherwise."""
        name = directory_name(username)
        counted = f"{PROVIDER}:{name or str(username)[:64]}"
        if wait := await self.limiter.attempt(counted, address):
            logger.warning(
                "sign-in refused for %s from %s: too many failures (%d s left)", counted, address, wait
            )
            refuse(429, f"Too many failed sign-ins. Try again in {wait} seconds.", wait)
            return None
        if name is None or not password:
            why = "not a directory name" if name is None else "empty password (no bind is tried)"
            logger.info("LDAP sign-in refused for %r from %s: %s", str(username)[:64], address, why)
            return None
        try:
            person = await self.directory.authenticate(name, password)
        except DirectoryUnavailable as error:
            await self.limiter.withdraw(counted, address)  # not a guess: nothing was checked
            logger.warning("LDAP sign-in of %s unavailable: %s", name, error)
            refuse(503, UNAVAILABLE)
            return None
        if person is None:
            logger.info("LDAP sign-in failed for %s from %s", name, address)
            return None
        await self.limiter.succeeded(counted, address)
        return await self._user(name, "admin" if person.admin else "user")

    async def _user(self, name: str, role: str) -> tuple[User, int] | None:
        """`ldap:<name>` with the directory's role, or the local account linked to it."""
        identity = provider_identity(PROVIDER, name)
        metadata = {"role": role, "provider": PROVIDER, "ldap_name": name}
        if self.accounts is None:
            return User(identifier=identity, metadata=metadata), 0
        try:
            if (linked := await self.accounts.linked_account(identity)) is not None:
                account = await self.accounts.get(linked)
                if account is None or account.disabled:
                    logger.info("LDAP sign-in of %s refused: linked to removed %s", identity, linked)
                    return None
                logger.info("LDAP sign-in of %s as %s (linked)", identity, linked)
                linked_user = User(identifier=linked, metadata={**metadata, "role": account.role})
                return linked_user, account.generation
            generation = await record_role(self.accounts.engine, identity, role)
        except Exception as error:  # the directory vouched: let them chat, with its role
            logger.warning("account lookup failed for %s: %s", identity, error)
            generation = 0
        if generation is None:
            logger.info("LDAP sign-in refused for removed account %s", identity)
            return None
        logger.info("LDAP sign-in of %s (%s)", identity, role)
        return User(identifier=identity, metadata=metadata), generation

    async def session_problem(self, user: Any) -> str | None:
        """Why a signed-in LDAP person may no longer use their sign-in (the directory's answer, read
        at most every SIGN_IN_CHECK_SECONDS); None when they may, or when it cannot be asked."""
        metadata = getattr(user, "metadata", None) or {}
        name = metadata.get("ldap_name")
        ldap_user = metadata.get("provider") == PROVIDER and isinstance(name, str)
        if not (ldap_user and self.directory.can_recheck):
            return None
        state = self._seen.get(name)
        if state is None:
            try:
                person = await self.directory.look_up(name)
                state = "gone" if person is None else ("admin" if person.admin else "user")
            except DirectoryUnavailable as error:
                logger.warning("directory check of %s skipped: %s", name, error)
                state = "unknown"
            self._seen[name] = state
        if state == "gone":
            return "This account is no longer in the directory. Please sign in again."
        own = user.identifier == provider_identity(PROVIDER, name)  # a linked account keeps its role
        if own and state in ("admin", "user") and state != metadata.get("role"):
            return "Your role in the directory changed. Please sign in again."
        return None


async def record_role(engine: AsyncEngine, identifier: str, role: str) -> int | None:
    """Give the account `role` (creating its row on a first sign-in); its session generation after,
    moved on when the role changed. None when an administrator removed the account."""
    for _ in range(2):  # a concurrent first sign-in may insert the row between our read and insert
        try:
            async with engine.begin() as connection:
                row = (
                    await connection.execute(
                        text(
                            "SELECT role, disabled, COALESCE(session_generation, 0) FROM users "
                            "WHERE identifier = :who"
                        ),
                        {"who": identifier},
                    )
                ).first()
                values = {"who": identifier, "role": role, "meta": json.dumps({"role": role}), "now": _now()}
                if row is None:
                    await connection.execute(
                        text(
                            'INSERT INTO users ("id", identifier, metadata, "createdAt", role, disabled, '
                            "updated_at) VALUES (:id, :who, :meta, :now, :role, FALSE, :now)"
                        ),
                        {**values, "id": str(uuid.uuid4())},
                    )
                    return 0
                if row[1]:
                    return None
                if row[0] == role:
                    return int(row[2])
                await connection.execute(
                    text(
                        f"UPDATE users SET role = :role, metadata = :meta, {NEXT_GENERATION}, "
                        "updated_at = :now WHERE identifier = :who"
                    ),
                    values,
                )
                return int(row[2]) + 1
        except IntegrityError:
            continue
    raise RuntimeError(f"could not record the role of {identifier}")


def _now() -> str:
    return conversations.timestamp(datetime.now(UTC))
