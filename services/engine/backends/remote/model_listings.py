"""Reading the vLLM servers' `/v1/models` over HTTP: at start, and again every ENGINE_MODELS_REFRESH_SECONDS.

What a listing may hold is listing.py's; here a server that does not answer, answers an error or an
oversized page is told apart from one that lists nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import httpx

from services.engine.backends.remote.listing import Card, parse_listing
from services.engine.backends.remote.protocol import ServerUnreachableError
from services.engine.backends.remote.routing import Server

logger = logging.getLogger(__name__)
MAX_LISTING_BYTES = 4_000_000  # a /v1/models page larger than this is not read


async def read_listing(
    client: httpx.AsyncClient, server: Server, limit: int, timeout: float
) -> dict[str, Card]:
    """The server's models (at most `limit`); ServerUnreachableError when it does not list them."""
    try:
        async with client.stream("GET", f"{server.url}/v1/models", timeout=timeout) as response:
            response.raise_for_status()
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_LISTING_BYTES:
                    raise ValueError(f"a listing of more than {MAX_LISTING_BYTES} bytes")
        return parse_listing(httpx.Response(200, content=bytes(body)).json(), limit)
    except (httpx.HTTPError, ValueError) as error:
        message = f"vLLM server {server.url} did not list its models: {type(error).__name__}: {error}"
        raise ServerUnreachableError(message) from error


async def refresh_listings(
    client: httpx.AsyncClient, servers: Sequence[Server], limit: int, timeout: float
) -> None:
    """Read every server's listing again: one that answers is healthy and lists what it lists now;
    one that does not is failing and not `listed` (its last listing kept for when it answers again)."""

    async def refresh(server: Server) -> None:
        try:
            server.models = await read_listing(client, server, limit, timeout)
            server.healthy = server.listed = True
        except ServerUnreachableError as error:
            if server.listed:
                logger.warning("%s", error)
            server.healthy = server.listed = False

    await asyncio.gather(*(refresh(s) for s in servers))
