"""Chainlit handlers: chat that streams answers from the in-process vLLM engine, for signed-in people
whose conversations are kept.

Flow: handler -> session store (history, budgets, turn lifetime) -> engine. Sign-in, stored
conversations and everything with state or rules live in services/; this file only wires
Chainlit's events to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.input_widget import Slider, TextInput
from chainlit.oauth_providers import get_configured_oauth_providers
from chainlit.server import app as http_app
from chainlit.types import ThreadDict

from services.accounts.key_commands import is_key_command
from services.admission.feedback import WaitingFeedback
from services.admission.refusals import Refused
from services.chat.session import ChatSession
from services.config import SettingsError
from services.engine import RepetitionError, report_failure
from services.history.resume import ANSWER_METADATA, is_command
from services.runtime import Runtime
from services.web.chainlit_state import current_user_identifier, forget_chat_context
from services.web.chat_feedback import StatusMessage, notice, session_user_key, summary_progress
from services.web.edge import install_edge
from services.web.key_chat import answer_key_command
from services.web.origins import origin_policy

runtime = Runtime()
oauth_providers = get_configured_oauth_providers()
chainlit_url = os.environ.get("CHAINLIT_URL", "")
try:  # a public address without sign-in or OPS_TOKEN stops here, with what to configure
    sign_in = runtime.set_up_people(chainlit_config.run.host, oauth_providers, chainlit_config.run.port)
    origins = origin_policy(chainlit_config.run.host, chainlit_config.run.port, chainlit_url,
                            runtime.settings.allowed_origins)  # fmt: skip
except SettingsError as error:
    raise SystemExit(str(error)) from None
install_edge(http_app, runtime, sign_in, origins, chainlit_url)


@cl.data_layer
def data_layer():  # None when nothing is stored (CHAT_HISTORY=false, anonymous)
    return runtime.history.layer if runtime.history else None


if sign_in.mode == "password":

    @cl.password_auth_callback
    async def password_sign_in(username: str, password: str) -> cl.User | None:
        return await sign_in.password(username, password)


if sign_in.mode in ("local", "header"):  # local: the one local user, without a login form

    @cl.header_auth_callback
    async def header_sign_in(headers) -> cl.User | None:
        return await sign_in.header(headers)


if oauth_providers and sign_in.mode in ("password", "oauth"):

    @cl.oauth_callback
    async def oauth_sign_in(provider_id: str, token: str, raw_user_data: dict, default_user: cl.User,
                            id_token: str | None = None) -> cl.User | None:  # fmt: skip
        return await sign_in.oauth(provider_id, token, raw_user_data, default_user, id_token)


@cl.on_app_startup
async def start_service() -> None:
    await runtime.start()


@cl.on_app_shutdown
async def stop_service() -> None:
    await runtime.stop()


@cl.on_chat_start
async def start_chat() -> None:
    if await sign_in_ended():
        return
    if session := await open_session():
        await send_chat_settings(session)
        await tell_history_state(session)


@cl.on_chat_resume
async def resume_chat(thread: ThreadDict) -> None:
    """A stored conversation opened from the sidebar (or after a reload): the model gets its turns back."""
    if await sign_in_ended():
        return
    session = await open_session()
    if session is None:
        return
    await runtime.history.restore(runtime.sessions, session, thread)
    await send_chat_settings(session)
    if session.document is not None:
        await notice(f"«{session.document.name}» is still attached: questions about it work as before.")
    await tell_history_state(session)


async def send_chat_settings(session: ChatSession) -> None:
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
    session = await open_session()
    if session is not None:
        runtime.sessions.update_settings(session, values)
    # Chainlit stored the values as sent (any keys, any sizes) and keeps them with the conversation:
    # what it keeps is what is in effect.
    cl.context.session.chat_settings = runtime.sessions.chat_settings(session) if session else {}


async def open_session() -> ChatSession | None:
    """This tab's session; None (and the user told why) when the service holds all it can."""
    try:
        return runtime.sessions.open(cl.context.session.id, current_user_identifier())
    except Refused as refusal:
        told = cl.ErrorMessage(str(refusal))
        told.metadata = {"refused": refusal.reason}
        await told.send()
        return None


@cl.on_message
async def answer(message: cl.Message) -> None:
    if await sign_in_ended():  # an open tab's sign-in ended since it connected
        return
    if is_key_command(message.content):  # the person's own API keys
        await answer_key_command(runtime, message.content)
        return
    if is_command(message.content):  # operators' view; admins only
        await show_stats()
        return
    session = await open_session()
    if session is None:
        return
    # Messages over MAX_MESSAGE_CHARS, and over the sender's message rate, never get here:
    # services/web/socket_guard.py refuses them before Chainlit stores them.
    await tell_history_state(session)
    reply = cl.Message(content="", metadata=dict(ANSWER_METADATA))  # marks it as part of the model's history
    try:
        await run_turn(session, message, reply)
    finally:
        # Also after a cancellation: a late reply.update() re-adds the session to
        # Chainlit's chat_contexts after on_chat_end has already cleared it.
        forget_chat_context(session.session_id)


async def run_turn(session: ChatSession, message: cl.Message, reply: cl.Message) -> None:
    """Answer one message (or file) into `reply`, streaming; refusals and failures end up in the reply."""
    files = [(e.path, e.name) for e in message.elements if getattr(e, "path", None)]
    person = session_user_key(people_sign_in=sign_in.mode != "local")  # the local user: one per address
    async with runtime.sessions.turn(session) as request_id:
        try:
            async with runtime.admission.turn(person, documents=len(files)) as turn:
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
            if isinstance(error, RepetitionError):  # show what the history keeps: no repetition
                reply.content = error.kept_text
            if not reply.content:
                reply.metadata = {}  # nothing the model said: not part of its history
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
            chat.summarize(session, text, request_id, summary_progress())
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
    if await sign_in.role_of(cl.user_session.get("user")) != "admin" or not sign_in.required:
        await cl.ErrorMessage("The /stats command is for administrators.").send()
        return
    text, png = await runtime.report.render()
    plot = [cl.Image(name="stats.png", content=png, mime="image/png", display="inline")] if png else []
    await cl.Message(author="stats", content=text, elements=plot).send()


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
    if result.document is not None and runtime.history.enabled:  # kept with the conversation
        await runtime.history.save_document(cl.context.session.thread_id, result.document)
    return result.document is not None


async def tell_history_state(session: ChatSession) -> None:
    """Say once when conversations stop being saved, and once when saving resumes."""
    if text := runtime.history.notice_for(session):
        await notice(text)


async def sign_in_ended() -> bool:
    """True (and the user told) when this tab's sign-in ended since it connected: signed out, a new
    password or role, the account removed, or past SIGN_IN_LIFETIME_SECONDS."""
    problem = await sign_in.sessions.token_problem(getattr(cl.context.session, "token", None))
    if problem is None:
        return False
    await cl.ErrorMessage(f"{problem} (Reload the page.)").send()
    return True


@cl.on_stop
async def stop_turn() -> None:
    runtime.sessions.stop(cl.context.session.id)


@cl.on_chat_end
async def end_chat() -> None:
    # Chainlit does not cancel a running on_message task on disconnect: this cancels it at once
    # (aborting its engine request). The conversation stays for Chainlit's session_timeout so a
    # reconnecting page continues where it was; "New chat" (clear_session) ends it now, when
    # that event is handled before the disconnect (the page sends both at once).
    if runtime.sessions is not None:
        if cl.context.session.to_clear:
            runtime.sessions.close(cl.context.session.id)
        else:
            runtime.sessions.disconnect(cl.context.session.id, chainlit_config.project.session_timeout)
    forget_chat_context(cl.context.session.id)
