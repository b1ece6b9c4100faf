"""Chainlit handlers: chat that streams answers from the in-process vLLM engine.

Flow: handler -> session store (history, budgets, turn lifetime) -> engine.
Everything with state or rules lives in services/; this file only wires
Chainlit's events to it.
"""

from __future__ import annotations

import asyncio
import contextlib

import chainlit as cl
from chainlit.input_widget import Slider, TextInput
from chainlit.server import app as http_app

from services.chat.session import ChatSession
from services.documents.progress import Progress, SummaryProgress
from services.engine.errors import report_failure
from services.runtime import Runtime
from services.web.chainlit_state import forget_chat_context, tell_uploader
from services.web.routes import install_routes
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
    session = runtime.sessions.open(cl.context.session.id)
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
    session = runtime.sessions.open(cl.context.session.id)
    runtime.sessions.update_settings(session, values)


@cl.on_message
async def answer(message: cl.Message) -> None:
    if message.content.strip() == "/stats":  # operators' view; admins only when auth is on
        await show_stats()
        return
    sessions = runtime.sessions
    session = sessions.open(cl.context.session.id)
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
    """Answer one message (or file) into `reply`, streaming; failures end up in the reply."""
    chat = runtime.chat
    async with runtime.sessions.turn(session) as request_id:
        try:
            files = [(e.path, e.name) for e in message.elements if getattr(e, "path", None)]
            if files and not await read_documents(session, files):
                return
            if files:  # a file with a message: the message is the request about the file
                stream = chat.summarize(session, message.content, request_id, progress())
            else:
                prompt = chat.build_prompt(session, message.content)
                if prompt.dropped_messages:
                    await notice(
                        f"{prompt.dropped_messages} older message(s) were left out to fit "
                        f"the model's {runtime.engine.max_model_len:,}-token context."
                    )
                stream = chat.reply(session, prompt, request_id)
            # Closed here, not by the garbage collector: a Stop that lands while a
            # token is being sent must still end the engine request at once.
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    await reply.stream_token(delta)
        except asyncio.CancelledError:
            if reply.content:
                await asyncio.shield(reply.update())
            raise
        except Exception as error:  # one error shape for every failure of a turn
            reply.content += ("\n\n" if reply.content else "") + f"⚠️ {report_failure(error, request_id)}"
        await reply.send()


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


def progress() -> Progress:
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
