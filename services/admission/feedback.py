"""What a waiting user is told: their place and an estimate, every second, until the answer starts.

The numbers are the line's own (place among the waiting requests) and the
service times it measured; the caller shows the text and removes it when the
first token of the answer arrives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from services.admission.context import TurnContext
from services.admission.refusals import rounded_seconds
from services.admission.waiting_line import WaitingLine

FEEDBACK_INTERVAL_SECONDS = 1.0
QUIET_SECONDS = 1.5  # an answer that starts sooner shows no status at all

Show = Callable[[str | None], Awaitable[None]]  # show a status text; None removes it


def status_text(line: WaitingLine, context: TurnContext, now: float) -> str | None:
    """The status of a turn that has no answer yet: its place in line, or how long it has been working."""
    place = line.place_of(context)
    if place is not None:
        ahead, estimate = place
        where = (
            "you are next in line"
            if ahead == 0
            else f"{ahead} request{'s' if ahead != 1 else ''} ahead of yours"
        )
        wait = rounded_seconds(estimate)
        waited = int(now - context.started_at)
        return (
            f"⏳ The service is busy: {where}, about {wait} to wait (waiting {waited} s so far). "
            "Your answer will appear here."
        )
    elapsed = now - context.started_at
    if elapsed >= QUIET_SECONDS:
        return f"⏳ Working on your answer… {int(elapsed)} s"
    return None


class WaitingFeedback:
    """Runs next to a turn: shows its status every FEEDBACK_INTERVAL_SECONDS until `stop`."""

    def __init__(self, line: WaitingLine, context: TurnContext, show: Show, enabled: bool = True) -> None:
        self._enabled = enabled
        self._line = line
        self._context = context
        self._show = show
        self._shown = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._enabled:
            self._task = asyncio.create_task(self._run(), name="waiting-feedback")

    async def _run(self) -> None:
        while True:
            now = self._line.clock()
            text = status_text(self._line, self._context, now)
            if text is not None:
                self._shown = True  # before the await: a cancelled send may still have shown it
                await self._show(text)
            # The first status comes when the quiet time ends, not at the next whole interval (that
            # left 2.05 s without a word in the fourth overload run).
            quiet_left = self._context.started_at + QUIET_SECONDS - now
            await asyncio.sleep(
                min(FEEDBACK_INTERVAL_SECONDS, quiet_left)
                if text is None and quiet_left > 0
                else FEEDBACK_INTERVAL_SECONDS
            )

    async def stop(self) -> None:
        """End the updates and remove the status (the answer takes its place). Safe to call twice."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self._shown:
            self._shown = False
            await self._show(None)
