"""The default model summarizes a long license in parts and says what the license says, not its prompts.

The document is numpy's LICENSE.txt as the venv installs it (not a file of this repository):
~10,800 tokens of license texts, over the default model's context, so the summary goes
map-reduce, the path whose instructions the default model used to repeat ("The document
contains key facts, names, commands and numbers..."). Its instruction echo
(services/documents/echo.py): at most ECHO_THRESHOLD echoed 4-grams. The prompts alone did not hold
it (the model still opened a summary with the reduce instruction in a full run); the sampler's
forbidden phrases (services/documents/echo_guard.py) do.
"""

from __future__ import annotations

import importlib.metadata

import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from services.config import Settings
from services.documents.echo import ECHO_THRESHOLD, echo_of, instruction_texts
from services.documents.prompts import SummaryPrompts

# a quality statistic on the default model: per commit, tests/unit/test_summary_echo.py
pytestmark = [pytest.mark.long, pytest.mark.asyncio(loop_scope="module")]

LICENSE_DISTRIBUTION = "numpy"


def installed_license(distribution: str) -> tuple[str, str]:
    """(file name, text) of the distribution's longest license file in the venv."""
    files = [f for f in importlib.metadata.files(distribution) or () if f.name.upper().startswith("LICENSE")]
    assert files, f"{distribution} installs no license file"
    longest = max(files, key=lambda f: f.locate().stat().st_size)
    return longest.name, longest.locate().read_text(encoding="utf-8")


async def test_a_long_license_summary_does_not_repeat_its_instructions(default_server: AppServer) -> None:
    name, text = installed_license(LICENSE_DISTRIBUTION)
    client = ChatClient(default_server.base_url)
    await client.connect()
    try:
        await client.update_settings(temperature=0.0)  # the same summary every run
        file_id = await client.upload(name, text.encode(), "text/plain")
        reply = await client.ask("", file_ids=[file_id], timeout=900)
        notices = [m["output"] for m in client.messages.values() if m.get("name") == "notice"]
    finally:
        await client.close()
    assert any("map-reduce" in notice for notice in notices), ("summarized in parts", notices)
    # The small model may still loop on this license; the loop guard then stops it and says so
    # (its own tests). What it wrote before that is the summary checked here.
    summary = (reply.final or "").split("⚠️")[0]
    assert len(summary.split()) >= 30, reply.final
    instructions = instruction_texts(SummaryPrompts("en"), Settings.from_env({}).system_prompt)
    echo = echo_of(summary, instructions, text)
    assert echo.echoed <= ECHO_THRESHOLD, (
        f"{echo.echoed} of the summary's 4-grams come from its instructions: {echo.phrases}\n{summary}"
    )
