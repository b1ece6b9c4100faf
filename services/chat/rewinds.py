"""Edit a sent message, regenerate the last answer: the conversation goes back to a branch point, in
what the model knows (branch.py), what is stored (KeptConversations.cut_branch) and what the page
shows, and the message is answered again as a turn like any other (ChatTurns.run: the running answer
aborted first, admission and the person's limits, Stop).

The ids come from a client: a message must be one this session sent (its history, or the turn being
answered), or one stored in this conversation of this person; an answer must be the last one.
Neither check changes anything, so a refused id aborts nothing and deletes nothing.
"""

from __future__ import annotations

import dataclasses

from services.chat import branch
from services.chat.page import Page
from services.chat.session import ChatSession
from services.chat.turns import Asked, ChatTurns
from services.engine import SamplingSettings

# A regenerated answer samples at least this hot: at the default temperature (or greedy) the small
# models repeat their answer word for word, and the point of asking again is another one.
REGENERATE_MIN_TEMPERATURE = 0.7

NOT_YOURS = "Only your own messages of this conversation can be edited."
NOT_LAST = "Only the last answer can be regenerated: this one has newer messages after it."
UNSAVED = "This cannot be changed right now: chat history is unavailable. Please try again later."


async def edit(turns: ChatTurns, page: Page, message_id: str, text: str) -> None:
    """The message `message_id` now says `text`: what came after it goes, and it is answered again."""
    session = await turns.open(page)
    if session is None:
        return
    kept = turns.history
    if not branch.knows_user_message(session, message_id) and not await kept.owns_user_message(
        page.thread_id, page.user_identifier, message_id
    ):
        await page.error(NOT_YOURS)
        return

    async def cut() -> bool:
        cut_ids = await kept.cut_branch(page.thread_id, message_id, True, text)
        if cut_ids is None:
            await page.error(UNSAVED)
            return False
        went = branch.rewind(session, {message_id, *cut_ids})
        # The page cut its chat when the edit was pressed; an answer the edit stopped may have
        # started streaming after that, and would stay on the page.
        await page.remove_messages(sorted({step_id for step_id in went if step_id} - {message_id}))
        await page.show_edited(message_id, text)
        return True

    await turns.run(page, session, Asked(text, message_id=message_id, cut=cut))


async def regenerate(turns: ChatTurns, page: Page, answer_id: str) -> None:
    """The last answer (`answer_id`) goes, with anything shown after it, and its message is answered again."""
    session = await turns.open(page)
    if session is None:
        return
    last = branch.last_turn(session)
    if last is None or last.answer_id != answer_id:
        await page.error(NOT_LAST)
        return

    async def cut() -> bool:
        cut_ids = await turns.history.cut_branch(page.thread_id, answer_id, False, None)
        if cut_ids is None:
            await page.error(UNSAVED)
            return False
        branch.rewind(session, {step_id for step_id in (last.message_id, answer_id) if step_id})
        await page.remove_messages(sorted({answer_id, *cut_ids}))
        return True

    asked = Asked(last.text, message_id=last.message_id, cut=cut, sampling=_again(session))
    await turns.run(page, session, asked)


def _again(session: ChatSession) -> SamplingSettings:
    sampling = session.sampling
    return dataclasses.replace(sampling, temperature=max(sampling.temperature, REGENERATE_MIN_TEMPERATURE))
