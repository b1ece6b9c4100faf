"""`/export`, `/import` (with the file attached) and `/share` [`revoke`] in the chat: the page's way
to the export, import and share routes. Their answers are never stored (a share link is shown once).
An import that fails or is refused (a limit: services/transfer/limits.py) says so in a sentence, never
with the exception's text (Chainlit would show it)."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import chainlit as cl
from chainlit.config import config as chainlit_config

from services.runtime import Runtime
from services.transfer.archive import BadImport
from services.transfer.reading import FORMATS
from services.transfer.service import Imported
from services.transfer.store import PartlyStored
from services.web.transfer_routes import SHARE_PAGE

logger = logging.getLogger(__name__)

HELP = "Commands: `/export`, `/import` (attach the file), `/share`, `/share revoke`."


def base_url() -> str:
    run = chainlit_config.run
    return (os.environ.get("CHAINLIT_URL") or f"http://{run.host}:{run.port}").rstrip("/") + run.root_path


async def _say(text: str) -> None:
    reply = cl.Message(author="transfer", content=text)
    reply.persisted = True  # never stored: a share link is shown here once
    await reply.send()


async def answer_transfer_command(runtime: Runtime, text: str, files: list[tuple[str, str]]) -> None:
    """Answer one `/export`, `/import` or `/share` message; `files`: (path, name) of its attachments."""
    user = cl.context.session.user
    thread_id = cl.context.session.thread_id
    words = text.split()
    if runtime.transfers is None or user is None:
        await _say("Conversations are not kept on this server: there is nothing to export, import or share.")
    elif words[0] == "/export":
        await _say(_export_links(thread_id))
    elif words[0] == "/import":
        await _say(await _import(runtime, user.identifier, files))
    elif not runtime.settings.sharing:
        await _say("Sharing is off on this server.")
    elif words[1:] == ["revoke"]:
        revoked = await runtime.transfers.revoke(thread_id, user.identifier)
        await _say(f"Revoked {revoked or 0} link(s) to this conversation.")
    elif len(words) == 1:
        await _say(await _share(runtime, thread_id, user.identifier))
    else:
        await _say(HELP)


async def _share(runtime: Runtime, thread_id: str, owner: str) -> str:
    assert runtime.transfers is not None
    created = await runtime.transfers.share(thread_id, owner)
    if created is None:
        return "Nothing to share yet: send a message first."
    return (
        "Anyone with this link can read a copy of this conversation as it is now, until "
        f"{created.expires_at[:10]} (`/share revoke` ends it sooner):\n\n"
        f"{base_url()}{SHARE_PAGE}{created.token}"
    )


def _export_links(thread_id: str) -> str:
    root = chainlit_config.run.root_path
    one = f"{root}/conversations/{thread_id}/export"
    return (
        f"Download this conversation as [Markdown]({one}?format=md) or [JSON]({one}?format=json), "
        f"or [all your conversations]({root}/conversations/export) as one archive."
    )


async def _import(runtime: Runtime, owner: str, files: list[tuple[str, str]]) -> str:
    if len(files) != 1:
        return f"Attach one file to `/import`: {FORMATS}."
    assert runtime.transfers is not None
    path = Path(files[0][0])
    name = files[0][1]
    limit = runtime.settings.import_max_bytes
    try:
        if path.stat().st_size > limit:
            return f"«{name}» was not imported: it is larger than {limit:,} bytes."
        data = await asyncio.to_thread(path.read_bytes)
        imported = await runtime.transfers.import_file(owner, data, chainlit_config.ui.name)
    except BadImport as error:
        return f"«{name}» was not imported (nothing was stored): {error}"
    except PartlyStored as error:
        logger.exception("import of a file failed midway")
        return (
            f"«{name}» could not be imported: it failed midway, and {len(error.titles)} of its "
            f"conversation(s) were stored and could not be removed: {_listed(error.titles)}. They are "
            "in the sidebar: delete them, or keep them and import the rest later."
        )
    except Exception as error:  # not the file's fault (the database, a bug): the log says what, not the page
        logger.exception("import of a file failed: %s", type(error).__name__)
        return f"«{name}» could not be imported right now (nothing was stored). Try again in a while."
    return (
        f"Imported {len(imported.thread_ids)} conversation(s): {_listed(imported.titles)}."
        f"{_left_out(imported)} They are in the sidebar (reload the page if it does not show them yet)."
    )


def _listed(titles: list[str]) -> str:
    shown = ", ".join(f"«{title}»" for title in titles[:10])
    return shown + (f" and {len(titles) - 10} more" if len(titles) > 10 else "")


def _left_out(imported: Imported) -> str:
    """What the file held that was not stored: empty messages, and conversations of nothing else."""
    if not imported.empty_messages:
        return ""
    empty = f" {imported.empty_messages:,} empty message(s) were left out"
    if imported.empty_conversations:
        empty += f", and {imported.empty_conversations:,} conversation(s) that held nothing else"
    return empty + "."
