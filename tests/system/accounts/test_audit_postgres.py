"""The audit log on PostgreSQL (Debian's, a throwaway cluster): the migration, appending, the
filters and retention run there as on SQLite."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from harness.postgres import PostgresCluster
from services.accounts.actions import AccountActions
from services.accounts.keys import ApiKeyStore
from services.accounts.store import AccountStore
from services.audit import actions
from services.audit.filters import AuditFilter, timestamp
from services.audit.log import AuditLog
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate


@pytest.mark.asyncio(loop_scope="module")
async def test_the_audit_log_works_on_postgresql(postgres: PostgresCluster) -> None:
    env = {
        "DATABASE_URL": postgres.create_database("audit"),
        "AUDIT_RETENTION_DAYS": "30",
        "AUDIT_MAX_ROWS": "4",
    }
    settings = Settings.from_env(env)
    engine = create_engine(settings)
    try:
        await migrate(engine)
        await migrate(engine)  # idempotent
        log = AuditLog(engine, settings)
        changes = AccountActions(
            AccountStore(engine), ApiKeyStore(engine, 5), log, "root", "admin", "10.0.0.9"
        )
        await changes.add("pat", "pats-password-1", "user")
        key = await changes.create_key("pat")
        await changes.revoke_key("pat", key[:12])
        async with engine.begin() as connection:
            await connection.execute(
                text(
                    "INSERT INTO audit_log (id, at, actor, action) VALUES ('old', :at, 'x', 'sign_in.failed')"
                ),
                {"at": timestamp(datetime.now(UTC) - timedelta(days=40))},
            )
        found = await log.entries(AuditFilter.parse(actor="root", action="api_key.", since="1h"), 10)
        assert [e.action for e in found] == [actions.KEY_REVOKED, actions.KEY_CREATED]
        assert all(key not in e.details and "pats-password-1" not in e.details for e in found)
        assert await log.retention_round() == 1  # the 40-day-old entry; 3 left, under the cap of 4
        for number in range(3):
            await log.record("cli", actions.ACCOUNT_ADDED, f"p{number}")
        log._retention_at = None  # due again now
        assert await log.retention_round() == 2
        assert len(await log.entries(AuditFilter(), 10)) == 4
    finally:
        await engine.dispose()
