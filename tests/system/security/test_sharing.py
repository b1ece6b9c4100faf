"""`allow_thread_sharing = false` means no conversation can be shared: Chainlit 2.12 serves its share
routes whatever that setting says, so a signed-in person could publish a conversation to anyone."""

from __future__ import annotations

import json

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.helpers import stored_thread
from tests.system.security.conftest import ALICE, BOB

in_loop = pytest.mark.asyncio(loop_scope="package")


@in_loop
async def test_share_routes_answer_404_while_sharing_is_off(target: AppServer) -> None:
    alice, bob = ChatClient(target.base_url, *ALICE), ChatClient(target.base_url, *BOB)
    await alice.connect()
    await bob.connect()
    try:
        assert (await alice.ask("Something to share.")).final is not None
        thread_id = alice.thread_id
        assert thread_id
        await stored_thread(alice, thread_id, steps=2)
        shared = await alice.http(
            "PUT", "/project/thread/share", json={"threadId": thread_id, "isShared": True}
        )
        assert shared.status_code == 404, shared.text
        for reader in (bob, alice):
            seen = await reader.http("GET", f"/project/share/{thread_id}")
            assert seen.status_code == 404 and "Something to share" not in seen.text, seen.text
        async with httpx.AsyncClient(base_url=target.base_url) as anonymous:
            seen = await anonymous.get(f"/project/share/{thread_id}")
        assert seen.status_code == 404 and "Something to share" not in seen.text, seen.text
        thread = await stored_thread(alice, thread_id, steps=2)
        metadata = thread.get("metadata") or {}
        metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
        assert not metadata.get("is_shared"), "the conversation was marked shared"
    finally:
        await alice.close()
        await bob.close()
