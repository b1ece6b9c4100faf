"""Who may read the operators' routes (/status, /metrics, /stats, /healthz in detail): holders of
OPS_TOKEN; without one (allowed on a loopback bind only), local requests that no proxy forwarded.

Those routes show process ids, memory, queue lengths and session counts: on an address other
machines can reach, the app refuses to start without OPS_TOKEN, as it refuses to start without
sign-in (services/accounts/sign_in.py). A loopback bind may still sit behind a proxy on the same
machine; its forwarded requests do not count as local.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from services.accounts.addresses import is_loopback
from services.accounts.local import forwarding_header
from services.config import Settings, SettingsError


def require_ops_token(settings: Settings, bind_host: str) -> None:
    """Raise SettingsError (with what to do) for an address others can reach and no OPS_TOKEN."""
    if settings.ops_token or is_loopback(bind_host):
        return
    raise SettingsError(
        f"Refusing to start: the app is bound to {bind_host}, which other machines can reach, and "
        "OPS_TOKEN is empty, so /status, /metrics and /stats would be open to everyone.\n"
        "Set OPS_TOKEN to a long random secret, e.g. "
        "OPS_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))'),\n"
        "and give your monitoring `Authorization: Bearer <OPS_TOKEN>`; /healthz stays open (without "
        "detail) for load balancers. Or bind to 127.0.0.1 (the default)."
    )


def operator_refusal(
    ops_token: str, authorization: str, client_host: str | None, headers: Mapping[str, str]
) -> tuple[int, str] | None:
    """None when the request may read the operators' routes; else (status, why)."""
    if ops_token:
        if hmac.compare_digest(authorization.encode(), f"Bearer {ops_token}".encode()):
            return None
        return 401, "needs Authorization: Bearer <OPS_TOKEN>"
    if is_loopback(client_host) and forwarding_header(headers) is None:
        return None
    return 403, "without OPS_TOKEN, the operators' routes answer only local requests"
