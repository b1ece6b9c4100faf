"""Sign-ins that end: every cookie says when it was signed in and under which session generation.

Chainlit's sign-in cookie is a JWT that `decode_jwt` accepts while its signature and expiry hold,
and `POST /auth/jwt` turns any such token into a fresh one: by itself nothing could end a sign-in.
So each sign-in's user metadata (which Chainlit signs into the token and copies into a refreshed
one) carries a claim of ours, {"generation": n, "signed_in_at": unix seconds}, and a token is
refused, on every HTTP route, at the socket's connect and on every chat message, when
- it has no claim (made before this check existed);
- it was signed in more than SIGN_IN_LIFETIME_SECONDS ago: an absolute lifetime that refreshing
  the token does not extend;
- its account is removed, or (password mode) gone;
- its generation is not the account's (`users.session_generation`), which moves on sign-out,
  a new password, a new role, removal and an account given back (services/accounts/store.py).
The account is read afresh at every check (one indexed row; Chainlit reads the same row on every
request itself): a change made anywhere (the accounts command, another replica, /admin) ends the
account's sign-ins at once in every process. Writes already under way are the data layer's to drop
(services/history/owned_writes.py). When the database cannot answer, tokens that pass the claim
checks are let through: database trouble must not stop the chat (as elsewhere in the app).
The one local user of a loopback install has nothing to revoke: only the lifetime applies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from chainlit.auth.jwt import decode_jwt
from chainlit.user import User

from services.accounts.store import AccountStore

logger = logging.getLogger(__name__)

CLAIM = "session"
CLOCK_SKEW_SECONDS = 300  # replicas' clocks may differ this much
SIGN_IN_AGAIN = "Please sign in again."


@dataclass(frozen=True)
class AccountState:
    """What a token is checked against: does the account exist, is it removed, its generation."""

    exists: bool
    disabled: bool
    generation: int


class Sessions:
    """Stamps new sign-ins with the claim and says why a token is no longer good."""

    def __init__(
        self,
        mode: str,
        accounts: AccountStore | None,
        lifetime_seconds: float,
        clock: Callable[[], float] = time.time,
        recheck: Callable[[User], Awaitable[str | None]] | None = None,
    ) -> None:
        """`recheck`: asked last, when the account's own checks pass (LDAP: is the person still in the
        directory, in the same group?)."""
        self.mode = mode
        self.recheck = recheck
        self.accounts = accounts
        self.lifetime_seconds = lifetime_seconds
        self._clock = clock

    @property
    def revocable(self) -> bool:
        """False for the local user and anonymous visitors: no account whose sign-ins could end."""
        return self.accounts is not None and self.mode not in ("local", "anonymous")

    def stamp(self, user: User, generation: int) -> User:
        """`user` with the claim of a sign-in made now under `generation`."""
        claim = {"generation": generation, "signed_in_at": int(self._clock())}
        user.metadata = {**(user.metadata or {}), CLAIM: claim}
        return user

    def claim_problem(self, metadata: Any) -> str | None:
        """Why a token's own claim is not good (missing, malformed, too old); None when it is."""
        claim = metadata.get(CLAIM) if isinstance(metadata, dict) else None
        if not isinstance(claim, dict):
            return f"This sign-in is from an older version of the app. {SIGN_IN_AGAIN}"
        generation = claim.get("generation")
        signed_in_at = claim.get("signed_in_at")
        if type(generation) is not int or type(signed_in_at) not in (int, float):
            return f"This sign-in is not valid. {SIGN_IN_AGAIN}"
        age = self._clock() - signed_in_at
        if age > self.lifetime_seconds or age < -CLOCK_SKEW_SECONDS:
            return f"This sign-in has expired. {SIGN_IN_AGAIN}"
        return None

    async def problem(self, user: User) -> str | None:
        """Why the user a token decoded to may no longer use it; None when they may."""
        if problem := self.claim_problem(user.metadata):
            return problem
        if not self.revocable:
            return None
        state = await self._state(user.identifier)
        if state is None:
            return None  # the database cannot answer: see the module's docstring
        if not state.exists:
            return f"This account does not exist. {SIGN_IN_AGAIN}" if self.mode == "password" else None
        if state.disabled:
            return "This account was removed."
        if user.metadata[CLAIM]["generation"] != state.generation:
            return f"This sign-in has ended (signed out, or the password or role changed). {SIGN_IN_AGAIN}"
        return await self.recheck(user) if self.recheck is not None else None

    async def token_problem(self, token: str | None) -> str | None:
        """`problem` for a raw token; None also for no token or one Chainlit itself will refuse."""
        if not token or self.mode == "anonymous":
            return None
        try:
            user = decode_jwt(token)
        except Exception:  # a bad signature or an expired token: Chainlit answers 401 itself
            return None
        return await self.problem(user)

    async def end(self, token: str | None) -> bool:
        """Sign-out: end every sign-in of the token's account, at once here; False when the token was
        no longer good (nothing to end) or has no account to end sessions of."""
        if not self.revocable or await self.token_problem(token) is not None:
            return False
        identifier = decode_jwt(token).identifier  # type: ignore[arg-type]
        assert self.accounts is not None
        try:
            generation = await self.accounts.end_sessions(identifier)
        except Exception as error:
            logger.warning("sign-out of %s could not end its other sessions: %s", identifier, error)
            return False
        if generation is None:
            return False
        logger.info("signed %s out of every session", identifier)
        return True

    async def _state(self, identifier: str) -> AccountState | None:
        """The account as the database has it now; None when the database cannot answer."""
        assert self.accounts is not None
        try:
            account = await self.accounts.get(identifier)
        except Exception as error:
            logger.warning("session check of %s skipped: %s", identifier, error)
            return None
        if account is None:
            return AccountState(False, False, 0)
        return AccountState(True, account.disabled, account.generation)
