"""A raw asyncio server on a free loopback port, for tests that need an HTTP peer to misbehave exactly
(a stream that never ends, an oversized or broken listing): subclasses write the bytes in `_answer`."""

from __future__ import annotations

import asyncio
from typing import Self


class LoopbackHttp:
    """Listens on 127.0.0.1 inside `async with`; `url` is its base URL; `close` refuses new connections."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Self:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop listening: new connections are refused."""
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
