"""`/key new|list|revoke` in the chat: a signed-in person manages their own API keys."""

from __future__ import annotations

import os

import chainlit as cl
from chainlit.config import config as chainlit_config

from services.accounts.key_commands import run_key_command
from services.runtime import Runtime


async def answer_key_command(runtime: Runtime, text: str) -> None:
    """Answer one `/key` message; the answer is never stored (a new key is shown once, here only)."""
    user = cl.context.session.user
    keys = runtime.api.keys if runtime.api is not None else None
    run = chainlit_config.run
    base_url = (os.environ.get("CHAINLIT_URL") or f"http://{run.host}:{run.port}").rstrip("/") + run.root_path
    audit = runtime.history.audit if runtime.history is not None else None
    content = await run_key_command(keys, user and user.identifier, text, base_url, audit)
    reply = cl.Message(author="keys", content=content)
    reply.persisted = True  # never stored: a new key is shown once, in this page only
    await reply.send()
