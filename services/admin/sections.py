"""The admin page's sections, and how to add one.

A section is a page at /admin/<slug> and the actions its forms post to /admin/<slug>/<action>. The
routes (routes.py) do everything around it: only administrators get in, every POST has passed the
Origin and CSRF checks and is a bounded form (gate.py), and the page is laid out with the navigation.
A section only renders and acts:

    async def page(visit: Visit) -> Html:          # its body; visit.query holds the GET parameters
        ...
    async def act(visit: Visit, form: dict[str, str]) -> str:   # what to tell the administrator
        ...   # raise ActionError("why") for a refusal (400); record what it changed in visit.audit

    USAGE = Section("usage", "Usage and quotas", page, {"set-quota": act})

and one entry in `SECTIONS` (services/admin/routes.py). Forms use `html.post_form(f"/admin/usage/set-quota",
visit.admin.csrf_token, [...], "Set")`, which carries the CSRF token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.accounts.actions import AccountActions
from services.admin.gate import Admin
from services.admin.html import Html
from services.audit.log import AuditLog
from services.runtime import Runtime

ADMIN_LIST_MAX_ROWS = (
    200  # rows a section lists per table (accounts, API keys, audit entries); filters narrow it
)


class ActionError(ValueError):
    """An action refused (bad input, or a rule of the accounts): answered 400 with the message."""


@dataclass
class Visit:
    """One request to a section: the service, the administrator, what they asked."""

    runtime: Runtime
    admin: Admin
    address: str | None
    query: Mapping[str, str]
    changes: AccountActions | None  # accounts and keys, recorded with the administrator as actor
    audit: AuditLog | None

    async def record(self, action: str, target: str | None = None, **details: Any) -> None:
        """An audit entry by this administrator (for actions that are not account changes)."""
        if self.audit is not None:
            who = self.admin.identifier
            details = {"via": "admin", **details}
            await self.audit.record(who, action, target, details, self.address)


Page = Callable[[Visit], Awaitable[Html]]
Action = Callable[[Visit, dict[str, str]], Awaitable[str]]


@dataclass(frozen=True)
class Section:
    slug: str
    title: str
    page: Page
    actions: Mapping[str, Action] = field(default_factory=dict)
