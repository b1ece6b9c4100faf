"""Changes to accounts and API keys as one person makes them, each recorded in the audit log: the
accounts command (actor "cli") and the admin page (actor: the administrator) call these, so both do
exactly the same thing.

A new password, a new role and removal end the account's sign-ins (the store moves its session
generation, which every process reads at each check: services/accounts/sessions.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.accounts.keys import PREFIX_CHARS, ApiKeyStore
from services.accounts.names import normalize_username
from services.accounts.store import Account, AccountStore
from services.audit import actions
from services.audit.log import AuditLog


@dataclass
class AccountActions:
    """What `actor` may do to accounts and keys, through `via` ("cli", "admin"), from `address`."""

    store: AccountStore
    keys: ApiKeyStore
    audit: AuditLog | None
    actor: str
    via: str
    address: str | None = None

    async def _record(self, action: str, target: str, **details: Any) -> None:
        if self.audit is not None:
            await self.audit.record(self.actor, action, target, {"via": self.via, **details}, self.address)

    async def add(self, username: str, password: str | None, role: str, generated: bool = False) -> Account:
        account = await self.store.add(username, password, role)
        sign_in = "password" if password is not None else "header or OAuth"
        await self._record(
            actions.ACCOUNT_ADDED, account.identifier, role=role, sign_in=sign_in, generated=generated
        )
        return account

    async def remove(self, username: str) -> int:
        deleted = await self.store.remove(username)
        identifier = normalize_username(username)
        await self._record(actions.ACCOUNT_REMOVED, identifier, conversations_deleted=deleted)
        return deleted

    async def reset_password(self, username: str, password: str, generated: bool = False) -> None:
        await self.store.reset_password(username, password)
        identifier = normalize_username(username)
        await self._record(actions.PASSWORD_RESET, identifier, generated=generated)

    async def set_role(self, username: str, role: str) -> None:
        await self.store.set_role(username, role)
        identifier = normalize_username(username)
        await self._record(actions.ACCOUNT_ROLE_CHANGED, identifier, role=role)

    async def link(self, username: str, identity: str) -> str:
        linked = await self.store.link(username, identity)
        await self._record(actions.IDENTITY_LINKED, normalize_username(username), identity=linked)
        return linked

    async def unlink(self, identity: str) -> str:
        unlinked = await self.store.unlink(identity)
        await self._record(actions.IDENTITY_UNLINKED, unlinked)
        return unlinked

    async def create_key(self, username: str) -> str:
        key = await self.keys.create(username)
        owner = normalize_username(username)
        await self._record(actions.KEY_CREATED, owner, prefix=key[:PREFIX_CHARS])
        return key

    async def revoke_key(self, username: str | None, prefix: str) -> int:
        revoked = await self.keys.revoke(username, prefix)
        owner = normalize_username(username) if username else ""
        await self._record(actions.KEY_REVOKED, owner, prefix=prefix.strip()[:PREFIX_CHARS], revoked=revoked)
        return revoked
