"""Edit and regenerate on the shared password server (tiny model, SQLite), over socket.io as the page
sends them: the stored conversation and the model's next prompt hold only the new branch, a reload
shows only it, ids that are not one's own change nothing, and a running answer is aborted first.

What the model is given is read from vLLM's own prompt-token counter (`prompt_tokens_of`): a long
first turn shows in every later prompt until an edit removes it."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from harness.waiting import WAIT_SECONDS
from services.chat.rewinds import NOT_LAST, NOT_YOURS
from tests.system.conftest import ALICE, BOB
from tests.system.helpers import (
    LONG_TURN_WORDS,
    answers,
    done,
    prompt_tokens_of,
    said,
    signed_in,
    thread_when,
)

in_loop = pytest.mark.asyncio(loop_scope="module")

LONG_ANSWER_TOKENS = 2000  # an answer that runs for minutes on the tiny model here
LONG_QUESTION = "Here is a long list. " + " ".join(f"entry{i}" for i in range(LONG_TURN_WORDS))
ABORTED_WITHIN_SECONDS = 15  # far below the minutes the long answer would run


async def told(client: ChatClient, text: str, timeout: float = WAIT_SECONDS) -> None:
    """Wait until the server showed `text` in this client's chat."""
    for _ in range(int(timeout / 0.05)):
        if any(name == "new_message" and isinstance(data, dict) and data.get("output") == text
               for name, data in client.events):  # fmt: skip
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never told {text!r}")


async def button_on(
    client: ChatClient, answer_id: str | None, timeout: float = WAIT_SECONDS
) -> dict[str, Any]:
    """The Regenerate button, once the server shows it on `answer_id` (it comes after the answer)."""
    for _ in range(int(timeout / 0.05)):
        shown = client.regenerate_action()
        if shown is not None and shown["forId"] == answer_id:
            return shown
        await asyncio.sleep(0.05)
    raise AssertionError(f"no Regenerate button on {answer_id}: {client.actions}")


@in_loop
async def test_an_edit_leaves_only_the_new_branch_stored_shown_and_prompted(
    password_server: AppServer,
) -> None:
    alice = await signed_in(password_server, ALICE)
    assert (await alice.ask(LONG_QUESTION)).final is not None
    first = alice.sent[0]["id"]
    with_long_turn = await prompt_tokens_of(password_server, alice, "And then?")
    assert with_long_turn > LONG_TURN_WORDS, "the long turn is in every later prompt"
    old_answers = {r for r in alice.messages if alice.messages[r].get("type") == "assistant_message"}
    new = await done(await alice.edit(first, "Say hello."))
    assert new.final and new.message_id not in old_answers
    thread_id = await alice.conversation_id()
    thread = await thread_when(
        alice,
        thread_id,
        lambda steps: said(steps, "user_message") == ["Say hello."] and len(answers(steps)) == 1,
    )
    assert [s["id"] for s in thread["steps"] if s["type"] == "user_message"] == [first], "edited in place"
    assert answers(thread["steps"])[0]["id"] == new.message_id
    assert not any("entry1" in s["output"] or s["output"] == "And then?" for s in thread["steps"])
    after_edit = await prompt_tokens_of(password_server, alice, "And then?")
    assert after_edit < LONG_TURN_WORDS < with_long_turn, (after_edit, with_long_turn)
    await alice.leave()
    reloaded = ChatClient(password_server.base_url, cookie=alice.cookie)
    resumed = await reloaded.resume(thread_id)
    assert said(resumed["steps"], "user_message") == ["Say hello.", "And then?"]
    after_reload = await prompt_tokens_of(password_server, reloaded, "And then?")
    assert after_reload < LONG_TURN_WORDS, "a reload feeds the model the new branch only"
    await reloaded.close()


@in_loop
async def test_nobody_edits_anothers_message_or_a_made_up_one(password_server: AppServer) -> None:
    alice, bob = await signed_in(password_server, ALICE), await signed_in(password_server, BOB)
    assert (await alice.ask("Alice's plan stays hers.")).final is not None
    assert (await bob.ask("Bob's own question.")).final is not None
    alice_thread = await alice.conversation_id()
    before = await thread_when(alice, alice_thread, lambda steps: len(answers(steps)) == 1)
    for hostile in (alice.sent[0]["id"], str(uuid.uuid4())):
        await bob.edit(hostile, "Bob was here.")
        await told(bob, NOT_YOURS)
        bob.events.clear()
    await bob.edit("not-an-id", "Bob was here.")  # not a page's id: dropped at the edge (socket_events.py)
    await asyncio.sleep(1)  # what a wrongly accepted edit would have written has landed by now
    after = await thread_when(alice, alice_thread, lambda steps: len(answers(steps)) == 1)
    assert [(s["id"], s["output"]) for s in after["steps"]] == [
        (s["id"], s["output"]) for s in before["steps"]
    ]
    bob_thread = await thread_when(bob, bob.thread_id or "", lambda steps: len(answers(steps)) == 1)
    assert said(bob_thread["steps"], "user_message") == ["Bob's own question."], "Bob's own is untouched too"
    await alice.close()
    await bob.close()


@in_loop
async def test_an_edit_while_an_answer_streams_aborts_it_first(password_server: AppServer) -> None:
    alice = await signed_in(password_server, ALICE)
    streaming = await alice.start_long_answer(max_new_tokens=LONG_ANSWER_TOKENS)
    await alice.update_settings(max_new_tokens=8)
    edited = await done(await alice.edit(alice.sent[-1]["id"], "Just say hi."))
    assert edited.final is not None and edited.message_id != streaming.message_id
    # The long answer would run for minutes (a few tokens a second here): the engine is idle at once
    # (a second or two at most with a core busy elsewhere, by the abort's path).
    await password_server.poll(
        lambda s: s["engine_unfinished_requests"] == 0 and s["turns_in_flight"] == 0, ABORTED_WITHIN_SECONDS
    )
    assert len(streaming.streamed) < LONG_ANSWER_TOKENS
    thread = await thread_when(alice, alice.thread_id or "", lambda steps: len(answers(steps)) == 1)
    assert said(thread["steps"], "user_message") == ["Just say hi."]
    assert answers(thread["steps"])[0]["id"] == edited.message_id, "the aborted answer is not kept"
    await alice.close()


@in_loop
async def test_an_edit_sent_at_once_waits_for_its_message_to_be_stored(password_server: AppServer) -> None:
    """The edit comes as soon as the page shows the conversation, while the message's own write may
    still be under way: it is cut all the same, and the answer it stopped is not stored."""
    alice = await signed_in(password_server, ALICE)
    await alice.update_settings(max_new_tokens=LONG_ANSWER_TOKENS, temperature=1.0)
    await alice.send("Tell me everything you know.")
    await alice.conversation_id()
    await alice.update_settings(max_new_tokens=8)
    edited = await done(await alice.edit(alice.sent[-1]["id"], "Just say hi."))
    assert edited.final is not None
    thread = await thread_when(alice, alice.thread_id or "", lambda steps: len(answers(steps)) == 1)
    assert said(thread["steps"], "user_message") == ["Just say hi."]
    assert answers(thread["steps"])[0]["id"] == edited.message_id
    await alice.close()


@in_loop
async def test_regenerate_replaces_the_last_answer_only(password_server: AppServer) -> None:
    alice, bob = await signed_in(password_server, ALICE), await signed_in(password_server, BOB)
    first = await alice.ask("Name a colour.")
    second = await alice.ask("Name a fruit.")
    shown = await button_on(alice, second.message_id)
    assert shown["payload"] == {"answer_id": second.message_id}
    assert len(alice.actions) == 1, "the button left the older answer"
    stale = {
        **shown,
        "id": str(uuid.uuid4()),
        "forId": first.message_id,
        "payload": {"answer_id": first.message_id},
    }
    response, _ = await alice.regenerate(stale)
    assert response.status_code == 200
    await told(alice, NOT_LAST)
    as_bob = await bob.http("POST", "/project/action", json={"sessionId": alice.session_id, "action": shown})
    assert as_bob.status_code in (401, 403), "Bob cannot press Alice's buttons"
    response, again = await alice.regenerate()
    assert response.status_code == 200
    await done(again)
    assert again.final and again.message_id not in (first.message_id, second.message_id)
    thread = await thread_when(
        alice,
        alice.thread_id or "",
        lambda steps: [a["id"] for a in answers(steps)] == [first.message_id, again.message_id],
    )
    assert said(thread["steps"], "user_message") == ["Name a colour.", "Name a fruit."]
    assert second.final not in [s["output"] for s in thread["steps"] if s["id"] == second.message_id]
    await button_on(alice, again.message_id)
    await alice.close()
    await bob.close()
