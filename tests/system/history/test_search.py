"""The sidebar's full-text search on real SQLite and PostgreSQL databases, through the app's data layer:
what it finds, in which order and pages, what hostile text does to it, and that it never lists
another person's conversation."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from chainlit.context import init_http_context
from chainlit.types import Pagination, ThreadFilter
from sqlalchemy import text

from harness.postgres import PostgresCluster
from services.config import Settings
from services.history import thread_list, thread_search
from services.history.migrations import migrate
from services.history.service import History
from services.history.thread_search import owner_token
from tests.system.history.conftest import conversation, found, people

in_loop = pytest.mark.asyncio(loop_scope="module")
HOSTILE = [
    '"', '""', "'", "NEAR(lisbon bakery)", "lisbon NEAR bakery", "*", "lis*", "body : lisbon", "owner : x",
    "{body owner} : lisbon", "(((", ")", "lisbon) OR (tax", 'lisbon" OR "tax', "AND", "OR tax", "NOT lisbon",
    "^lisbon", "-lisbon", "lisbon & tax | pastel", "!lisbon", "lisbon <-> bakery", "lisbon:*", "tax:A",
    "' OR 1=1 --", '"); DROP TABLE steps; --', "\\", "%", "_", "\x00", "\ud800", "x" * 100_000,
    "lisbon " * 5_000, "!!!", "...", "   ", "", "🙂", "ｌｉｓｂｏｎ", "İ", "ß", "Ǆ",
]  # fmt: skip


@pytest_asyncio.fixture(params=["sqlite", "postgresql"], loop_scope="module")
async def history(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[History]:
    environ = {"DATA_DIR": str(tmp_path)}
    if request.param == "postgresql":
        cluster: PostgresCluster = request.getfixturevalue("postgres")
        environ["DATABASE_URL"] = cluster.create_database(f"s{uuid.uuid4().hex[:12]}")
    history = History(Settings.from_env(environ), keep_conversations=True, use_database=True)
    await history.start()
    init_http_context()  # Chainlit's data layer expects a Chainlit context
    yield history
    await history.stop()


@in_loop
async def test_search_finds_by_name_and_by_words_of_any_message_only_of_its_person(history: History) -> None:
    alice, bob = await people(history)
    lisbon = await conversation(history, alice, "Holiday plans in Lisbon", ["Where should we eat?",
                                "Try the pastel de nata at the bakery near the river."])  # fmt: skip
    taxes = await conversation(history, alice, "Tax return", ["How do I file my taxes?", "Use the form."])
    bobs = await conversation(history, bob, "Lisbon trip", ["Any bakery with pastel de nata?", "Yes."])
    assert await found(history, alice, "lisbon") == [lisbon], "by the name"
    assert await found(history, alice, "Bakery") == [lisbon], "by an answer's word, any case"
    assert await found(history, alice, "pastel bakery") == [lisbon], "words of one message"
    assert await found(history, alice, "pastel taxes") == [], "every word must match"
    assert await found(history, alice, "file") == [taxes]
    assert await found(history, bob, "lisbon") == [bobs] and await found(history, bob, "taxes") == []
    assert await found(history, alice, owner_token(bob)) == [], "the index's owner is no word to search"


@in_loop
async def test_a_result_found_by_a_message_is_named_with_its_words(history: History) -> None:
    """The search dialog shows only a result's name: one found by a message carries its words."""
    alice, _ = await people(history)
    river = "Try the pastel de nata at the bakery near the river."
    lisbon = await conversation(history, alice, "Holiday plans in Lisbon", ["Where should we eat?", river])
    untitled = await conversation(history, alice, "", ["A note on the Bakery hours, for later."])
    assert history.layer is not None

    async def named(search: str) -> dict[str, str]:
        assert history.layer is not None
        page = await history.layer.list_threads(
            Pagination(first=20), ThreadFilter(userId=alice, search=search)
        )
        return {thread["id"]: thread["name"] for thread in page.data}

    assert await named("bakery") == {
        lisbon: f"Holiday plans in Lisbon — {river}",
        untitled: "A note on the Bakery hours, for later.",
    }
    assert await named("pastel bak") == {lisbon: f"Holiday plans in Lisbon — {river}"}, "as typed: a prefix"
    assert await named("holiday") == {lisbon: "Holiday plans in Lisbon"}, "found by its name: the name"
    listed = await history.layer.list_threads(Pagination(first=20), ThreadFilter(userId=alice))
    assert {t["id"]: t["name"] for t in listed.data}[lisbon] == "Holiday plans in Lisbon", "the sidebar's own"


@in_loop
async def test_the_last_word_matches_as_a_prefix_while_typing(history: History) -> None:
    alice, bob = await people(history)
    lisbon = await conversation(history, alice, "Trip", ["The bakery near the river", "Pastries!"])
    await conversation(history, bob, "Bob's", ["bakery bakers baked"])
    assert await found(history, alice, "bak") == [lisbon]
    assert await found(history, alice, "bakery riv") == [lisbon]
    assert await found(history, alice, "bak river") == [], "only the last word is a prefix"
    assert await found(history, alice, "b") == [], "one letter is no prefix (it would match most words)"
    assert await found(history, alice, "pastries rivers") == [], "a longer word than the stored one"


@in_loop
async def test_results_rank_by_relevance_then_by_recency(history: History) -> None:
    alice, _ = await people(history)
    filler = " ".join(f"word{i}" for i in range(60))
    once = await conversation(history, alice, "A", [f"volcano {filler}"], minutes=30)
    thrice = await conversation(history, alice, "B", ["volcano volcano volcano eruption"], minutes=10)
    older_twin = await conversation(history, alice, "C", ["glacier"], minutes=1)
    newer_twin = await conversation(history, alice, "D", ["glacier"], minutes=2)
    assert await found(history, alice, "volcano") == [thrice, once], "the better match first, though older"
    assert await found(history, alice, "glacier") == [newer_twin, older_twin], "equal matches: newest first"


@in_loop
async def test_search_results_page_without_gaps_or_repeats_and_are_bounded(history: History) -> None:
    alice, bob = await people(history)
    threads = [
        await conversation(history, alice, f"Notes {i}", [f"meeting {'agenda ' * i}"], i) for i in range(8)
    ]
    await conversation(history, bob, "Bob's meeting", ["meeting agenda"])
    layer = history.layer
    assert layer is not None
    listed: list[str] = []
    page = await layer.list_threads(Pagination(first=3), ThreadFilter(userId=alice, search="meeting"))
    listed += [t["id"] for t in page.data]
    while page.pageInfo.hasNextPage:
        cursor = Pagination(first=3, cursor=page.pageInfo.endCursor)
        page = await layer.list_threads(cursor, ThreadFilter(userId=alice, search="meeting"))
        assert 0 < len(page.data) <= 3
        listed += [t["id"] for t in page.data]
    assert sorted(listed) == sorted(threads) and len(listed) == len(set(listed))
    assert all(t["steps"] == [] for t in page.data), "no messages are loaded"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thread_list, "THREAD_LIST_PAGE_MAX", 4)
        capped = await layer.list_threads(
            Pagination(first=10**6), ThreadFilter(userId=alice, search="meeting")
        )
    assert len(capped.data) == 4 and capped.pageInfo.hasNextPage


@in_loop
async def test_hostile_searches_never_fail_and_never_list_another_persons_conversation(
    history: History,
) -> None:
    alice, bob = await people(history)
    alices = {await conversation(history, alice, "Lisbon", ["pastel bakery tax x", "日本語 café Zürich"])}
    bobs = await conversation(history, bob, "Bob's Lisbon", ["lisbon bakery tax pastel café 日本語"])
    assert history.layer is not None
    failures = history.health.failures_total
    for search in HOSTILE:
        listed = set(await found(history, bob, search))
        assert not listed & alices, f"{search[:40]!r} listed Alice's conversation to Bob"
        assert listed <= {bobs}, search[:40]
        assert history.health.available, f"{search[:40]!r} failed the statement"
    assert await found(history, alice, "日本語") == list(alices) and await found(history, alice, "zürich")
    assert await found(history, alice, "CAFÉ") == list(alices), "unicode words, case folded"
    assert await found(history, alice, '(pastel) "tax*":') == list(alices), "syntax is only separators"
    assert await found(history, bob, "x" * 100_000) == [] and await found(history, bob, "!!!") == []
    assert history.health.failures_total == failures, "no statement failed"


@in_loop
async def test_deleting_or_editing_a_message_or_a_conversation_updates_the_results(history: History) -> None:
    alice, _ = await people(history)
    layer = history.layer
    assert layer is not None
    kept = await conversation(history, alice, "Kept", ["the aurora borealis", "a comet tonight"])
    gone = await conversation(history, alice, "Gone", ["aurora again"])
    assert set(await found(history, alice, "aurora")) == {kept, gone}
    await layer.delete_thread(gone)
    assert await found(history, alice, "aurora") == [kept], "a deleted conversation is no longer found"
    thread = await layer.get_thread(kept)
    assert thread is not None
    comet_step = next(s for s in thread["steps"] if "comet" in (s.get("output") or ""))
    await layer.update_step({**comet_step, "output": "a meteor shower tonight"})
    assert await found(history, alice, "comet") == [] and await found(history, alice, "meteor") == [kept]
    await layer.delete_step(comet_step["id"])
    assert await found(history, alice, "meteor") == [], "a deleted message is no longer found"
    await layer.update_thread(kept, name="Night sky")
    assert await found(history, alice, "night sky") == [kept] and await found(history, alice, "kept") == []
    async with history.engine.begin() as connection:  # type: ignore[union-attr]  # the length cap's delete
        await connection.execute(text('DELETE FROM steps WHERE "threadId" = :id'), {"id": kept})
    assert await found(history, alice, "aurora") == []


@in_loop
async def test_a_conversation_stored_before_its_owner_is_found_by_its_owner(history: History) -> None:
    alice, bob = await people(history)
    thread_id = await conversation(history, None, "Unowned yet", ["a nebula photo"])
    assert await found(history, alice, "nebula") == []
    assert history.layer is not None
    await history.layer.update_thread(thread_id, user_id=alice)
    assert await found(history, alice, "nebula") == [thread_id] and await found(history, bob, "nebula") == []


@in_loop
async def test_the_migration_indexes_what_was_stored_before_it_and_can_run_again(history: History) -> None:
    alice, _ = await people(history)
    thread_id = await conversation(history, alice, "Before", ["an ancient manuscript"])
    engine = history.engine
    assert engine is not None
    async with engine.begin() as connection:  # a database from before the index
        if engine.dialect.name == "postgresql":
            for table in ("steps", "threads"):
                await connection.execute(text(f"ALTER TABLE {table} DROP COLUMN search_vector"))
        else:
            await connection.execute(text("DROP TABLE conversation_search"))
            await connection.execute(text("DROP TABLE conversation_search_rows"))
            for trigger in ("step_added", "step_changed", "step_deleted", "thread_added"):
                await connection.execute(text(f"DROP TRIGGER conversation_search_{trigger}"))
        await connection.execute(text("DELETE FROM schema_migrations WHERE version IN (11, 14)"))
    assert await migrate(engine) == [11, 14]
    assert await found(history, alice, "manuscript") == [thread_id], "backfilled"
    async with engine.begin() as connection:
        await connection.execute(text("DELETE FROM schema_migrations WHERE version IN (11, 14)"))
    assert await migrate(engine) == [11, 14], "a second run over a built index"
    assert await found(history, alice, "ancient manuscript") == [thread_id]
    later = await conversation(history, alice, "After", ["another manuscript"])
    assert set(await found(history, alice, "manuscript")) == {thread_id, later}, "triggers work again"


@in_loop
async def test_a_word_in_very_many_messages_ranks_only_the_newest_matches(history: History) -> None:
    alice, _ = await people(history)
    threads = [await conversation(history, alice, f"Day {i}", [f"weather report {i}"], i) for i in range(5)]
    layer = history.layer
    assert layer is not None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(thread_search, "THREAD_SEARCH_MAX_MATCHES", 2)
        assert set(await found(history, alice, "weather")) == set(threads[-2:]), "the two newest matches"
        assert await found(history, alice, "weather 0") == [threads[0]], "a rarer search still finds old ones"
    assert set(await found(history, alice, "weather")) == set(threads)
