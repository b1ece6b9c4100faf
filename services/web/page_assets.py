"""Chainlit's page without the internet: Inter and KaTeX's CSS served by the app, not by CDNs.

Chainlit 2.12's index.html loads the Inter font from Google Fonts (with preconnects) and KaTeX's
CSS from jsDelivr. scripts/setup.sh installs both from the npm registry (`assets/package.json`:
@fontsource/inter and katex at the version Chainlit's bundle was built with); this module serves
them under /vendor/ and rewrites the page to use them. Without the install the page still loads
nothing from outside: it falls back to the system font (and says so in the log, once).
The page is served with the Content-Security-Policy plus the hashes of its inline scripts.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from chainlit import server as chainlit_server
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.routing import Mount, Route

from services.web.headers import page_policy

logger = logging.getLogger(__name__)

ASSETS = Path(__file__).resolve().parents[2] / "assets" / "node_modules"
VENDOR = {"inter": ASSETS / "@fontsource" / "inter", "katex": ASSETS / "katex" / "dist"}
INTER_WEIGHTS = (400, 500, 700)  # the weights Chainlit's Google Fonts link asks for
_PRECONNECT = re.compile(r'\s*<link rel="preconnect"[^>]*/>')
_FONT = re.compile(r"<!-- FONT START -->.*?<!-- FONT END -->", re.DOTALL)
_KATEX = re.compile(r'<link\s+rel="stylesheet"\s+href="https://cdn\.jsdelivr\.net/npm/katex[^"]*"\s*/>')


def assets_installed() -> bool:
    return all(path.is_dir() for path in VENDOR.values())


def offline_page(html: str, root_path: str = "", installed: bool = True) -> str:
    """Chainlit's page with every link to a CDN replaced by the app's own copy (or dropped)."""
    html = _PRECONNECT.sub("", html)
    fonts = "".join(
        f'<link rel="stylesheet" href="{root_path}/vendor/inter/{w}.css" />' for w in INTER_WEIGHTS
    )
    katex = f'<link rel="stylesheet" href="{root_path}/vendor/katex/katex.min.css" />'
    html = _FONT.sub(lambda _: f"<!-- FONT START -->{fonts if installed else ''}<!-- FONT END -->", html)
    return _KATEX.sub(lambda _: katex if installed else "", html)


def install_page_assets(app: FastAPI, content_security_policy: str) -> None:
    """Serve /vendor/* and put an offline page route where Chainlit's catch-all page route is."""
    installed = assets_installed()
    if not installed:
        logger.warning(
            "page assets missing (%s): run scripts/setup.sh; the page uses the system font", ASSETS
        )

    async def page(request: Request) -> HTMLResponse:
        root_path = os.getenv("CHAINLIT_PARENT_ROOT_PATH", "") + os.getenv("CHAINLIT_ROOT_PATH", "")
        html = offline_page(chainlit_server.get_html_template(root_path), root_path.rstrip("/"), installed)
        policy = page_policy(content_security_policy, html)
        return HTMLResponse(html, headers={"Content-Security-Policy": policy})

    routes = app.router.routes
    catch_all = next(i for i, r in enumerate(routes) if getattr(r, "path", "") == "/{full_path:path}")
    mounts = [
        Mount(f"/vendor/{name}", StaticFiles(directory=path)) for name, path in VENDOR.items() if installed
    ]
    routes[catch_all:catch_all] = [*mounts, Route("/{full_path:path}", page, methods=["GET"])]
