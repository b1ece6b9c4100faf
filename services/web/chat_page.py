"""The chat page of the Chainlit session being served, as `services.chat.turns.Page`: what a turn shows
(its answer, status, progress, notices, errors) in Chainlit's messages and steps."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import chainlit as cl
from chainlit.input_widget import Slider, Switch, TextInput
from chainlit.utils import utc_now

from services.admission.feedback import Show
from services.admission.refusals import Refused
from services.chat.session import ChatSession
from services.documents.progress import Progress
from services.history.resume import ANSWER_METADATA
from services.web.chainlit_state import current_user_identifier, forget_chat_context
from services.web.chat_feedback import StatusMessage, notice, session_user_key, summary_progress

REGENERATE_ACTION = "regenerate"  # the action's name: app.py's @cl.action_callback
OFFERED_KEY = "regenerate_action"  # Chainlit's user session: the Regenerate button shown, to take away


class Answer(cl.Message):
    """An answer: Chainlit gives a message its time when it is sent, so an answer cut short (Stop, an
    edit) was stored by `update()` with none, sorted first in its conversation and out of reach of
    a cut by time (services/history/branches.py)."""

    async def update(self) -> bool:
        self.created_at = self.created_at or utc_now()
        return await super().update()


class ChainlitPage:
    """One tab's chat, read from Chainlit's context of the event being handled."""

    def __init__(self, people_sign_in: bool) -> None:
        self._people_sign_in = people_sign_in  # False: the one local user, told apart by address

    @property
    def session_id(self) -> str:
        return cl.context.session.id

    @property
    def user_identifier(self) -> str | None:
        return current_user_identifier()

    @property
    def thread_id(self) -> str:
        return cl.context.session.thread_id

    @property
    def chosen_model(self) -> str | None:
        return cl.context.session.chat_profile

    def person(self) -> str:
        return session_user_key(people_sign_in=self._people_sign_in)

    def reply(self) -> cl.Message:
        return Answer(content="", metadata=dict(ANSWER_METADATA))  # part of the model's history

    def status(self) -> Show:
        return StatusMessage().show

    def summary_progress(self) -> Progress:
        return summary_progress()

    @contextlib.asynccontextmanager
    async def reading(self) -> AsyncIterator[cl.Step]:
        async with cl.Step(name="Reading the document", type="tool") as step:
            yield step

    async def refused(self, refusal: Refused) -> None:
        told = cl.ErrorMessage(str(refusal))
        told.metadata = {"refused": refusal.reason}
        await told.send()

    async def error(self, text: str) -> None:
        await cl.ErrorMessage(text).send()

    async def notice(self, text: str) -> None:
        await notice(text)

    async def send_settings(self, session: ChatSession, max_new_tokens_limit: int) -> None:
        sampling = session.sampling
        await cl.ChatSettings(
            [
                Slider(
                    id="temperature",
                    label="Temperature",
                    initial=sampling.temperature,
                    min=0,
                    max=2,
                    step=0.05,
                ),
                Slider(id="top_p", label="Top p", initial=sampling.top_p, min=0.05, max=1, step=0.05),
                Slider(
                    id="max_new_tokens",
                    label="Max new tokens",
                    initial=sampling.max_new_tokens,
                    min=16,
                    max=max_new_tokens_limit,
                    step=16,
                ),
                TextInput(id="system_prompt", label="System prompt", initial=session.system_prompt),
                Switch(
                    id="save_as_default",
                    label="Save as my default",
                    initial=False,
                    description="While on, these settings are saved as the default of your new chats.",
                ),
            ]
        ).send()

    def keep_settings(self, values: dict[str, Any]) -> None:
        cl.context.session.chat_settings = values

    def forget(self) -> None:
        forget_chat_context(cl.context.session.id)

    async def offer_regenerate(self, answer_id: str | None) -> None:
        """The Regenerate button on the answer `answer_id` only: the one shown before is taken away."""
        offered = cl.user_session.get(OFFERED_KEY)
        if isinstance(offered, cl.Action):
            await offered.remove()
        action = None
        if answer_id is not None:
            action = cl.Action(
                name=REGENERATE_ACTION,
                payload={"answer_id": answer_id},
                label="Regenerate",
                tooltip="Answer the last message again",
                icon="refresh-cw",
            )
            await action.send(for_id=answer_id)
        cl.user_session.set(OFFERED_KEY, action)

    async def remove_messages(self, ids: list[str]) -> None:
        for step_id in ids:
            await cl.context.emitter.delete_step({"id": step_id})  # type: ignore[typeddict-item]

    def run(self, message_id: str | None) -> cl.Step:
        """Chainlit's run of an answer (as its on_message wrapper makes one, under the user's message):
        the page shows feedback buttons on a run's last answer."""
        return cl.Step(name="on_message", type="run", parent_id=message_id)

    async def show_edited(self, message_id: str, text: str) -> None:
        """The page truncates its chat at an edited message but keeps showing its old text until told."""
        await cl.context.emitter.update_step({"id": message_id, "output": text})  # type: ignore[typeddict-item]
