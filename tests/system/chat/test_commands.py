"""The chat's commands on the shared password server: the page's `/` menu lists what each person may
use, and a command picked from it is answered by the service (never the model), stored as the typed
words and offered again when the conversation is opened later."""

from __future__ import annotations

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.system.conftest import ADMIN, ALICE
from tests.system.helpers import answers, said, stored_thread

in_loop = pytest.mark.asyncio(loop_scope="module")
EVERYONES = {"help", "export", "import", "share", "preset", "template", "quota", "key"}


@in_loop
async def test_a_command_picked_from_the_menu_acts_as_the_typed_one(password_server: AppServer) -> None:
    alice = ChatClient(password_server.base_url, *ALICE)
    await alice.connect()
    try:
        assert {c["id"] for c in await alice.offered_commands()} == EVERYONES, "no /stats for a user"
        helped = await alice.ask("", command="help", timeout=30)
        assert helped.final is not None and "`/export`" in helped.final and "/stats" not in helped.final
        shown = await alice.ask("show", command="preset", timeout=30)
        assert shown.final is not None and "default" in shown.final.lower(), shown.final
        thread_id = await alice.conversation_id()
        thread = await stored_thread(alice, thread_id, steps=2, containing="/preset show")
        assert said(thread["steps"], "user_message") == ["/help", "/preset show"]
        assert not answers(thread["steps"]), "the model answered neither"
        later = ChatClient(password_server.base_url, cookie=alice.cookie)
        await later.resume(thread_id)
        assert {c["id"] for c in await later.offered_commands()} == EVERYONES
        await later.close()
    finally:
        await alice.close()


@in_loop
async def test_an_administrator_is_offered_the_operators_view(password_server: AppServer) -> None:
    admin = ChatClient(password_server.base_url, *ADMIN)
    await admin.connect()
    try:
        assert {c["id"] for c in await admin.offered_commands()} == EVERYONES | {"stats"}
    finally:
        await admin.close()
