"""Chainlit handlers: chat that streams answers from the in-process vLLM engine.

Flow: handler -> session store (history, budgets, turn lifetime) -> engine.
Everything with state or rules lives in services/; this file only wires
Chainlit's events to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import chainlit as cl
from chainlit.input_widget import Slider, TextInput
from chainlit.server import app as http_app

from services.admission.errors import Refused
from services.admission.feedback import WaitingFeedback
from services.chat.session import ChatSession
from services.engine.errors import report_failure
from services.runtime import Runtime
from services.web.chainlit_state import forget_chat_context, tell_uploader
from services.web.routes import install_routes
from services.web.status_message import StatusMessage, user_key
from services.web.upload_guard import install_upload_guard

runtime = Runtime()
install_routes(http_app, runtime)
install_upload_guard(
    http_app,
    runtime.settings.max_upload_bytes,
    linger_seconds=runtime.settings.upload_linger_seconds,
    on_reject=tell_uploader,
)


@cl.on_app_startup
async def start_service() -> None:
    await runtime.start()


@cl.on_app_shutdown
async def stop_service() -> None:
    await runtime.stop()


@cl.on_chat_start
async def start_chat() -> None:
    session = await open_session()
    if session is None:
        return
    limit = runtime.settings.max_new_tokens_limit
    await cl.ChatSettings(
        [
            Slider(id="temperature", label="Temperature", initial=session.sampling.temperature,
                   min=0, max=2, step=0.05),
            Slider(id="top_p", label="Top p", initial=session.sampling.top_p, min=0.05, max=1, step=0.05),
            Slider(id="max_new_tokens", label="Max new tokens", initial=session.sampling.max_new_tokens,
                   min=16, max=limit, step=16),
            TextInput(id="system_prompt", label="System prompt", initial=session.system_prompt),
        ]
    ).send()  # fmt: skip


@cl.on_settings_update
async def update_settings(values: dict) -> None:
    if session := await open_session():
        runtime.sessions.update_settings(session, values)


async def open_session() -> ChatSession | None:
    """This tab's session; None (and the user told why) when the service holds all it can."""
    try:
        return runtime.sessions.open(cl.context.session.id)
    except Refused as refusal:
        told = cl.ErrorMessage(str(refusal))
        told.metadata = {"refused": refusal.reason}
        await told.send()
        return None


@cl.on_message
async def answer(message: cl.Message) -> None:
    if message.content.strip() == "/stats":  # operators' view; admins only when auth is on
        await show_stats()
        return
    session = await open_session()
    if session is None:
        return
    if len(message.content) > runtime.settings.max_message_chars:
        await cl.ErrorMessage(
            f"Your message has {len(message.content):,} characters; the limit is "
            f"{runtime.settings.max_message_chars:,}. Please shorten it."
        ).send()
        return
    reply = cl.Message(content="")
    try:
        await run_turn(session, message, reply)
    finally:
        # Also after a cancellation: a late reply.update() re-adds the session to
        # Chainlit's chat_contexts after on_chat_end has already cleared it.
        forget_chat_context(session.session_id)


async def run_turn(session: ChatSession, message: cl.Message, reply: cl.Message) -> None:
    """Answer one message (or file) into `reply`, streaming; refusals and failures end up in the reply."""
    files = [(e.path, e.name) for e in message.elements if getattr(e, "path", None)]
    async with runtime.sessions.turn(session) as request_id:
        try:
            async with runtime.admission.turn(user_key(), documents=len(files)) as turn:
                stream = await open_stream(session, message.content, files, request_id)
                if stream is not None:
                    await stream_into(reply, stream, runtime.admission.feedback(turn, StatusMessage().show))
        except Refused as refusal:  # the service is full, or a per-user limit: say when to retry
            runtime.chat.attachments.discard(files)
            reply.content += ("\n\n" if reply.content else "") + f"⏳ {refusal}"
            reply.metadata = {"refused": refusal.reason}
        except asyncio.CancelledError:
            if reply.content:
                await asyncio.shield(reply.update())
            raise
        except Exception as error:  # one error shape for every failure of a turn
            reply.content += ("\n\n" if reply.content else "") + f"⚠️ {report_failure(error, request_id)}"
        await reply.send()


async def open_stream(
    session: ChatSession, text: str, files: list[tuple[str, str]], request_id: str
) -> AsyncIterator[str] | None:
    """The answer's stream: a summary when files came with the message (the message is the
    request about them), else a chat reply; None when no file was readable."""
    chat = runtime.chat
    if files:
        return (
            chat.summarize(session, text, request_id, progress())
            if await read_documents(session, files)
            else None
        )
    prompt = chat.build_prompt(session, text)
    if prompt.dropped_messages:
        await notice(
            f"{prompt.dropped_messages} older message(s) were left out to fit "
            f"the model's {runtime.engine.max_model_len:,}-token context."
        )
    return chat.reply(session, prompt, request_id)


async def stream_into(reply: cl.Message, stream: AsyncIterator[str], feedback: WaitingFeedback) -> None:
    """Stream the answer into `reply`; until its first token the user sees their place in line."""
    feedback.start()
    try:
        # Closed here, not by the garbage collector: a Stop that lands while a
        # token is being sent must still end the engine request at once.
        async with contextlib.aclosing(stream):
            async for delta in stream:
                await feedback.stop()  # the answer takes the status message's place
                await reply.stream_token(delta)
    finally:
        await asyncio.shield(feedback.stop())


async def show_stats() -> None:
    user = cl.user_session.get("user")
    if user is not None and (user.metadata or {}).get("role") != "admin":
        await cl.ErrorMessage("The /stats command is for administrators.").send()
        return
    text, png = await runtime.report.render()
    plot = [cl.Image(name="stats.png", content=png, mime="image/png", display="inline")] if png else []
    await cl.Message(content=text, elements=plot).send()


async def read_documents(session: ChatSession, files: list[tuple[str, str]]) -> bool:
    """Attach uploaded files to the session, telling the user what happened; False if none was readable."""
    async with cl.Step(name="Reading the document", type="tool") as step:
        result = await runtime.chat.attach_files(session, files)
        if result.document is not None:
            step.output = f"«{result.document.name}»: {result.document.tokens:,} tokens."
    for error in result.errors:
        await cl.ErrorMessage(error).send()
    if result.notes:
        await notice(" ".join(result.notes))
    return result.document is not None


def progress() -> Callable[[int, int], Awaitable[None]]:
    """Progress reporter for map-reduce summaries: one step, updated per finished part."""
    step = cl.Step(name="Summarizing in parts", type="tool")

    async def report(done: int, total: int) -> None:
        step.output = f"Part {done} of {total} summarized." if done else f"Split into {total} parts."
        await (step.send() if done == 0 else step.update())

    return report


async def notice(text: str) -> None:
    await cl.Message(author="notice", content=f"_{text}_").send()


@cl.on_stop
async def stop_turn() -> None:
    if session := runtime.sessions.get(cl.context.session.id):
        session.cancel_turn()


@cl.on_chat_end
async def end_chat() -> None:
    # Chainlit does not cancel a running on_message task on disconnect: closing
    # the session cancels it (aborting its engine request) and frees its state.
    if runtime.sessions is not None:
        runtime.sessions.close(cl.context.session.id)
    forget_chat_context(cl.context.session.id)
