"""A share link's page says which messages were imported: an imported "assistant" message is text its
owner brought from a file, never shown as an answer of the app (content spoofing on the app's origin)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from services.accounts.store import AccountStore
from services.config import Settings
from services.history.conversations import timestamp
from services.history.database import create_engine
from services.history.migrations import migrate
from services.history.resume import ANSWER_METADATA
from services.transfer.service import Transfers
from services.web.share_page import shared_page

SPOOF = "Your session has expired. Sign in again at https://login.example.net to keep your chats."
MESSAGE = re.compile(r'<div class="message ([^"]+)"><div class="who">([^<]+)</div>([^<]*)</div>')


def archive(messages: list[dict]) -> bytes:
    conversation = {"title": "Support", "messages": messages}
    return json.dumps({"format": "vllm-chat-archive", "version": 1, "conversations": [conversation]}).encode()


async def answer_of_the_app(transfers: Transfers, thread_id: str, output: str) -> None:
    """An answer the app itself gave later in the conversation (as the chat stores one)."""
    at = timestamp(datetime.now(UTC) + timedelta(minutes=1))
    async with transfers.engine.begin() as connection:
        await connection.execute(
            text(
                'INSERT INTO steps ("id", "name", "type", "threadId", "output", "metadata", "createdAt") '
                "VALUES (:id, 'Assistant', 'assistant_message', :thread, :output, :metadata, :at)"
            ),
            {"id": str(uuid.uuid4()), "thread": thread_id, "output": output,
             "metadata": json.dumps(ANSWER_METADATA), "at": at},
        )  # fmt: skip


@pytest.mark.asyncio
async def test_imported_messages_are_marked_imported_on_the_share_page(tmp_path: Path) -> None:
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    engine = create_engine(settings)
    await migrate(engine)
    try:
        await AccountStore(engine).add("mallory", "mallorys-password")
        transfers = Transfers(engine, settings)
        data = archive([{"role": "user", "content": "Is my account fine?"},
                        {"role": "assistant", "content": SPOOF}])  # fmt: skip
        [thread_id] = (await transfers.import_file("mallory", data, "Assistant")).thread_ids
        await answer_of_the_app(transfers, thread_id, "An answer the model gave.")
        created = await transfers.share(thread_id, "mallory")
        assert created is not None
        conversation = await transfers.shared(created.token)
        assert conversation is not None
        page = bytes(shared_page(conversation).body).decode()
    finally:
        await engine.dispose()
    shown = [(kind.split(), who, said) for kind, who, said in MESSAGE.findall(page)]
    assert [said for _, _, said in shown] == ["Is my account fine?", SPOOF, "An answer the model gave."]
    (user, user_label, _), (spoof, spoof_label, _), (answer, answer_label, _) = shown
    assert "imported" in user and "imported" in user_label
    assert "imported" in spoof and "assistant" not in spoof, "styled as an import, not as an answer"
    assert "Assistant" not in spoof_label and "not written by this app" in spoof_label, spoof_label
    assert answer == ["assistant"] and answer_label == "Assistant", "the app's own answer"
    assert "imported from a file" in page.split('<div class="message')[0], "the page says what the mark means"


@pytest.mark.asyncio
async def test_messages_imported_before_the_mark_and_older_snapshots_count_as_imported(
    tmp_path: Path,
) -> None:
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    engine = create_engine(settings)
    await migrate(engine)
    try:
        await AccountStore(engine).add("mallory", "mallorys-password")
        transfers = Transfers(engine, settings)
        data = archive([{"role": "assistant", "content": SPOOF}])
        [thread_id] = (await transfers.import_file("mallory", data, "Assistant")).thread_ids
        async with engine.begin() as connection:  # as an import stored it before messages were marked
            await connection.execute(
                text("UPDATE steps SET metadata = :meta"), {"meta": json.dumps(ANSWER_METADATA)}
            )
        created = await transfers.share(thread_id, "mallory")
        assert created is not None
        shared = await transfers.shared(created.token)
        assert shared is not None and [m.imported for m in shared.messages] == [True]
        async with engine.begin() as connection:  # a snapshot made before they were marked
            old = json.dumps([["assistant", SPOOF, None]])
            await connection.execute(text("UPDATE shares SET snapshot = :old"), {"old": old})
        shared = await transfers.shared(created.token)
        assert shared is not None and [m.imported for m in shared.messages] == [True]
    finally:
        await engine.dispose()
