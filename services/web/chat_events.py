"""Chainlit's chat events, one method each for app.py's handlers: a tab whose sign-in ended is told so,
the chat commands (services/chat/commands.py's table: `/help`, `/key ...`, `/quota`, `/export`, ...)
are offered as the page's `/` menu and answered here, and everything else is a chat turn
(services/chat/turns.py) on this tab's page."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import chainlit as cl

from services.accounts.sign_in import SignIn
from services.admission.refusals import Refused
from services.chat import rewinds
from services.chat.commands import Command, command_of, help_text, is_command, menu, offered
from services.chat.turns import ChatTurns
from services.history.data_layer import is_uuid
from services.history.resume import CUT_ANSWER_NOTICE, unanswered_message
from services.runtime import Runtime
from services.web.chainlit_state import drop_chainlit_session, forget_chat_context, socket_connected
from services.web.chat_page import ChainlitPage
from services.web.key_chat import answer_key_command
from services.web.presets_chat import (
    answer_preset_command,
    chat_profiles,
    default_settings,
    save_if_asked,
    starters,
)
from services.web.quota_chat import answer_quota_command
from services.web.transfer_chat import answer_transfer_command

Files = list[tuple[str, str]]  # (path, name) of a message's attachments


class ChatEvents:
    """What each chat event does, over the runtime's chat turns (which exist once it started)."""

    def __init__(self, runtime: Runtime, sign_in: SignIn) -> None:
        self.runtime = runtime
        self.sign_in = sign_in
        self.page = ChainlitPage(people_sign_in=sign_in.mode != "local")  # the local user: one per address

    def _turns(self) -> ChatTurns:
        serving = self.runtime.running()
        assert serving is not None, "Chainlit serves no chat before its startup hook ran"
        return serving.turns

    async def chat_start(self) -> None:
        if not await self._sign_in_ended():  # a new chat starts with the person's default settings
            await self._turns().start(self.page, await default_settings(self.runtime.presets))
            await cl.context.emitter.set_commands(menu(await self._commands()))

    async def chat_resume(self, thread: Mapping[str, Any]) -> None:
        if not await self._sign_in_ended():
            await self._turns().resume(self.page, thread)
            await cl.context.emitter.set_commands(menu(await self._commands()))
            if unanswered_message(thread.get("steps") or []) is not None:  # e.g. its replica went down
                await self.page.notice(CUT_ANSWER_NOTICE)

    async def settings_update(self, values: dict) -> None:
        await self._turns().update_settings(self.page, values)
        await save_if_asked(self.runtime.presets, values, self._in_effect())

    async def message(self, message: cl.Message) -> None:
        if await self._sign_in_ended():  # an open tab's sign-in ended since it connected
            return
        files = [(e.path, e.name) for e in message.elements if getattr(e, "path", None)]
        command = command_of(message.content)  # a command picked from the menu arrives typed out
        if command is not None:  # said to the service, never to the model
            await self.answers(message.content, files)[command.word]()
        else:
            await self._turns().answer(self.page, message.content, files, message.id)

    def answers(self, text: str, files: Files) -> dict[str, Callable[[], Awaitable[None]]]:
        """Who answers each command of services/chat/commands.py's table, for this message."""
        transfer = partial(answer_transfer_command, self.runtime, text, files)  # export, import, links
        return {
            "/help": self._help,
            "/export": transfer,
            "/import": transfer,
            "/share": transfer,
            "/preset": partial(self._preset, text),
            "/template": partial(self._preset, text),
            "/quota": self._quota,
            "/key": partial(answer_key_command, self.runtime, text),
            "/stats": self._show_stats,  # operators' view; admins only
        }

    async def edit(self, message_id: str, text: str) -> None:
        """An edited message (its id and text checked by services/web/socket_guard.py): answered again
        in place of what followed it."""
        if await self._sign_in_ended():
            return
        if is_command(text):  # said to the service, not the model: sent anew
            await self.page.error("A command cannot be edited in: send it as a new message.")
            return
        await rewinds.edit(self._turns(), self.page, message_id, text)

    async def regenerate(self, action: cl.Action) -> None:
        """The Regenerate button: its payload is the client's, checked here and by rewinds.regenerate.
        The answer runs as the session's task (Stop cancels it); the button's request returns at once."""
        if await self._sign_in_ended():
            return
        answer_id = action.payload.get("answer_id")
        if not is_uuid(answer_id):
            await self.page.error(rewinds.NOT_LAST)
            return
        try:
            await self._turns().admission.message(self.page.person())  # a regenerate is a message too
        except Refused as refusal:
            await self.page.refused(refusal)
            return
        session = cl.context.session
        session.current_task = asyncio.create_task(self._regenerate(answer_id))

    async def _regenerate(self, answer_id: str) -> None:
        emitter = cl.context.emitter
        await emitter.task_start()
        try:
            await rewinds.regenerate(self._turns(), self.page, answer_id)
        except asyncio.CancelledError:  # Stop, or the page went away: the turn ended itself
            pass
        finally:
            await emitter.task_end()

    async def starters(self, user: Any) -> list[cl.Starter]:
        return await starters(self.runtime.presets, user)

    def chat_profiles(self) -> list[cl.ChatProfile]:
        serving = self.runtime.running()
        models = serving.models if serving is not None else None
        return chat_profiles(self.runtime.settings, models.names if models and len(models) > 1 else None)

    def stop(self) -> None:
        if (serving := self.runtime.running()) is not None:
            serving.turns.stop(cl.context.session.id)

    async def chat_end(self, keep_seconds: float) -> None:
        """Chainlit does not cancel a running on_message task on disconnect: this cancels it at once
        (aborting its engine request). The conversation stays `keep_seconds` (Chainlit's
        session_timeout) so a reconnecting page continues where it was; "New chat" (clear_session)
        ends it now, when that event is handled before the disconnect (the page sends both at once).
        Sessions dropped for the bound on those awaiting their page lose Chainlit's copy now."""
        dropped: list[str] = []
        if (serving := self.runtime.running()) is not None:
            dropped = serving.turns.end(cl.context.session.id, cl.context.session.to_clear, keep_seconds)
        forget_chat_context(cl.context.session.id)
        for session_id in dropped:
            await drop_chainlit_session(session_id)

    async def drop_gone_pages(self) -> int:
        """A maintenance round's step: sessions whose page is not there, though no disconnect reached
        them (the page left while its chat start, message or setting was on the way, so Chainlit's
        disconnect ran before the session was made or touched again), end now with Chainlit's copy,
        rather than live until the idle TTL. Returns how many."""
        serving = self.runtime.running()
        if serving is None:
            return 0
        sessions = serving.turns.sessions
        gone = [s for s in sessions.believed_connected() if not socket_connected(s)]
        for session_id in gone:
            sessions.close(session_id)
            await drop_chainlit_session(session_id)
        return len(gone)

    def _in_effect(self) -> dict[str, Any]:
        """This tab's chat settings in effect (what `/preset save` and the switch keep)."""
        sessions = self._turns().sessions
        session = sessions.get(cl.context.session.id)
        return sessions.chat_settings(session) if session is not None else {}

    async def _commands(self) -> list[Command]:
        """The commands this person may use here (administrators get /stats)."""
        admin = self.sign_in.required and await self.sign_in.role_of(cl.user_session.get("user")) == "admin"
        return offered(admin=admin, sharing=self.runtime.settings.sharing)

    async def _preset(self, text: str) -> None:
        """The person's own presets and templates, with this tab's settings in effect."""
        await answer_preset_command(self.runtime.presets, text, self._in_effect())

    async def _quota(self) -> None:
        """The person's tokens used and left."""
        await answer_quota_command(self.runtime, self.page.person())

    async def _help(self) -> None:
        """/help, answered by the service: the commands and what each does (not stored)."""
        reply = cl.Message(author="help", content=help_text(await self._commands()))
        reply.persisted = True  # a view of the moment, not part of the conversation
        await reply.send()

    async def _show_stats(self) -> None:
        if await self.sign_in.role_of(cl.user_session.get("user")) != "admin" or not self.sign_in.required:
            await cl.ErrorMessage("The /stats command is for administrators.").send()
            return
        text, png = await self.runtime.report.render()
        plot = [cl.Image(name="stats.png", content=png, mime="image/png", display="inline")] if png else []
        await cl.Message(author="stats", content=text, elements=plot).send()

    async def _sign_in_ended(self) -> bool:
        """True (and the user told) when this tab's sign-in ended since it connected: signed out, a new
        password or role, the account removed, or past SIGN_IN_LIFETIME_SECONDS."""
        problem = await self.sign_in.sessions.token_problem(getattr(cl.context.session, "token", None))
        if problem is None:
            return False
        await cl.ErrorMessage(f"{problem} (Reload the page.)").send()
        return True
