"""Chainlit handlers: chat that streams answers from the in-process vLLM engine, for signed-in people
whose conversations are kept.

Each handler calls one thing. The parts are built in services/runtime.py (the composition root), a
chat event is handled by services/web/chat_events.py, and a turn runs in services/chat/turns.py.
"""

from __future__ import annotations

import os

import chainlit as cl
from chainlit.config import config as chainlit_config
from chainlit.oauth_providers import get_configured_oauth_providers
from chainlit.server import app as http_app
from chainlit.types import ThreadDict

from services.config import Settings, SettingsError
from services.runtime import Runtime, set_up_people
from services.web.chat_events import ChatEvents
from services.web.chat_page import REGENERATE_ACTION
from services.web.edge import install_edge
from services.web.origins import origin_policy
from services.web.upload_bounds import ChainlitUploads

settings = Settings.from_env()  # read once, validated here
oauth_providers = get_configured_oauth_providers()
chainlit_url = os.environ.get("CHAINLIT_URL", "")
host = chainlit_config.run.host
port = chainlit_config.run.port
try:  # a public address without sign-in or OPS_TOKEN stops here, with what to configure
    people = set_up_people(settings, host, oauth_providers, port)
    origins = origin_policy(host, port, chainlit_url, settings.allowed_origins)
except SettingsError as error:
    raise SystemExit(str(error)) from None
sign_in = people.sign_in
uploads = ChainlitUploads.from_settings(settings, people_sign_in=sign_in.mode != "local")
runtime = Runtime(settings, people)
chat = ChatEvents(runtime, sign_in)
runtime.run_each_round(uploads.sweep, chat.drop_gone_pages)
install_edge(http_app, runtime, sign_in, origins, chainlit_url, chat, uploads)


@cl.data_layer
def data_layer():  # None when nothing is stored (CHAT_HISTORY=false, anonymous)
    return people.history.layer


if sign_in.mode == "password":

    @cl.password_auth_callback
    async def password_sign_in(username: str, password: str) -> cl.User | None:
        return await sign_in.password(username, password)


if sign_in.mode == "ldap":  # the same form, answered by the directory

    @cl.password_auth_callback
    async def ldap_sign_in(username: str, password: str) -> cl.User | None:
        return await sign_in.ldap_password(username, password)


if sign_in.mode in ("local", "header"):  # local: the one local user, without a login form

    @cl.header_auth_callback
    async def header_sign_in(headers) -> cl.User | None:
        return await sign_in.header(headers)


if oauth_providers and sign_in.mode in ("password", "oauth"):

    @cl.oauth_callback
    async def oauth_sign_in(
        provider_id: str, token: str, raw_user_data: dict, default_user: cl.User, id_token: str | None = None
    ) -> cl.User | None:
        return await sign_in.oauth(provider_id, token, raw_user_data, default_user, id_token)


@cl.on_app_startup
async def start_service() -> None:
    await runtime.start()


@cl.on_app_shutdown
async def stop_service() -> None:
    await runtime.stop()


@cl.on_chat_start
async def start_chat() -> None:
    await chat.chat_start()


@cl.on_chat_resume
async def resume_chat(thread: ThreadDict) -> None:
    """A stored conversation opened from the sidebar (or after a reload): the model gets its turns back."""
    await chat.chat_resume(thread)


@cl.on_settings_update
async def update_settings(values: dict) -> None:
    await chat.settings_update(values)


@cl.on_message
async def answer(message: cl.Message) -> None:
    await chat.message(message)


@cl.action_callback(REGENERATE_ACTION)
async def regenerate(action: cl.Action) -> None:
    """The Regenerate button of the last answer."""
    await chat.regenerate(action)


@cl.on_stop
async def stop_turn() -> None:
    chat.stop()


@cl.on_chat_end
async def end_chat() -> None:
    await chat.chat_end(chainlit_config.project.session_timeout)


@cl.set_starters
async def starters(user: cl.User | None = None, language: str | None = None) -> list[cl.Starter]:
    """The person's saved prompt templates (services/presets), offered on a new chat."""
    return await chat.starters(user)


@cl.set_chat_profiles
async def chat_profiles(user: cl.User | None = None, language: str | None = None) -> list[cl.ChatProfile]:
    """The served models (MODELS) as the page's model menu; none when one model is served."""
    return chat.chat_profiles()
