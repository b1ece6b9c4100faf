"""The /admin routes: one route for /admin and everything under it, in front of Chainlit's catch-all
page, so that no path under /admin reaches anything before the administrator check (gate.py).

    GET  /admin                     the first section (accounts)
    GET  /admin/<section>           a section's page (sections.py)
    POST /admin/<section>/<action>  a section's action: Origin, CSRF token and form checked first
    GET  /admin/audit.csv           the audit log as CSV, with the page's filters
    GET  /admin/usage.csv           usage per person per day as CSV, with the page's filters
    GET  /admin/admin.css           the page's style sheet

The edge's guards apply as to every route (services/web/edge.py): the body limit, the client's
address, local mode's "this machine only", the safety headers and Content-Security-Policy. Every
answer is `Cache-Control: no-store`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from services.accounts.actions import AccountActions
from services.accounts.keys import ApiKeyStore
from services.admin.accounts_section import ACCOUNTS, KEYS
from services.admin.audit_section import AUDIT, audit_csv
from services.admin.gate import Admin, AdminGate, Origins, Refusal
from services.admin.html import Html, layout
from services.admin.live import LIVE
from services.admin.sections import ActionError, Section, Visit
from services.admin.usage_section import USAGE, usage_csv_text
from services.runtime import Runtime

logger = logging.getLogger(__name__)

STYLE = (Path(__file__).parent / "static" / "admin.css").read_text()
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
NO_STORE = {"Cache-Control": "no-store"}
# The sections in the order of the navigation; the first is /admin's own page (sections.py: adding one).
SECTIONS: tuple[Section, ...] = (ACCOUNTS, KEYS, USAGE, LIVE, AUDIT)


class AdminPages:
    """Serves every /admin request for one runtime and its sections."""

    def __init__(self, runtime: Runtime, origins: Origins, sections: tuple[Section, ...]) -> None:
        self.runtime = runtime
        self.gate = AdminGate(runtime.sign_in, origins)
        self.sections = {section.slug: section for section in sections}
        self.nav = [(section.slug, section.title) for section in sections]
        history = runtime.history
        engine = history.engine if history is not None else None
        api_keys = runtime.api.keys if runtime.api is not None else None
        self.keys = api_keys or (ApiKeyStore(engine, runtime.settings.api_keys_per_user) if engine else None)
        self.audit = history.audit if history is not None else None

    async def handle(self, request: Request) -> Response:
        try:
            admin = await self.gate.admin(request)
            return await self._serve(request, admin)
        except Refusal as refusal:
            if refusal.location:
                return RedirectResponse(refusal.location, 303, headers=NO_STORE)
            return PlainTextResponse(refusal.message, refusal.status, headers=NO_STORE)

    def _visit(self, request: Request, admin: Admin) -> Visit:
        sign_in = self.runtime.sign_in
        address = request.client.host if request.client else None
        changes = None
        if sign_in is not None and sign_in.accounts is not None and self.keys is not None:
            who = admin.identifier
            changes = AccountActions(sign_in.accounts, self.keys, self.audit, who, "admin", address)
        query = {key: value[:200] for key, value in request.query_params.items()}
        return Visit(self.runtime, admin, address, query, changes, self.audit)

    async def _serve(self, request: Request, admin: Admin) -> Response:
        parts = [part for part in request.path_params.get("rest", "").split("/") if part]
        method = "GET" if request.method == "HEAD" else request.method
        if method == "GET" and parts == ["admin.css"]:
            return Response(STYLE, media_type="text/css", headers=NO_STORE)
        visit = self._visit(request, admin)
        if method == "GET" and parts in (["audit.csv"], ["usage.csv"]):
            return await self._csv(visit, parts[0])
        if len(parts) > 2 or (parts and parts[0] not in self.sections):
            return PlainTextResponse("Not Found", 404, headers=NO_STORE)
        section = self.sections[parts[0]] if parts else next(iter(self.sections.values()))
        if method == "GET" and len(parts) <= 1:
            return await self._page(section, visit)
        if method == "POST" and len(parts) == 2 and parts[1] in section.actions:
            form = await self.gate.form(request, admin)
            return await self._act(section, parts[1], visit, form)
        if len(parts) == 2 and parts[1] not in section.actions:
            return PlainTextResponse("Not Found", 404, headers=NO_STORE)
        return PlainTextResponse("Method Not Allowed", 405, headers=NO_STORE)

    async def _act(self, section: Section, action: str, visit: Visit, form: dict[str, str]) -> Response:
        try:
            notice = await section.actions[action](visit, form)
        except ActionError as error:
            return await self._page(section, visit, error=str(error), status=400)
        return await self._page(section, visit, notice=notice)

    async def _page(
        self,
        section: Section,
        visit: Visit,
        notice: str | None = None,
        error: str | None = None,
        status: int = 200,
    ) -> Response:
        try:
            body = await section.page(visit)
        except ActionError as problem:
            body = Html("")
            error = error or str(problem)
            status = 400 if status == 200 else status
        except Exception as problem:  # the database is down: say so, keep serving
            logger.warning("admin page %s failed: %s", section.slug, type(problem).__name__)
            error = "The database cannot be reached right now. Try again shortly."
            status = 503
            body = Html("")
        html = layout(section.title, self.nav, section.slug, visit.admin.identifier, body, notice, error)
        return HTMLResponse(html, status, headers=NO_STORE)

    async def _csv(self, visit: Visit, name: str) -> Response:
        try:
            text = await (audit_csv(visit) if name == "audit.csv" else usage_csv_text(visit))
        except ActionError as error:
            return PlainTextResponse(str(error), 400, headers=NO_STORE)
        filename = "audit-log.csv" if name == "audit.csv" else "usage.csv"
        disposition = {"Content-Disposition": f'attachment; filename="{filename}"'}
        return Response(text, media_type="text/csv; charset=utf-8", headers={**NO_STORE, **disposition})


def install_admin(
    app: FastAPI, runtime: Runtime, origins: Origins, sections: tuple[Section, ...] | None = None
) -> None:
    """Put /admin and everything under it in front of Chainlit's routes."""
    pages = AdminPages(runtime, origins, sections or SECTIONS)
    app.router.routes[0:0] = [
        Route("/admin", pages.handle, methods=METHODS, include_in_schema=False),
        Route("/admin/{rest:path}", pages.handle, methods=METHODS, include_in_schema=False),
    ]
