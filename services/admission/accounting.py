"""What admission tells the keeper of usage and budgets (services/usage implements it): a budget check
before a turn starts, what is left for each engine request and what it holds while it runs
(grants.py), the turns, documents and API calls admitted, the tokens used, the refusals.

Admission sits below the database, so it knows this only as a protocol; the runtime passes the
real one in. Every call but `check` is counting in memory: a turn never waits for the database.
"""

from __future__ import annotations

from typing import Protocol

from services.admission.grants import Room
from services.admission.refusals import Refused


class Accounting(Protocol):
    async def check(self, user_key: str) -> None:
        """Raise Refused when the person has used up a period's budget."""
        ...

    def rooms(self, user_key: str) -> list[Room]:
        """What is left in each period's budget of the person, as last checked, reserved tokens
        counted as used (none: no budget applies, or the person's totals are not known here)."""
        ...

    def reserve(self, user_key: str, tokens: int) -> None:
        """Hold `tokens` of the person's budgets for a request that runs now."""
        ...

    def release(self, user_key: str, tokens: int) -> None:
        """That request ended (its tokens were counted by `used`): give back what it held."""
        ...

    def started(self, user_key: str, api: bool, documents: int) -> None:
        """A chat turn (with `documents` new uploads) or an API request was admitted."""
        ...

    def used(self, user_key: str, prompt_tokens: int, answer_tokens: int) -> None:
        """An engine request of the person's finished: the tokens it read and wrote."""
        ...

    def refused(self, user_key: str, refusal: Refused) -> None:
        """The person was refused (a per-user limit, a budget, or a full service)."""
        ...


class NoAccounting:
    """Nothing is kept and no budget applies (no database, or USAGE_ACCOUNTING=false)."""

    async def check(self, user_key: str) -> None:
        pass

    def rooms(self, user_key: str) -> list[Room]:
        return []

    def reserve(self, user_key: str, tokens: int) -> None:
        pass

    def release(self, user_key: str, tokens: int) -> None:
        pass

    def started(self, user_key: str, api: bool, documents: int) -> None:
        pass

    def used(self, user_key: str, prompt_tokens: int, answer_tokens: int) -> None:
        pass

    def refused(self, user_key: str, refusal: Refused) -> None:
        pass
