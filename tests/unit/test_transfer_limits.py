"""Imports that cannot flood, on a real SQLite database: empty messages are left out, one import and
one person's day store at most their caps, a person runs one import at a time and a few an hour, the
file is read by a child process and stored in short transactions that let other writers in, and a
failure or a cancel midway leaves nothing stored (or says what stayed)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.waiting import WAIT_SECONDS, until
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate
from services.transfer import reader, store
from services.transfer.archive import BadImport
from services.transfer.limits import ImportLimited
from services.transfer.service import Transfers
from services.web import transfer_chat

ADD_PERSON = 'INSERT INTO users ("id", "identifier", "metadata", "createdAt") VALUES (:n, :n, \'{}\', \'\')'


@pytest_asyncio.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    """A migrated SQLite database with the people bob and eve."""
    database = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(database)
    async with database.begin() as connection:  # the people's rows, as a sign-in leaves them
        for name in ("bob", "eve"):
            await connection.execute(text(ADD_PERSON), {"n": name})
    yield database
    await database.dispose()


DEFAULTS = Settings.from_env({})


def transfers(engine: AsyncEngine, **env: object) -> Transfers:
    settings = Settings.from_env({"DATA_DIR": "/unused", **{key: str(value) for key, value in env.items()}})
    return Transfers(engine, settings)


def archive_of(*conversations: list[str]) -> bytes:
    """An archive whose conversations hold these texts, the person's and the answers in turn."""
    listed = [
        {"title": f"talk {n}", "messages": [
            {"role": ("user", "assistant")[i % 2], "content": said} for i, said in enumerate(texts)
        ]}
        for n, texts in enumerate(conversations)
    ]  # fmt: skip
    return json.dumps({"format": "vllm-chat-archive", "version": 1, "conversations": listed}).encode()


async def count(engine: AsyncEngine, table: str, where: str = "") -> int:
    async with engine.connect() as connection:
        return (await connection.execute(text(f"SELECT COUNT(*) FROM {table} {where}"))).scalar_one()


async def first_batch_stored(engine: AsyncEngine) -> None:
    """Once an import's first batch is committed (readers see committed rows only)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while await count(engine, "steps") == 0:
        assert time.monotonic() < deadline, f"no batch stored within {WAIT_SECONDS} s"
        await asyncio.sleep(0.001)


@pytest.mark.asyncio
async def test_the_reported_flood_of_empty_messages_stores_nothing(engine: AsyncEngine) -> None:
    """The reported file's shape (conversations of empty messages only, within every limit then): it
    stored every message; now empty and white-space messages are left out, and it holds nothing."""
    flood = archive_of(*[[""] * 700] * 20, *[[" \n\t "] * 700] * 20)
    with pytest.raises(BadImport, match="holds no message to import"):
        await transfers(engine).import_file("bob", flood, "Assistant")
    assert (await count(engine, "threads"), await count(engine, "steps")) == (0, 0)


@pytest.mark.asyncio
async def test_empty_messages_are_left_out_and_the_person_is_told(engine: AsyncEngine) -> None:
    imported = await transfers(engine).import_file(
        "bob", archive_of(["hi", "", "  \n", "there"], ["", " "]), "Assistant"
    )
    assert imported.titles == ["talk 0"]
    assert (imported.empty_messages, imported.empty_conversations) == (4, 1)
    async with engine.connect() as connection:
        kept = (await connection.execute(text('SELECT "output" FROM steps ORDER BY "createdAt"'))).all()
    assert [row[0] for row in kept] == ["hi", "there"]
    runtime = SimpleNamespace(transfers=SimpleNamespace(import_file=_returning(imported)), settings=DEFAULTS)
    said = await transfer_chat._import(runtime, "bob", [(__file__, "mine.json")])  # type: ignore[arg-type]
    assert "4 empty message(s) were left out, and 1 conversation(s) that held nothing else." in said


def _returning(value: object):
    async def call(*args: object) -> object:
        return value

    return call


def _raising(error: BaseException):
    async def call(*args: object) -> object:
        raise error

    return call


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("env", "file", "words"),
    [
        ({"IMPORT_MAX_STORED_MESSAGES": 5}, archive_of(["a"] * 3, ["b"] * 3), "holds 6 messages"),
        ({"IMPORT_MAX_STORED_BYTES": 100}, archive_of(["x" * 60, "y" * 60]), "bytes of text"),
    ],
    ids=["messages", "bytes"],
)
async def test_one_import_stores_at_most_its_caps(
    engine: AsyncEngine, env: dict, file: bytes, words: str
) -> None:
    with pytest.raises(BadImport, match=words) as refused:
        await transfers(engine, **env).import_file("bob", file, "Assistant")
    assert "split it into smaller files" in str(refused.value)
    assert await count(engine, "threads") == 0
    fits = {key: value * 2 for key, value in env.items()}
    assert len((await transfers(engine, **fits).import_file("bob", file, "Assistant")).thread_ids) >= 1


@pytest.mark.asyncio
async def test_a_persons_day_is_counted_before_anything_is_stored(engine: AsyncEngine) -> None:
    importer = transfers(engine, IMPORT_MAX_MESSAGES_PER_DAY=5)
    await importer.import_file("bob", archive_of(["a", "b", "c"]), "Assistant")
    with pytest.raises(ImportLimited, match="may store 2 more today") as refused:
        await importer.import_file("bob", archive_of(["d", "e", "f"]), "Assistant")
    assert 0 < refused.value.retry_after_seconds <= 24 * 3600
    assert await count(engine, "steps") == 3
    await importer.import_file("eve", archive_of(["d", "e", "f"]), "Assistant")  # her own day
    await importer.import_file("bob", archive_of(["d", "e"]), "Assistant")  # what is left fits
    assert await count(engine, "steps") == 8


@pytest.mark.asyncio
async def test_imports_an_hour_count_refused_files_and_free_up_after_the_hour(engine: AsyncEngine) -> None:
    importer = transfers(engine, IMPORT_MAX_PER_HOUR=2, IMPORT_MAX_PER_DAY=3)
    noon = importer.gate.clock().replace(hour=12, minute=0, second=0, microsecond=0)
    importer.gate.clock = lambda: noon
    with pytest.raises(BadImport, match="not JSON"):
        await importer.import_file("bob", b"not a conversation", "Assistant")
    await importer.import_file("bob", archive_of(["one"]), "Assistant")
    with pytest.raises(ImportLimited, match="You can start 2 imports an hour: try again in 60 minutes"):
        await importer.import_file("bob", archive_of(["two"]), "Assistant")
    await importer.import_file("eve", archive_of(["hers"]), "Assistant")
    importer.gate.clock = lambda: noon + timedelta(minutes=61)  # the two are an hour old
    await importer.import_file("bob", archive_of(["two"]), "Assistant")
    with pytest.raises(
        ImportLimited, match="You can start 3 imports a day: try again in 11 hours"
    ) as refused:
        await importer.import_file("bob", archive_of(["three"]), "Assistant")
    assert refused.value.retry_after_seconds == (12 * 60 - 61) * 60
    assert await count(engine, "steps") == 3


@pytest.mark.asyncio
async def test_one_import_at_a_time_per_person(engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store, "BATCH_ROWS", 10)  # many batches: the first import is still storing
    importer = transfers(engine)
    first = asyncio.create_task(importer.import_file("bob", archive_of(*[["q", "a"] * 20] * 20), "Assistant"))
    await first_batch_stored(engine)
    with pytest.raises(ImportLimited, match="Your previous import is still running"):
        await importer.import_file("bob", archive_of(["again"]), "Assistant")
    assert (await importer.import_file("eve", archive_of(["hers"]), "Assistant")).titles == ["talk 0"]
    assert not first.done(), "the file is stored in many short batches"
    assert len((await first).thread_ids) == 20
    await importer.import_file("bob", archive_of(["again"]), "Assistant")  # after it: fine


def children(monkeypatch: pytest.MonkeyPatch, instead: list[str] | None = None) -> list[Any]:
    """The child processes the import's reader starts from now on (their argv, then the process);
    `instead`: the argv to run in their place."""
    started: list[Any] = []
    start = asyncio.create_subprocess_exec

    async def noting(*argv: str, **options: Any) -> Any:
        process = await start(*(instead or argv), **options)
        started.append((argv, process))
        return process

    monkeypatch.setattr(reader.asyncio, "create_subprocess_exec", noting)
    return started


@pytest.mark.asyncio
async def test_the_file_is_read_in_a_child_process(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not in the app's process: its event loop's interpreter lock and heap stay out of the read."""
    started = children(monkeypatch)
    imported = await transfers(engine).import_file("bob", archive_of(["hi", "", "there"]), "Assistant")
    assert (imported.titles, imported.empty_messages) == (["talk 0"], 1)
    [(argv, process)] = started
    assert argv[1:3] == ("-m", "services.transfer.reader") and process.returncode == 0
    with pytest.raises(BadImport, match="not JSON"):  # a refusal comes back as the sentence it is
        await transfers(engine).import_file("eve", b"{nope", "Assistant")


@pytest.mark.asyncio
async def test_a_stop_while_the_file_is_read_kills_the_reader(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop ends the read at once: its child is killed, and the person may import again."""
    started = children(monkeypatch, instead=[sys.executable, "-c", "import time; time.sleep(60)"])
    importer = transfers(engine)
    first = asyncio.create_task(importer.import_file("bob", archive_of(["hi"]), "Assistant"))
    await until(lambda: started, "a reader started")
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(first, 10)
    assert started[0][1].returncode == -signal.SIGKILL
    monkeypatch.undo()
    assert (await importer.import_file("bob", archive_of(["again"]), "Assistant")).titles == ["talk 0"]


@pytest.mark.asyncio
async def test_a_reader_that_dies_is_not_the_files_fault(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    children(monkeypatch, instead=[sys.executable, "-c", "import sys; sys.exit(3)"])
    with pytest.raises(reader.ReaderFailed, match="exited with 3"):
        await transfers(engine).import_file("bob", archive_of(["hi"]), "Assistant")
    assert await count(engine, "threads") == 0


@pytest.mark.asyncio
async def test_other_writers_get_in_while_a_large_import_is_stored(engine: AsyncEngine) -> None:
    """The import used to be one transaction: SQLite's write lock was the import's until its end, so
    another person's messages waited for all of it (18.75 s in the report)."""
    large = archive_of(*[["question", "answer"] * 50] * 40)  # 4,000 messages: 21 batches
    importing = asyncio.create_task(transfers(engine).import_file("bob", large, "Assistant"))
    await first_batch_stored(engine)
    async with engine.begin() as connection:  # eve's message, written meanwhile
        await connection.execute(text("UPDATE service_health SET checked_at = 'now'"))
    assert not importing.done(), "another writer got in while the import was storing"
    assert len((await importing).thread_ids) == 40
    assert await count(engine, "steps") == 4000


@pytest.mark.asyncio
@pytest.mark.parametrize("cleanup_fails", [False, True])
async def test_a_failure_midway_deletes_what_was_stored_or_says_what_stayed(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, cleanup_fails: bool
) -> None:
    monkeypatch.setattr(store, "BATCH_ROWS", 4)
    batches = store._batches

    def failing_on_the_third(*args: object):
        for number, batch in enumerate(batches(*args), 1):  # type: ignore[arg-type]
            if number == 3:
                raise RuntimeError("disk full")
            yield batch

    async def refusing(*args: object) -> None:
        raise RuntimeError("still full")

    monkeypatch.setattr(store, "_batches", failing_on_the_third)
    if cleanup_fails:
        monkeypatch.setattr(store, "delete_threads", refusing)
    importer = transfers(engine, IMPORT_MAX_MESSAGES_PER_DAY=12)
    with pytest.raises(store.PartlyStored if cleanup_fails else RuntimeError) as failed:
        await importer.import_file("bob", archive_of(*[["q", "a"]] * 6), "Assistant")
    if cleanup_fails:
        assert failed.value.titles == ["talk 0", "talk 1", "talk 2"]
        assert await count(engine, "threads") == 3
        runtime = SimpleNamespace(
            transfers=SimpleNamespace(import_file=_raising(failed.value)), settings=DEFAULTS
        )
        said = await transfer_chat._import(runtime, "bob", [(__file__, "mine.json")])  # type: ignore[arg-type]
        assert (
            "«mine.json» could not be imported: it failed midway, and 3 of its conversation(s) were " in said
        )
        assert "«talk 0», «talk 1», «talk 2». They are in the sidebar: delete them" in said
    else:
        assert (await count(engine, "threads"), await count(engine, "steps")) == (0, 0)
        monkeypatch.setattr(store, "_batches", batches)  # the failed one gave its day's count back
        assert len((await importer.import_file("bob", archive_of(*[["q", "a"]] * 6), "A")).thread_ids) == 6


@pytest.mark.asyncio
async def test_a_cancel_midway_deletes_what_was_stored(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stop in the chat cancels the `/import` turn while it stores."""
    monkeypatch.setattr(store, "BATCH_ROWS", 10)
    importing = asyncio.create_task(
        transfers(engine).import_file("bob", archive_of(*[["q", "a"] * 20] * 20), "Assistant")
    )
    await first_batch_stored(engine)
    importing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await importing
    assert (await count(engine, "threads"), await count(engine, "steps")) == (0, 0)
    assert await count(engine, "imports", "WHERE state = 'failed' AND messages = 0") == 1


@pytest.mark.asyncio
async def test_the_chat_tells_a_limit_in_a_sentence() -> None:
    async def limited(*args: object) -> None:
        raise ImportLimited("You can start 20 imports an hour: try again in 12 minutes.", 700)

    runtime = SimpleNamespace(transfers=SimpleNamespace(import_file=limited), settings=DEFAULTS)
    said = await transfer_chat._import(runtime, "bob", [(__file__, "mine.json")])  # type: ignore[arg-type]
    assert said == (
        "«mine.json» was not imported (nothing was stored): "
        "You can start 20 imports an hour: try again in 12 minutes."
    )
