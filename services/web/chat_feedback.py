"""What the user is told while a turn runs: its place in line, a summary's progress, notices;
and who is asking (whose share a turn counts against).

The status message says where a turn stands while it has no answer yet (its
place in line, an estimate); the answer takes its place when its first token
arrives. Its `metadata.status` marks it for clients that tell it from answers.
"""

from __future__ import annotations

from typing import Any

import chainlit as cl

from services.admission.limits import user_key
from services.documents.progress import Progress, SummaryProgress

STATUS_KIND = "waiting"


class StatusMessage:
    """One chat message, created on the first status, updated in place, removed at the end."""

    def __init__(self) -> None:
        self._message: cl.Message | None = None

    async def show(self, text: str | None) -> None:
        """Show `text` (None removes the message)."""
        if text is None:
            message, self._message = self._message, None
            if message is not None:
                await message.remove()
            return
        if self._message is None:
            self._message = cl.Message(content=text, metadata={"status": STATUS_KIND})
            await self._message.send()
        elif self._message.content != text:
            self._message.content = text
            await self._message.update()


def session_user_key(people_sign_in: bool = True) -> str:
    """Whose share a turn counts against (`user_key`): the signed-in user, else the client's address.

    `people_sign_in` False (the one local user of a loopback install, or anonymous): everyone is
    the same user, so the address tells people apart. The address is the socket's TCP peer; behind a
    reverse proxy the app trusts (TRUSTED_PROXY_ADDRESSES, loopback by default; services/web/peers.py)
    it is the client named in X-Forwarded-For. (engine.io's own REMOTE_ADDR is always 127.0.0.1.)
    """
    return person_of(cl.context.session, people_sign_in)


def person_of(session: Any, people_sign_in: bool = True) -> str:
    """`session_user_key` of a Chainlit session named outside its context (an upload names it)."""
    user = session.user
    signed_in = user.identifier if people_sign_in and user is not None else None
    client = (session.environ.get("asgi.scope") or {}).get("client")
    return user_key(signed_in, client[0] if client else None)


def summary_progress() -> Progress:
    """Progress of a summary: one step, updated while the engine reads (tokens, parts, loops cut)."""
    step = cl.Step(name="Summarizing", type="tool")
    sent = False

    async def report(update: SummaryProgress) -> None:
        nonlocal sent
        step.output = update.describe()
        await (step.update() if sent else step.send())
        sent = True

    return report


async def notice(text: str) -> None:
    """A short italic note in the chat (not part of the model's history)."""
    await cl.Message(author="notice", content=f"_{text}_").send()
