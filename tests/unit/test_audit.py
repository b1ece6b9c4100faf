"""The audit log without a server: what an entry may hold (bounded, nothing secret), the filters,
the CSV, and the log itself on a real SQLite database: append, list by filter, retention."""

from __future__ import annotations

import argparse
import json
import logging
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import text

from harness.server import ROOT
from services.accounts.actions import AccountActions
from services.accounts.audit_command import run_audit_command
from services.accounts.keys import ApiKeyStore
from services.accounts.sign_in import SignIn, SignInRequest, current_request
from services.accounts.store import AccountStore
from services.audit import actions
from services.audit import log as audit_log
from services.audit.details import MASK, clean, details_json, is_secret_name, masked_settings, scrub
from services.audit.filters import AuditFilter, FilterError, parse_since, safe_cell, timestamp, to_csv
from services.audit.log import COLUMNS, AuditEntry, AuditLog
from services.audit.log_lines import install_one_line_logs, one_line
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate

KEY = "sk-vc-AbCdEf0123456789abcdefghijklmnopqrstuvwxyzABCDE"


@pytest_asyncio.fixture(loop_scope="module")
async def audit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AuditLog]:
    monkeypatch.setattr(audit_log, "AUDIT_DETAILS_MAX_BYTES", 512)
    settings = Settings.from_env({"DATA_DIR": str(tmp_path)})
    engine = create_engine(settings)
    await migrate(engine)
    yield AuditLog(engine, settings)
    await engine.dispose()


def test_secret_names_are_recognised_by_their_words() -> None:
    for name in ("ADMIN_PASSWORD", "OPS_TOKEN", "CHAINLIT_AUTH_SECRET", "api-key", "Cookie", "DATABASE_URL",
                 "authorization", "OAUTH_GITHUB_CLIENT_SECRET"):  # fmt: skip
        assert is_secret_name(name), name
    for name in ("MAX_NEW_TOKENS", "API_KEYS_PER_USER", "role", "prefix", "AUTH_MODE", "generated"):
        assert not is_secret_name(name), name


def test_details_mask_secrets_wherever_they_are() -> None:
    details = {
        "password": "hunter2-hunter2", "nested": {"token": "abc", "ok": 1}, "note": f"made {KEY} today",
        "url": "postgresql://app:s3cret@db:5432/chat", "list": [KEY, 2, None],
    }  # fmt: skip
    text_ = json.dumps(clean(details))
    for secret in ("hunter2", "abc", KEY, "s3cret"):
        assert secret not in text_, secret
    cleaned = clean(details)
    assert cleaned["password"] == MASK
    assert cleaned["note"] == "made sk-vc-AbCdEf… today"
    assert cleaned["url"] == "postgresql://***@db:5432/chat"
    assert masked_settings({"OPS_TOKEN": "x", "MODEL": "m"}) == {"OPS_TOKEN": MASK, "MODEL": "m"}


def test_details_are_bounded_in_size_and_shape() -> None:
    huge = {f"k{i}": "v" * 2000 for i in range(100)} | {"deep": [[[[1]]]] * 500}
    written = details_json(huge, 1024)
    assert len(written.encode()) <= 1024
    assert json.loads(written)["truncated"] is True
    assert len(clean({"v": "x" * 10_000})["v"]) <= 512
    assert len(clean({"l": list(range(1000))})["l"]) <= 21
    assert len(scrub("é" * 5000)) <= 512


def test_filters_parse_what_people_type_and_refuse_the_rest() -> None:
    now = datetime(2026, 12, 5, 12, tzinfo=UTC)
    assert parse_since("7d", now) == now - timedelta(days=7)
    assert parse_since("12h", now) == now - timedelta(hours=12)
    assert parse_since("2026-12-01", now) == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_since("", now) is None
    for bad in ("yesterday", "7y", "2026-13-01", "1" * 50):
        with pytest.raises(FilterError):
            parse_since(bad, now)
    for actor, action in (
        ("a" * 200, ""),
        ("x\ny", ""),
        ("", "account.added%"),
        ("", "x'; DROP"),
        ("", "_.%"),
    ):
        with pytest.raises(FilterError):
            AuditFilter.parse(actor, action)
    where, values = AuditFilter.parse("alice", "account.", "1d").where()
    assert where == " WHERE actor = :actor AND action LIKE :action AND at >= :since"
    assert values["action"] == "account.%" and values["actor"] == "alice"


def test_csv_cells_never_start_like_a_formula() -> None:
    assert safe_cell("=HYPERLINK(1)") == "'=HYPERLINK(1)"
    assert safe_cell("@x") == "'@x" and safe_cell("alice") == "alice"
    entry = AuditEntry("2026-12-05T00:00:00.000000Z", "=cmd", "account.added", "+x", "-1", "{}")
    lines = to_csv([entry], COLUMNS).splitlines()
    assert lines[0] == "at,actor,action,target,address,details"
    assert lines[1] == "2026-12-05T00:00:00.000000Z,'=cmd,account.added,'+x,'-1,{}"


def test_nothing_in_the_audit_room_updates_an_entry() -> None:
    code = "\n".join(path.read_text() for path in (ROOT / "services" / "audit").glob("*.py"))
    assert not re.search(r"UPDATE\s+audit_log", code, re.IGNORECASE)
    assert len(re.findall(r"DELETE FROM audit_log", code)) == 1  # retention's, only


@pytest.mark.asyncio(loop_scope="module")
async def test_entries_are_appended_listed_by_filter_and_bounded(audit: AuditLog) -> None:
    assert await audit.record("alice", actions.SIGN_IN, "alice", {"mode": "password"}, "10.0.0.1")
    assert await audit.record("cli", actions.ACCOUNT_ADDED, "bob", {"role": "user", "password": "pw-1"})
    assert await audit.record("a" * 1000, "x" * 1000, "t" * 1000, {"big": "y" * 5000}, "z" * 1000)
    every = await audit.entries(AuditFilter(), 10)
    assert [e.action for e in every][1:] == [actions.ACCOUNT_ADDED, actions.SIGN_IN]
    longest = every[0]
    assert (len(longest.actor), len(longest.action), len(longest.target), len(longest.address)) == (
        128,
        64,
        256,
        64,
    )
    assert len(longest.details.encode()) <= 512
    assert "pw-1" not in json.dumps([e.row() for e in every])
    assert [e.actor for e in await audit.entries(AuditFilter.parse(actor="alice"), 10)] == ["alice"]
    assert [e.target for e in await audit.entries(AuditFilter.parse(action="account."), 10)] == ["bob"]
    assert await audit.entries(AuditFilter.parse(since="2999-01-01"), 10) == []
    assert len(await audit.entries(AuditFilter(), 2)) == 2


@pytest.mark.asyncio(loop_scope="module")
async def test_retention_deletes_old_entries_and_the_oldest_beyond_the_cap(tmp_path: Path) -> None:
    settings = Settings.from_env(
        {"DATA_DIR": str(tmp_path), "AUDIT_RETENTION_DAYS": "30", "AUDIT_MAX_ROWS": "5"}
    )
    engine = create_engine(settings)
    await migrate(engine)
    log = AuditLog(engine, settings)
    old = timestamp(datetime.now(UTC) - timedelta(days=31))
    async with engine.begin() as connection:
        await connection.execute(
            text("INSERT INTO audit_log (id, at, actor, action) VALUES ('old', :at, 'x', 'sign_in.failed')"),
            {"at": old},
        )
    for number in range(8):
        await log.record("cli", actions.ACCOUNT_ADDED, f"p{number}")
    assert await log.retention_round() == 4  # the 31-day-old one, then the 3 oldest beyond 5
    assert [e.target for e in await log.entries(AuditFilter(), 10)] == [f"p{n}" for n in range(7, 2, -1)]
    assert await log.retention_round() == 0  # not due again within RETENTION_INTERVAL_SECONDS
    await engine.dispose()


@pytest.mark.asyncio(loop_scope="module")
async def test_sign_ins_and_account_changes_are_recorded_without_secrets(audit: AuditLog) -> None:
    settings = audit.settings
    store, keys = AccountStore(audit.engine), ApiKeyStore(audit.engine, 5)
    changes = AccountActions(store, keys, audit, actor="root", via="admin", address="10.9.9.9")
    await changes.add("root", "roots-password-1", "admin")
    await changes.add("carol", "carols-password-1", "user")
    key = await changes.create_key("carol")
    await changes.set_role("carol", "admin")
    await changes.reset_password("carol", "carols-password-2")
    assert await changes.revoke_key("carol", key[:12]) == 1
    sign_in = SignIn(settings, "password", store, audit=audit)
    token = current_request.set(SignInRequest(address="10.1.2.3", peer="10.1.2.3"))
    try:
        assert await sign_in.password("carol", "wrong-password-9") is None
        assert await sign_in.password("carol", "carols-password-2") is not None
    finally:
        current_request.reset(token)
    await changes.remove("carol")
    entries = await audit.entries(AuditFilter.parse(since="1h"), 50)
    by_action = {e.action: e for e in reversed(entries)}  # the newest of each
    assert by_action[actions.SIGN_IN].address == "10.1.2.3"
    assert by_action[actions.SIGN_IN_FAILED].actor == "carol"
    for action in (actions.ACCOUNT_ADDED, actions.KEY_CREATED, actions.ACCOUNT_ROLE_CHANGED,
                   actions.PASSWORD_RESET, actions.KEY_REVOKED, actions.ACCOUNT_REMOVED):  # fmt: skip
        entry = by_action[action]
        assert (entry.actor, entry.target, entry.address) == ("root", "carol", "10.9.9.9"), action
        assert json.loads(entry.details)["via"] == "admin"
    everything = json.dumps([e.row() for e in entries])
    for secret in ("carols-password-1", "carols-password-2", "wrong-password-9", key):
        assert secret not in everything
    assert key[:12] in everything  # the prefix people see is kept


FORGED = "mallory\nINFO services.accounts.sign_in: signed admin in\r\x1b[2K\u2028\u202e"


def test_one_line_escapes_whatever_could_start_or_hide_a_line() -> None:
    assert one_line(FORGED + "\ud800") == (
        "mallory\\nINFO services.accounts.sign_in: signed admin in\\r\\x1b[2K\\u2028\\u202e\\ud800"
    )
    for text_ in ("plain", "Zoë «résumé» 東京 🙂", "tab-free, space kept", ""):
        assert one_line(text_) == text_
    for character in ("\x00", "\x7f", "\x85", "\u2029", "\ufeff", "\u200e"):
        assert character not in one_line(f"a{character}b") and "\\" in one_line(f"a{character}b")


@pytest.fixture
def one_line_logs() -> Iterator[None]:
    """The app's log records (services/web/edge.py installs them at import), for this test only."""
    before = logging.getLogRecordFactory()
    logging.setLogRecordFactory(logging.LogRecord)
    install_one_line_logs()
    yield
    logging.setLogRecordFactory(before)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_sign_in_name_with_a_newline_is_one_line_in_the_log_and_in_the_audit_log(
    audit: AuditLog, one_line_logs: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    sign_in = SignIn(audit.settings, "password", AccountStore(audit.engine), audit=audit)
    token = current_request.set(SignInRequest(address="10.1.2.3", peer="10.1.2.3"))
    try:
        assert await sign_in.password(FORGED, "a guess") is None
    finally:
        current_request.reset(token)
    failed = [r for r in caplog.records if "sign-in failed" in r.getMessage()]
    assert len(failed) == 1 and "mallory\\nINFO" in failed[0].getMessage()
    assert all("\n" not in r.getMessage() and "\r" not in r.getMessage() for r in caplog.records)
    assert len(caplog.text.splitlines()) == len(caplog.records), caplog.text
    [entry] = await audit.entries(AuditFilter.parse(action=actions.SIGN_IN_FAILED), 10)
    assert entry.actor.startswith("mallory\\nINFO") and entry.target == entry.actor
    assert all(cell.isprintable() for cell in entry.row()), entry.row()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_audit_command_shows_an_entry_on_one_line_even_one_stored_raw(audit: AuditLog) -> None:
    """An entry written before names were escaped on the way in (straight into the table here)."""
    async with audit.engine.begin() as connection:
        await connection.execute(
            text("INSERT INTO audit_log (id, at, actor, action, target, address, details) "
                 "VALUES ('raw', :at, :who, 'sign_in.failed', :who, '10.0.0.9', '{}')"),
            {"at": timestamp(datetime.now(UTC)), "who": FORGED},
        )  # fmt: skip
    await audit.record(FORGED, actions.SIGN_IN_FAILED, FORGED, {"mode": f"password{FORGED}"}, "10.0.0.8")
    arguments = argparse.Namespace(actor="", action="", since="", csv=False, limit=50)
    table = await run_audit_command(arguments, audit, audit.settings)
    lines = table.splitlines()
    assert len(lines) == 3, table  # the header and the two entries
    assert all(line.isprintable() for line in lines) and sum("mallory\\nINFO" in line for line in lines) == 2
