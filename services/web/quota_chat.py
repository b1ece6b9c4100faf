"""`/quota` in the chat: a signed-in person sees the tokens they used and have left, today and this
month, and when each budget resets."""

from __future__ import annotations

import chainlit as cl

from services.runtime import Runtime

NOT_KEPT = "No token budget applies here: usage is kept for signed-in people only."


async def answer_quota_command(runtime: Runtime, person: str) -> None:
    """Answer one `/quota` message for `person` (admission's key); the answer is not kept."""
    serving = runtime.running()
    usage = serving.usage if serving is not None else None
    left = await usage.left(person) if usage is not None else None
    content = f"Your tokens (prompt + answer, chat and API together):\n\n{left}" if left else NOT_KEPT
    reply = cl.Message(author="quota", content=content)
    reply.persisted = True  # a view of the moment, not part of the conversation
    await reply.send()
