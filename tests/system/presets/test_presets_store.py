"""Presets in a real database, SQLite and PostgreSQL: kept per person, bounded, never shown to another;
removing an account removes its presets."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from harness.postgres import PostgresCluster
from services.accounts.store import AccountStore
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate
from services.presets.store import PresetStore, Template
from services.presets.validation import PresetError

in_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=["sqlite", "postgresql"])
async def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[PresetStore]:
    if request.param == "sqlite":
        settings = Settings.from_env({"DATA_DIR": str(tmp_path_factory.mktemp("presets"))})
    else:
        postgres: PostgresCluster = request.getfixturevalue("postgres")
        settings = Settings.from_env({"DATABASE_URL": postgres.create_database("presets")})
    engine = create_engine(settings.replace(presets_max_templates=3))
    await migrate(engine)
    yield PresetStore(engine, settings.replace(presets_max_templates=3))
    await engine.dispose()


@in_loop
async def test_a_default_is_kept_and_replaced(store: PresetStore) -> None:
    assert await store.defaults("alice") == {}
    await store.save_defaults("alice", {"temperature": 1.2, "system_prompt": "Answer in French."})
    await store.save_defaults("alice", {"temperature": 0.4, "system_prompt": "Answer in German."})
    assert await store.defaults("alice") == {"temperature": 0.4, "system_prompt": "Answer in German."}
    assert await store.defaults("bob") == {}, "Bob never gets Alice's default"
    assert await store.clear_defaults("alice") and await store.defaults("alice") == {}


@in_loop
async def test_templates_are_per_person_and_bounded(store: PresetStore) -> None:
    for i in range(3):
        await store.save_template("carol", f"t{i}", f"text {i}")
    await store.save_template("carol", "t1", "new text 1")  # a new text for a name she has: no new row
    with pytest.raises(PresetError, match="the most allowed"):
        await store.save_template("carol", "t3", "one too many")
    assert await store.templates("carol") == [Template("t0", "text 0"), Template("t1", "new text 1"),
                                              Template("t2", "text 2")]  # fmt: skip
    assert await store.templates("dave") == []
    assert not await store.delete_template("dave", "t0"), "Dave cannot delete Carol's template"
    assert await store.delete_template("carol", "t0")
    await store.save_template("carol", "t3", "fits again")
    assert [t.name for t in await store.templates("carol")] == ["t1", "t2", "t3"]


@in_loop
async def test_a_row_edited_by_hand_never_reaches_a_session(store: PresetStore) -> None:
    from sqlalchemy import text

    async with store.engine.begin() as connection:
        await connection.execute(
            text(
                "INSERT INTO user_presets (user_identifier, settings, updated_at) VALUES ('eve', :s, 'now')"
            ),
            {"s": '{"temperature": 99, "model_path": "/etc"}'},
        )
    assert await store.defaults("eve") == {}


@in_loop
async def test_removing_an_account_removes_its_presets(store: PresetStore) -> None:
    accounts = AccountStore(store.engine)
    await accounts.add("frank", "franks-password-1")
    await store.save_defaults("frank", {"top_p": 0.5})
    await store.save_template("frank", "mine", "my prompt")
    await accounts.remove("frank")
    assert await store.defaults("frank") == {} and await store.templates("frank") == []
