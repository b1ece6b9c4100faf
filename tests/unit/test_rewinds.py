"""Edit and regenerate (services/chat/branch.py, rewinds.py, services/history/branches.py): the history
is cut at the right message, the next prompt carries only the new branch, a client's id that is not
this session's changes nothing, and the stored conversation loses the old branch on SQLite."""

from __future__ import annotations

import asyncio
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from harness.waiting import until
from services.admission.service import Admission
from services.admission.waiting_line import CHAT
from services.chat import branch, rewinds
from services.chat.service import ChatService
from services.chat.session import ChatSession
from services.chat.store import SessionStore
from services.chat.turns import ChatTurns, NothingKept
from services.config import Settings
from services.engine import SamplingSettings
from services.engine.load import EngineLoad
from services.history import branches
from services.history.database import create_engine
from services.history.migrations import migrate
from services.history.resume import turns_from_steps
from tests.fakes import FakePage, WordEngine


def make_turns(**changes: Any) -> tuple[ChatTurns, WordEngine]:
    engine = WordEngine()
    settings = Settings.from_env({}).replace(**{"max_new_tokens": 3, "max_model_len": 200, **changes})
    chat = ChatService(engine, settings)  # type: ignore[arg-type]
    admission = Admission(settings, EngineLoad(), max_running=64)
    return ChatTurns(SessionStore(settings), admission, chat, NothingKept()), engine


def new_id() -> str:
    return str(uuid.uuid4())


async def streaming(engine: WordEngine, earlier: int) -> None:
    """Return once a request after the `earlier` ones has sent its first word."""
    await until(lambda: len(engine.streamed) > earlier, "the answer streams")


def session_with(*messages: tuple[str, str, str | None], maxlen: int = 10) -> ChatSession:
    session = ChatSession("s", SamplingSettings(0.2, 1.0, 8), "system", deque(maxlen=maxlen))
    for role, content, step_id in messages:
        branch.record(session, {"role": role, "content": content}, step_id)
    return session


def test_rewind_cuts_the_history_at_the_first_message_of_the_cut() -> None:
    session = session_with(("user", "a", "u1"), ("assistant", "A", "a1"), ("user", "b", "u2"),
                           ("assistant", "B", "a2"))  # fmt: skip
    assert branch.rewind(session, {"u2"}) == ["u2", "a2"]
    assert [m["content"] for m in session.history] == ["a", "A"] and list(session.history_ids) == ["u1", "a1"]
    assert branch.rewind(session, {"nobody's", "other"}) == [] and len(session.history) == 2
    assert branch.rewind(session, {"a1", "u1"}) == ["u1", "a1"]
    assert not session.history and not session.history_ids


def test_ids_stay_aligned_when_the_bound_drops_the_oldest_and_for_messages_without_ids() -> None:
    session = session_with(*[("user" if i % 2 == 0 else "assistant", str(i), f"id{i}") for i in range(7)],
                           maxlen=4)  # fmt: skip
    assert list(session.history_ids) == ["id3", "id4", "id5", "id6"]
    assert [m["content"] for m in session.history] == ["3", "4", "5", "6"]
    session.history.clear()  # cleared or added to without branch.py: the ids follow
    assert branch.rewind(session, {"id6"}) == [] and not session.history_ids
    session.history.append({"role": "user", "content": "added without an id"})
    branch.record(session, {"role": "assistant", "content": "answer"}, "id8")
    assert list(session.history_ids) == [None, "id8"]
    assert branch.rewind(session, {"id8"}) == ["id8"] and [m["content"] for m in session.history] == [
        "added without an id"
    ]


def test_only_the_last_answered_exchange_may_be_regenerated() -> None:
    session = session_with(("user", "a", "u1"), ("assistant", "A", "a1"))
    assert branch.last_turn(session) == branch.LastTurn("u1", "a1", "a")
    branch.record(session, {"role": "user", "content": "b"}, "u2")  # refused or failed: no answer
    assert branch.last_turn(session) is None
    assert branch.knows_user_message(session, "u2") and branch.knows_user_message(session, "u1")
    assert not branch.knows_user_message(session, "a1"), "an answer is not a message one may edit"
    assert not branch.knows_user_message(session, new_id())


def test_a_resumed_conversation_keeps_the_ids_of_its_stored_messages() -> None:
    steps = [
        {"id": "u1", "type": "user_message", "output": "hello"},
        {"id": "n1", "type": "assistant_message", "output": "a notice", "metadata": "{}"},
        {"id": "a1", "type": "assistant_message", "output": "hi", "metadata": '{"answer": true}'},
        {"id": "c1", "type": "user_message", "output": "/stats"},
    ]
    assert [(m["content"], i) for m, i in turns_from_steps(steps, 100)] == [("hello", "u1"), ("hi", "a1")]


async def answered(turns: ChatTurns, page: FakePage, text: str) -> str:
    message_id = new_id()
    await turns.answer(page, text, [], message_id)
    return message_id


@pytest.mark.asyncio(loop_scope="function")
async def test_an_edit_leaves_only_the_new_branch_in_what_the_model_sees() -> None:
    turns, engine = make_turns()
    page = FakePage()
    first = await answered(turns, page, "first question")
    second = await answered(turns, page, "second question")
    await answered(turns, page, "third question")
    await rewinds.edit(turns, page, second, "edited question")
    session = turns.sessions.get(page.session_id)
    assert session is not None
    assert [m["content"] for m in session.history] == ["first question", "word word word ",
                                                       "edited question", "word word word "]  # fmt: skip
    assert session.history_ids[0] == first and session.history_ids[2] == second
    await answered(turns, page, "next question")
    seen = " ".join(m["content"] for m in engine.prompts[-1])
    assert "edited question" in seen and "first question" in seen
    assert "second question" not in seen and "third question" not in seen, engine.prompts[-1]


@pytest.mark.asyncio(loop_scope="function")
async def test_an_edit_of_an_id_this_session_never_sent_changes_nothing() -> None:
    turns, engine = make_turns(max_new_tokens=40)
    page = FakePage()
    await answered(turns, page, "mine")
    other = FakePage()
    other.session_id = "tab-2"
    theirs = await answered(turns, other, "theirs")
    earlier = len(engine.streamed)
    running = asyncio.create_task(turns.answer(page, "still answering", [], new_id()))
    await streaming(engine, earlier)
    for hostile in (theirs, new_id()):
        await rewinds.edit(turns, page, hostile, "taken over")
    assert page.shown.count(("error", rewinds.NOT_YOURS)) == 2
    assert not running.done() and not engine.aborted, "a refused edit aborts nothing"
    await running
    session, theirs_session = turns.sessions.get("tab-1"), turns.sessions.get("tab-2")
    assert session is not None and theirs_session is not None
    assert theirs_session.history[0]["content"] == "theirs"
    assert "taken over" not in str(list(session.history)) + str(list(theirs_session.history))


@pytest.mark.asyncio(loop_scope="function")
async def test_an_edit_while_an_answer_streams_aborts_it_first() -> None:
    turns, engine = make_turns(max_new_tokens=200)
    page = FakePage()
    message_id = new_id()
    running = asyncio.create_task(turns.answer(page, "long question", [], message_id))
    await streaming(engine, 0)
    await rewinds.edit(turns, page, message_id, "short question")
    with pytest.raises(asyncio.CancelledError):
        await running
    assert len(engine.aborted) == 1, "the running answer's engine request was aborted"
    stopped = page.replies[0].id
    assert ("removed", [stopped]) in page.shown, "the stopped answer leaves the page, late or not"
    session = turns.sessions.get(page.session_id)
    assert session is not None and session.history[0]["content"] == "short question"
    assert len(session.history) == 2 and "long question" not in str(engine.prompts[-1])


@pytest.mark.asyncio(loop_scope="function")
async def test_regenerate_answers_the_last_message_again_hotter_and_refuses_older_answers() -> None:
    turns, engine = make_turns()
    page = FakePage()
    await answered(turns, page, "one")
    older = page.replies[-1].id
    question = await answered(turns, page, "two")
    last = page.replies[-1].id
    assert page.shown[-1] == ("regenerate offered", last), "the button moves to the newest answer"
    await rewinds.regenerate(turns, page, older)
    assert page.shown[-1] == ("error", rewinds.NOT_LAST) and len(engine.prompts) == 2
    await rewinds.regenerate(turns, page, last)
    session = turns.sessions.get(page.session_id)
    assert session is not None
    assert [m["content"] for m in session.history] == ["one", "word word word ", "two", "word word word "]
    assert list(session.history_ids)[2:] == [question, page.replies[-1].id]
    assert ("removed", [last]) in page.shown
    assert engine.prompts[-1] == engine.prompts[-2], "the same question, with the same history before it"
    assert (
        engine.samplings[-1].temperature
        == rewinds.REGENERATE_MIN_TEMPERATURE
        > engine.samplings[-2].temperature
    )


@pytest.mark.asyncio(loop_scope="function")
async def test_regenerate_of_the_answer_being_streamed_aborts_it() -> None:
    turns, engine = make_turns(max_new_tokens=200)
    page = FakePage()
    running = asyncio.create_task(turns.answer(page, "question", [], new_id()))
    await streaming(engine, 0)
    streamed = page.replies[-1].id
    await rewinds.regenerate(turns, page, streamed)
    await asyncio.gather(running, return_exceptions=True)
    assert len(engine.aborted) == 1 and len(engine.prompts) == 2
    session = turns.sessions.get(page.session_id)
    assert session is not None and [m["role"] for m in session.history] == ["user", "assistant"]
    assert session.history_ids[1] == page.replies[-1].id != streamed


async def names(engine) -> dict[str, str]:
    async with engine.connect() as connection:
        return {row[0]: row[1] for row in await connection.execute(text('SELECT "id", "name" FROM threads'))}


async def stored_steps(engine, thread_id: str) -> list[tuple[str, str]]:
    async with engine.connect() as connection:
        rows = await connection.execute(
            text('SELECT "id", "output" FROM steps WHERE "threadId" = :t ORDER BY "createdAt"'),
            {"t": thread_id},
        )
        return [(row[0], row[1]) for row in rows]


@pytest.mark.asyncio(loop_scope="function")
async def test_the_stored_conversation_is_cut_in_its_own_thread_only(tmp_path: Path) -> None:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    mine, theirs = new_id(), new_id()
    async with engine.begin() as connection:
        for thread, who in ((mine, "alice"), (theirs, "bob")):
            insert = (
                'INSERT INTO threads ("id", "userIdentifier", "name", "createdAt") VALUES (:id, :who, :n, :t)'
            )
            await connection.execute(  # named after its first message, as Chainlit names it
                text(insert), {"id": thread, "who": who, "n": "u1", "t": "2026-12-05T10:00:00Z"}
            )
        for n, (step, kind) in enumerate((("u1", "user_message"), ("a1", "assistant_message"),
                                          ("u2", "user_message"), ("a2", "assistant_message"))):  # fmt: skip
            for thread in (mine, theirs):
                await connection.execute(
                    text('INSERT INTO steps ("id", "threadId", "name", "type", "output", "createdAt") '
                         "VALUES (:id, :thread, 'x', :kind, :out, :at)"),
                    {"id": f"{step}-{thread}", "thread": thread, "kind": kind, "out": step,
                     "at": f"2026-12-05T10:00:0{n}.000000Z"},
                )  # fmt: skip
        await connection.execute(
            text('INSERT INTO feedbacks ("id", "forId", "threadId", "value") VALUES (:id, :for, :t, 1)'),
            {"id": new_id(), "for": f"a2-{mine}", "t": mine},
        )
    assert await branches.user_message_owned(engine, mine, "alice", f"u2-{mine}")
    assert not await branches.user_message_owned(engine, mine, "bob", f"u2-{mine}")
    assert not await branches.user_message_owned(engine, mine, "alice", f"u2-{theirs}")
    assert not await branches.user_message_owned(engine, mine, "alice", f"a2-{mine}")
    assert await branches.cut(engine, mine, f"u2-{theirs}", True, "x", 9) == [], "another thread's: nothing"
    cut = await branches.cut(engine, mine, f"u2-{mine}", True, "edited", 9)
    assert cut == [f"a2-{mine}"]
    assert await stored_steps(engine, mine) == [
        (f"u1-{mine}", "u1"),
        (f"a1-{mine}", "a1"),
        (f"u2-{mine}", "edited"),
    ]
    assert len(await stored_steps(engine, theirs)) == 4
    assert await branches.cut(engine, mine, f"a1-{mine}", False, None, 9) == [f"a1-{mine}", f"u2-{mine}"]
    await branches.cut(engine, mine, f"u1-{mine}", True, "a new first message", 9)
    assert await names(engine) == {mine: "a new fir", theirs: "u1"}, "named after the edited first message"
    async with engine.begin() as connection:
        await connection.execute(text('UPDATE threads SET "name" = \'Given\' WHERE "id" = :id'), {"id": mine})
    await branches.cut(engine, mine, f"u1-{mine}", True, "and again", 9)
    assert await names(engine) == {mine: "Given", theirs: "u1"}, "a name the person gave stays"
    async with engine.connect() as connection:
        assert (await connection.execute(text("SELECT COUNT(*) FROM feedbacks"))).scalar() == 0
    await engine.dispose()


@pytest.mark.asyncio(loop_scope="function")
async def test_an_edit_and_a_regenerate_wait_in_line_like_any_turn_and_are_told_where_they_stand() -> None:
    engine = WordEngine()
    settings = Settings.from_env({}).replace(
        max_new_tokens=3, max_model_len=400, admission_max_wait_seconds=600
    )
    admission = Admission(settings, EngineLoad(), max_running=1)
    chat = ChatService(admission.engine(engine, CHAT), settings)  # type: ignore[arg-type]  (as runtime.py builds it)
    turns = ChatTurns(SessionStore(settings), admission, chat, NothingKept())
    page, busy = FakePage(), FakePage()
    busy.session_id = "tab-2"
    turns.sessions.update_settings(turns.sessions.open(busy.session_id), {"max_new_tokens": 250})
    message_id = await answered(turns, page, "question")
    again = (
        lambda: rewinds.edit(turns, page, message_id, "edited"),
        lambda: rewinds.regenerate(turns, page, page.replies[-1].id),
    )
    for rewind in again:
        earlier = len(engine.streamed)
        engine_busy = asyncio.create_task(turns.answer(busy, "a long one", [], new_id()))  # 2.5 s
        await streaming(engine, earlier)
        waiting = asyncio.create_task(rewind())
        # The first status comes after feedback.QUIET_SECONDS, a second before the busy answer ends.
        await until(lambda: any(kind == "status" and text for kind, text in page.shown), "a status")
        assert not waiting.done(), page.shown
        await asyncio.gather(engine_busy, waiting)
        page.shown.clear()
    session = turns.sessions.get(page.session_id)
    assert session is not None and session.history[0]["content"] == "edited" and len(session.history) == 2
    assert len(engine.prompts) == 5 and engine.prompts[-1] == engine.prompts[-3], (
        "regenerated: the same prompt"
    )


@pytest.mark.asyncio(loop_scope="function")
async def test_a_regenerated_answer_goes_with_its_run_and_what_followed(tmp_path: Path) -> None:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    thread = new_id()
    steps = (("u1", "user_message", None), ("r1", "run", "u1"), ("a1", "assistant_message", "r1"),
             ("n1", "assistant_message", None))  # fmt: skip
    async with engine.begin() as connection:
        await connection.execute(
            text('INSERT INTO threads ("id", "createdAt") VALUES (:id, :t)'), {"id": thread, "t": "x"}
        )
        for n, (step, kind, parent) in enumerate(steps):
            columns = '"id", "threadId", "parentId", "name", "type", "output", "createdAt"'
            await connection.execute(
                text(f"INSERT INTO steps ({columns}) VALUES (:id, :thread, :parent, 'x', :kind, :id, :at)"),
                {
                    "id": step,
                    "thread": thread,
                    "parent": parent,
                    "kind": kind,
                    "at": f"2026-12-05T10:00:0{n}Z",
                },
            )
    assert await branches.cut(engine, thread, "a1", False, None, 9) == ["r1", "a1", "n1"]
    assert await stored_steps(engine, thread) == [("u1", "u1")]
    await engine.dispose()


def test_late_writes_of_a_cut_branch_are_dropped(tmp_path: Path) -> None:
    from prometheus_client import Counter

    from services.history.data_layer import ChatDataLayer
    from services.history.health import HistoryHealth

    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    layer = ChatDataLayer(
        create_engine(settings), HistoryHealth(), Counter("f", "f", registry=None), settings
    )
    thread, other = new_id(), new_id()
    layer.fence(thread, "kept", "2026-12-05T10:00:01Z", "2026-12-05T10:00:05Z")

    def step(step_id: str, at: str | None, thread_id: str = thread) -> dict[str, Any]:
        return {"id": step_id, "threadId": thread_id, "createdAt": at}

    assert layer._fenced(step("old answer", "2026-12-05T10:00:03.5Z")), "created in the cut branch"
    assert not layer._fenced(step("kept", "2026-12-05T10:00:01Z")), "the edited message itself"
    assert not layer._fenced(step("before", "2026-12-05T10:00:00.9Z"))
    assert not layer._fenced(step("new answer", "2026-12-05T10:00:05.000001Z"))
    assert not layer._fenced(step("elsewhere", "2026-12-05T10:00:03Z", other))
