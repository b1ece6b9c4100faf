"""What the fuzz tests found, each pinned by a plain test: input Chainlit 2.12 or python-socketio did
not expect may not move another person's message, leave sessions behind, or end in a 500 or a
traceback. The fuzz tests (test_fuzz_*.py) look for more of the same; these say what was fixed."""

from __future__ import annotations

import asyncio

import pytest

from harness.chat_client import ChatClient, user_message_payload
from harness.server import AppServer
from tests.security.conftest import BobsConversation, Intact

in_loop = pytest.mark.asyncio(loop_scope="package")


async def signed_in_page(server: AppServer, cookie: str) -> ChatClient:
    page = ChatClient(server.base_url, cookie=cookie)
    await page.connect()
    return page


@in_loop
async def test_a_message_cannot_take_the_id_of_someone_elses_message(
    target: AppServer, alice_cookie: str, bob: BobsConversation, intact: Intact
) -> None:
    """Chainlit stores a user message under the id the browser chose, with `ON CONFLICT (id) DO
    UPDATE`: Alice sending Bob's message id moved his message into her conversation."""
    alice = await signed_in_page(target, alice_cookie)
    mark = intact.mark()
    for bobs_step in bob.step_ids:
        taken = user_message_payload("Mine now.")
        taken["message"]["id"] = bobs_step
        await alice.sio.emit("client_message", taken)
    assert (await alice.ask("And this one?")).final is not None
    await alice.close()
    await asyncio.sleep(1)  # the steps are written in tasks of their own
    assert not bob.changes()
    assert not intact.problems(mark)
