"""Uploads not yet sent in a message, without a server: the bounds per chat and per person, their
refusals, expiry; then the rule on a real Chainlit session store (its `files` dict and folder) with
the sweep and the upload guard (on the real server: tests/system/security/test_unsent_uploads.py)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chainlit.config
import httpx
import pytest
from chainlit.session import WebsocketSession, ws_sessions_id, ws_sessions_sid
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse

from services.web.unsent_uploads import MB, Pending, Refusal, UnsentUploads, UploadBounds, duration
from services.web.upload_bounds import ChainlitUploads, UnsentUploadBounds
from tests.fakes import FakeClock

BOUNDS = UploadBounds(
    files_per_session=3, bytes_per_session=10 * MB, files_per_person=5, bytes_per_person=15 * MB,
    expiry_seconds=900,
)  # fmt: skip
ALICE, BOB = "user:alice", "user:bob"


def kept(uploads: UnsentUploads, session_id: str, person: str, size: int = 1000) -> str:
    """One upload admitted and written; its file id."""
    pending = uploads.admit(session_id, person, size)
    assert isinstance(pending, Pending), pending
    file_id = str(uuid.uuid4())
    assert uploads.keep(pending, file_id, size) is None
    return file_id


# --- the rule ---------------------------------------------------------------------------------------
def test_the_file_after_a_chats_bound_is_refused_with_a_sentence_the_page_shows() -> None:
    uploads = UnsentUploads(BOUNDS)
    for _ in range(3):
        kept(uploads, "chat", ALICE)
    refused = uploads.admit("chat", ALICE, 1000)
    assert isinstance(refused, Refusal) and refused.status == 429
    assert refused.detail == (
        "This chat already holds 3 uploaded files not yet sent (at most 3). "
        "Send them with a message first; files not sent within 15 minutes are deleted."
    )
    assert isinstance(uploads.admit("another chat", ALICE, 1000), Pending), "another chat has room"


def test_bytes_past_a_chats_bound_are_refused_by_the_declared_length() -> None:
    uploads = UnsentUploads(BOUNDS)
    kept(uploads, "chat", ALICE, 6 * MB)
    refused = uploads.admit("chat", ALICE, 5 * MB)
    assert isinstance(refused, Refusal) and refused.status == 413
    assert refused.detail.startswith("Uploaded files not yet sent may take 10 MB per chat.")
    assert isinstance(uploads.admit("chat", ALICE, 4 * MB), Pending)


def test_a_persons_bounds_count_every_chat_of_theirs_and_no_one_elses() -> None:
    uploads = UnsentUploads(BOUNDS)
    for chat in ("a", "a", "b", "b", "c"):
        kept(uploads, chat, ALICE)
    refused = uploads.admit("d", ALICE, 1000)
    assert isinstance(refused, Refusal) and refused.status == 429
    assert "You already hold 5 uploaded files not yet sent across your chats (at most 5)" in refused.detail
    assert isinstance(uploads.admit("e", BOB, 1000), Pending), "Bob is not Alice"
    uploads = UnsentUploads(BOUNDS)
    kept(uploads, "a", ALICE, 9 * MB)
    refused = uploads.admit("b", ALICE, 7 * MB)
    assert isinstance(refused, Refusal) and refused.status == 413
    assert "may take 15 MB across your chats" in refused.detail


def test_uploads_being_written_count_so_concurrent_ones_cannot_pass_the_bound() -> None:
    uploads = UnsentUploads(BOUNDS)
    pending = [uploads.admit("chat", ALICE, 1000) for _ in range(3)]
    assert all(isinstance(p, Pending) for p in pending)
    assert isinstance(uploads.admit("chat", ALICE, 1000), Refusal)
    uploads.release(pending[0])  # that one failed
    uploads.release(pending[0])  # twice changes nothing
    assert isinstance(uploads.admit("chat", ALICE, 1000), Pending)
    assert isinstance(uploads.admit("chat", ALICE, 1000), Refusal)


def test_a_body_without_length_is_refused_once_its_written_size_passes() -> None:
    uploads = UnsentUploads(BOUNDS)
    kept(uploads, "chat", ALICE, 8 * MB)
    pending = uploads.admit("chat", ALICE, 0)  # chunked: no Content-Length
    assert isinstance(pending, Pending)
    refused = uploads.keep(pending, "big", 3 * MB)
    assert isinstance(refused, Refusal) and refused.status == 413
    assert uploads.held("chat") == 1 and uploads.person_total(ALICE) == (1, 8 * MB)


def test_sent_files_free_their_place_and_never_expire() -> None:
    clock = FakeClock()
    uploads = UnsentUploads(BOUNDS, clock)
    sent = [kept(uploads, "chat", ALICE) for _ in range(3)]
    assert uploads.sent("chat", [*sent, "an answer's file"]) == sent, "only uploads were held"
    assert uploads.held("chat") == 0 and uploads.person_total(ALICE) == (0, 0)
    assert isinstance(uploads.admit("chat", ALICE, 1000), Pending)
    clock.now += 10 * BOUNDS.expiry_seconds
    assert uploads.expired() == []


def test_unsent_files_expire_after_the_expiry_and_free_their_place() -> None:
    clock = FakeClock()
    uploads = UnsentUploads(BOUNDS, clock)
    first = kept(uploads, "chat", ALICE)
    clock.now += 600
    second = kept(uploads, "chat", ALICE)
    pending = uploads.admit("chat", ALICE, 1000)  # still being written: never expired
    clock.now += 299
    assert uploads.expired() == []
    clock.now += 1
    assert uploads.expired() == [("chat", first)]
    clock.now += 600
    assert uploads.expired() == [("chat", second)]
    assert uploads.held("chat") == 1 and isinstance(pending, Pending)
    uploads.release(pending)
    assert uploads.session_ids() == [] and uploads.person_total(ALICE) == (0, 0)


def test_a_chat_whose_page_is_gone_is_forgotten_with_its_totals() -> None:
    uploads = UnsentUploads(BOUNDS)
    for chat in ("gone", "gone", "here"):
        kept(uploads, chat, ALICE)
    pending = uploads.admit("gone", ALICE, 1000)
    uploads.prune(lambda session_id: session_id == "here")
    assert uploads.session_ids() == ["here"] and uploads.person_total(ALICE) == (1, 1000)
    assert isinstance(pending, Pending) and uploads.keep(pending, "late", 1000) is None
    assert uploads.session_ids() == ["here"], "an upload that finishes after its chat went is not held"


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration(s) for s in (900, 60, 89, 30, 1)] == [
        "15 minutes", "1 minute", "1 minute", "30 seconds", "1 second"
    ]  # fmt: skip


# --- on a real Chainlit session store ---------------------------------------------------------------
@pytest.fixture
def chainlit_session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebsocketSession]:
    """A Chainlit session as its socket's connect makes it, its files under `tmp_path`."""
    monkeypatch.setattr(chainlit.config, "FILES_DIRECTORY", tmp_path)
    session = WebsocketSession(
        id=str(uuid.uuid4()), socket_id=str(uuid.uuid4()), emit=lambda *a: None, emit_call=lambda *a: None,
        user_env={}, client_type="webapp", environ={"asgi.scope": {"client": ("10.0.0.7", 5000)}},
    )  # fmt: skip
    yield session
    ws_sessions_id.pop(session.id, None)  # what session.delete() does, but for the folder (tmp_path's)
    ws_sessions_sid.pop(session.socket_id, None)


async def persisted(session: WebsocketSession, uploads: ChainlitUploads, text: bytes) -> str:
    pending = uploads.ledger.admit(session.id, uploads.person(session), len(text))
    assert isinstance(pending, Pending)
    file_id = (await session.persist_file(name="notes.txt", mime="text/plain", content=text))["id"]
    assert uploads.ledger.keep(pending, file_id, session.files[file_id]["size"]) is None
    return file_id


@pytest.mark.asyncio
async def test_the_sweep_deletes_unsent_uploads_sent_ones_go_with_their_message_answers_files_stay(
    chainlit_session: WebsocketSession,
) -> None:
    clock = FakeClock()
    uploads = ChainlitUploads(UnsentUploads(BOUNDS, clock), people_sign_in=False)
    unsent = await persisted(chainlit_session, uploads, b"never sent")
    sent = await persisted(chainlit_session, uploads, b"sent with a message")
    answers = (await chainlit_session.persist_file(name="plot.png", mime="image/png", content=b"png"))["id"]
    paths = {f: Path(chainlit_session.files[f]["path"]) for f in (unsent, sent, answers)}
    turn_done = asyncio.Event()
    handling = asyncio.create_task(turn_done.wait())  # Chainlit's task running the message's turn
    uploads.sent(chainlit_session, [sent], handling)
    assert await uploads.sweep() == 0, "not yet"
    clock.now += BOUNDS.expiry_seconds
    assert await uploads.sweep() == 1
    assert sorted(chainlit_session.files) == sorted([sent, answers]) and not paths[unsent].exists()
    assert paths[sent].read_bytes() == b"sent with a message", "kept while its message is handled"
    turn_done.set()
    await handling
    await asyncio.sleep(0)  # done callbacks run on the next loop pass
    assert list(chainlit_session.files) == [answers] and paths[answers].read_bytes() == b"png"
    assert not paths[sent].exists()
    assert uploads.missing(chainlit_session, [sent]) and not uploads.missing(chainlit_session, [answers])
    assert uploads.person(chainlit_session) == "address:10.0.0.7"


@pytest.mark.asyncio
async def test_an_upload_without_length_past_the_bound_is_deleted_and_refused(
    chainlit_session: WebsocketSession,
) -> None:
    uploads = ChainlitUploads(UnsentUploads(BOUNDS), people_sign_in=False)
    await persisted(chainlit_session, uploads, b"x" * (8 * MB))
    app = FastAPI()

    @app.post("/project/file")
    async def upload_file(session_id: str, request: Request) -> JSONResponse:  # as Chainlit's route
        content = await request.body()
        return JSONResponse(
            await chainlit_session.persist_file(name="big", mime="text/plain", content=content)
        )

    guarded = UnsentUploadBounds(app, uploads)
    transport = httpx.ASGITransport(app=guarded)  # type: ignore[arg-type]

    async def streamed(size: int) -> Any:
        yield b"y" * size  # no Content-Length: the guard learns the size once Chainlit wrote it

    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        query = {"session_id": chainlit_session.id}
        refused = await http.post("/project/file", params=query, content=streamed(3 * MB))
        accepted = await http.post("/project/file", params=query, content=streamed(MB))
    assert refused.status_code == 413 and "10 MB per chat" in refused.json()["detail"]
    assert accepted.status_code == 200 and accepted.json()["id"] in chainlit_session.files
    assert len(chainlit_session.files) == 2 == len(list(Path(chainlit_session.files_dir).iterdir()))
    assert uploads.ledger.held(chainlit_session.id) == 2
