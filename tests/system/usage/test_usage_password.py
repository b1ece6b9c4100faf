"""Usage kept on the shared password server (SQLite, default budgets): a person's chat turns and API
calls with their tokens, per UTC day, written within USAGE_FLUSH_SECONDS; shown by the command, as CSV
and by /quota; another person's usage stays apart. The person's name is hostile on purpose (a quote
and a spreadsheet formula)."""

from __future__ import annotations

import asyncio
import csv
import io
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import ROOT, AppServer
from tests.system.conftest import accounts

# a server of its own: per commit, tests/unit/test_usage.py and the admin page's usage
pytestmark = pytest.mark.long

in_loop = pytest.mark.asyncio(loop_scope="module")
HOSTILE = ("=o'neil", "oneil-password-1")  # a quote and a leading '=': SQL and spreadsheets must cope
OTHER = ("victor", "victor-password-1")
FLUSH_BOUND_SECONDS = 5 + 10  # USAGE_FLUSH_SECONDS' default, plus slack for a busy machine


def usage_rows(data_dir: Path, name: str) -> list[dict[str, str]]:
    env = {**os.environ, "DATA_DIR": str(data_dir)}
    done = subprocess.run([sys.executable, "-m", "services.usage", "show", "--user", name, "--csv"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
    return list(csv.DictReader(io.StringIO(done.stdout)))


async def rows_when(data_dir: Path, name: str, ready, timeout: float) -> list[dict[str, str]]:
    deadline = asyncio.get_running_loop().time() + timeout
    while not ready(rows := usage_rows(data_dir, name)):
        assert asyncio.get_running_loop().time() < deadline, rows
        await asyncio.sleep(0.5)
    return rows


@in_loop
async def test_chat_and_api_usage_is_kept_per_person_per_utc_day(password_server: AppServer) -> None:
    data_dir = Path(password_server.env["DATA_DIR"])
    for name, password in (HOSTILE, OTHER):
        accounts(data_dir, "add", name, stdin=password + "\n")
    client = ChatClient(password_server.base_url, *HOSTILE)
    await client.connect()
    assert (await client.ask("Hello, how are you?")).final
    key = accounts(data_dir, "key", "create", HOSTILE[0]).stdout.split()[0]
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(base_url=password_server.base_url, timeout=60) as http:
        headers = {"Authorization": f"Bearer {key}"}
        assert (await http.post("/v1/chat/completions", json=body, headers=headers)).status_code == 200
        streamed = await http.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers)
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
    (row,) = await rows_when(
        data_dir, HOSTILE[0], lambda rows: rows and rows[0]["api_calls"] == "2", FLUSH_BOUND_SECONDS
    )
    assert row["person"] == "'" + HOSTILE[0], "shown as text, never as a formula"
    assert row["day"] == datetime.now(UTC).date().isoformat() or datetime.now(UTC).hour == 0
    assert row["turns"] == "1" and row["documents"] == "0" and row["refusals"] == "0", row
    assert int(row["prompt_tokens"]) > 20 and int(row["answer_tokens"]) > 0, row
    assert usage_rows(data_dir, OTHER[0]) == [], "nobody else's usage is theirs"

    await client.send("/quota")
    await asyncio.sleep(1)
    shown = [d["output"] for name, d in client.events if name == "new_message" and d.get("name") == "quota"]
    used = int(row["prompt_tokens"]) + int(row["answer_tokens"])
    assert shown and f"today (UTC): {used:,} of 2,000,000 tokens used" in shown[-1], shown
    await client.close()
