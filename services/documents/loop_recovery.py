"""A summary that loops before its shortest length goes on without the loop.

The loop guard (services/engine/loop_guard.py) stops a stream whose tail repeats itself and keeps
the text before the repetition. For a chat answer that is the end. A summary cut that early is no
summary: on a long license the default model wrote two sentences, paraphrased them over and over,
and the person got 28 words. So the final step of a summary is cut back to before the loop (a
`Rewrite` in the stream: the page shows the kept text in place of the loop) and a new request goes
on from the kept text, forbidden (vLLM's bad_words, echo_guard.past_a_loop) to write any four
words of the loop, of the step's instructions, or of the kept text, in that order while vLLM's
bounds leave room; up to SUMMARY_LOOP_RECOVERIES times. A loop after the summary's shortest
length, or one time too many, ends it with the loop guard's message as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable

from services.documents.echo_guard import past_a_loop
from services.engine import ChatEngine, Message, RepetitionError, Rewrite, SamplingSettings

logger = logging.getLogger(__name__)


async def going_on_past_loops(
    engine: ChatEngine,
    messages: list[Message],
    sampling: SamplingSettings,
    request_id: str,
    *,
    prose: bool,
    recoveries: int,
    on_recovery: Callable[[], None] = lambda: None,
) -> AsyncIterator[str]:
    """Stream the answer to `messages`; a loop before `sampling.min_new_tokens` is cut back (a
    `Rewrite`) and the answer goes on, `recoveries` times at most. Requests: `request_id`, then
    `request_id` + "1", "2"...; the error of the last loop carries the whole answer kept."""
    first = sampling
    kept = ""
    for attempt in range(recoveries + 1):
        step_id = f"{request_id}{attempt or ''}"
        shown = kept
        try:
            answer = engine.generate(messages, sampling, step_id, prose=prose, answer_prefix=kept)
            async with contextlib.aclosing(answer):
                async for delta in answer:
                    shown += delta
                    yield delta
            return
        except RepetitionError as error:
            error.kept_text = kept = kept + error.kept_text  # the whole answer, not this request's part
            tokens = engine.count_tokens(kept)
            if attempt == recoveries or tokens >= first.min_new_tokens:
                raise
            on_recovery()
            logger.info("request %s looped after %d tokens; it goes on without the loop", step_id, tokens)
            yield Rewrite(kept)
            sampling = dataclasses.replace(
                first,
                max_new_tokens=max(1, first.max_new_tokens - tokens),
                min_new_tokens=first.min_new_tokens - tokens,
                forbidden_phrases=past_a_loop(shown, kept, first.forbidden_phrases, engine.count_tokens),
            )
