"""Summaries of documents of any length: one pass when the plan reads it whole, map-reduce otherwise.

The map step submits every chunk at once (bounded by SUMMARY_CONCURRENCY) so
the engine batches them; cancelling the summary cancels every chunk request.
Single-pass prompts put the document first, in the system message, so a
follow-up question shares the summary request's prefix and vLLM's prefix
cache reuses its KV. The loop guard (services/engine/loop_guard.py) watches
every request for exact and (summaries being prose) paraphrased loops: a map
or reduce part that starts repeating itself keeps the text before the
repetition and the summary goes on (the user is told). A final summary that
loops before its shortest length is cut back to before the loop and goes on,
forbidden to say again what it said (SUMMARY_LOOP_RECOVERIES); a later loop
ends it with the guard's message. No map or reduce step may copy four words
of its instructions in a row (echo_guard.py: vLLM's bad_words), so a summary
in parts says what the document says, not what it was asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import AsyncIterator

from services.config import Settings
from services.documents.cache import SummaryCache, summary_key
from services.documents.chunking import split_into_chunks
from services.documents.echo_guard import StepGuards
from services.documents.language import answer_language, document_language
from services.documents.loop_recovery import going_on_past_loops
from services.documents.planning import (
    FOLLOW_UP_TURN_TOKENS,
    FOLLOW_UP_TURNS,
    Budget,
    DocumentPlan,
    plan_document,
)
from services.documents.progress import Progress, ProgressTracker
from services.documents.prompts import SummaryPrompts
from services.engine import (
    ChatEngine,
    Message,
    PrefillMeter,
    RepetitionError,
    SamplingSettings,
    TokenBudgetError,
    followed_by,
    tick_until_first,
)

logger = logging.getLogger(__name__)

MAX_REDUCE_LEVELS = 4  # each level shrinks the text several times; 4 covers any MAX_DOCUMENT_TOKENS
PROMPT_OVERHEAD_TOKENS = 160  # chat template + instruction around a chunk, with a margin
SUMMARY_MIN_TOKENS = 64  # shortest summary (vLLM's min_tokens): a long document never gets one line
SUMMARY_MAP_TOKENS = 200  # length budget of each part's summary in the map step
SUMMARY_LOOP_RECOVERIES = 1  # a summary looping before its minimum is cut back and goes on, this often
PROGRESS_INTERVAL_SECONDS = 2.0  # between progress updates while a document is read
# Summaries cached (by content and settings) for a document summarized again: entries, size, lifetime.
SUMMARY_CACHE_ENTRIES = 256
SUMMARY_CACHE_BYTES = 8 * 1024 * 1024
SUMMARY_CACHE_TTL_SECONDS = 86_400.0


@dataclasses.dataclass(frozen=True)
class SummaryJob:
    """One summary to make: the document, the request, and how to read it."""

    system_prompt: str
    name: str
    text: str
    request: str = ""
    language: str | None = None  # the document's; detected when None
    plan: DocumentPlan | None = None  # made when None


class Summarizer:
    """Summaries through the engine, cached by content and settings."""

    prose = True  # ChatEngine.generate's prose: the paraphrase guard and the stop at a "---" rule
    min_summary_tokens = SUMMARY_MIN_TOKENS  # these three a subclass may change (bench/documents/)
    map_tokens = SUMMARY_MAP_TOKENS
    follow_up_turns = FOLLOW_UP_TURNS

    def __init__(self, engine: ChatEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.cache = SummaryCache(SUMMARY_CACHE_ENTRIES, SUMMARY_CACHE_BYTES, SUMMARY_CACHE_TTL_SECONDS)
        self.prefill = PrefillMeter()
        # Held weakly (it goes with this summarizer); its owner also stops it with close().
        self.close = engine.on_finish(self.prefill.observe)
        self.loops_stopped = 0  # map/reduce parts cut short by the loop guard (benchmarks read it)

    # --- planning ------------------------------------------------------------
    def answer_tokens(self) -> int:
        return min(self.settings.summary_max_tokens, self.engine.max_model_len // 4)

    def min_tokens(self, job: SummaryJob, document_tokens: int) -> int:
        """Shortest final summary: none for a request of the user's (it may ask for one line)."""
        if job.request.strip():
            return 0
        return min(self.min_summary_tokens, document_tokens // 4, self.answer_tokens() // 2)

    def _map_tokens(self, chunk_tokens: int) -> int:
        return max(32, min(self.map_tokens, self.answer_tokens(), chunk_tokens // 4))

    def chunk_tokens(self) -> int:
        """Chunk size for the map step: SUMMARY_CHUNK_TOKENS, capped by the context window."""
        room = self.engine.max_model_len - PROMPT_OVERHEAD_TOKENS - self.map_tokens
        return max(64, min(self.settings.summary_chunk_tokens, room))

    def budget(self) -> Budget:
        s = self.settings
        return Budget(
            self.engine.max_model_len,
            self.answer_tokens(),
            self.follow_up_turns,
            FOLLOW_UP_TURN_TOKENS,
            s.single_pass_max_tokens,
        )

    def plan(self, job: SummaryJob, document_tokens: int | None = None) -> DocumentPlan:
        """Whole or in parts, from the single-pass prompt's size and the room it must leave."""
        prompts = self.prompts(job)
        prompt_tokens = len(
            self.engine.encode_chat(prompts.single_pass(job.system_prompt, job.name, job.text))
        )
        tokens = self.engine.count_tokens(job.text) if document_tokens is None else document_tokens
        return plan_document(tokens, prompt_tokens, self.budget())

    def prompts(self, job: SummaryJob) -> SummaryPrompts:
        language = job.language or document_language(job.text)
        return SummaryPrompts(answer_language(job.request, language), job.request)

    def step_guards(self, prompts: SummaryPrompts, job: SummaryJob) -> StepGuards:
        """What each step may not write: its own instructions' phrases."""
        return StepGuards(prompts, job.text, self.engine.count_tokens)

    def fingerprint(self, job: SummaryJob, sampling: SamplingSettings, plan: DocumentPlan) -> str:
        """What besides the text changes a summary."""
        s = self.settings
        parts = (
            s.model_path,
            job.system_prompt,
            job.request.strip(),
            self.prompts(job).language,
            plan.path,
            repr(dataclasses.astuple(sampling)),
            str(self.answer_tokens()),
            str(s.summary_chunk_tokens),
            str(self.map_tokens),
            str(self.min_tokens(job, plan.document_tokens)),
        )
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    # --- running -------------------------------------------------------------
    async def summarize(
        self, job: SummaryJob, sampling: SamplingSettings, request_id: str, progress: Progress | None = None
    ) -> AsyncIterator[str]:
        """Stream the summary of the job's document; cached results come back at once."""
        plan = job.plan or self.plan(job)
        sampling = dataclasses.replace(sampling, max_new_tokens=self.answer_tokens())
        key = summary_key(job.text, self.fingerprint(job, sampling, plan))
        cached = self.cache.get(key)
        if cached is not None:
            yield cached
            return
        prompts = self.prompts(job)
        guards = self.step_guards(prompts, job)
        tracker = ProgressTracker(progress, self.prefill, plan.document_tokens)
        if plan.whole:
            messages = prompts.single_pass(job.system_prompt, job.name, job.text)
            forbidden = ()
        else:
            chunks = split_into_chunks(job.text, self.engine.count_tokens, self.chunk_tokens())
            partials = await self._map(chunks, prompts, guards, sampling, request_id, tracker)
            partials = await self._reduce_until_it_fits(partials, prompts, guards, sampling, request_id)
            messages = prompts.reduce(self.settings.system_prompt, partials)
            forbidden = guards.reduce(self.settings.system_prompt)
        sampling = dataclasses.replace(
            sampling, min_new_tokens=self.min_tokens(job, plan.document_tokens), forbidden_phrases=forbidden
        )
        summary = ""
        stream = self._final_step(messages, sampling, request_id)
        async with contextlib.aclosing(tick_until_first(stream, tracker.tick, self._interval())) as deltas:
            async for delta in deltas:
                if not summary:
                    with contextlib.suppress(Exception):  # progress never breaks the summary
                        await tracker.finish()
                summary = followed_by(summary, delta)
                yield delta
        self.cache.put(key, summary)

    def _final_step(
        self, messages: list[Message], sampling: SamplingSettings, request_id: str
    ) -> AsyncIterator[str]:
        """The step that writes the summary, going on past a loop the guard stops."""
        return going_on_past_loops(
            self.engine,
            messages,
            sampling,
            f"{request_id}-final",
            prose=self.prose,
            recoveries=SUMMARY_LOOP_RECOVERIES,
            on_recovery=self._loop_recovered,
        )

    def _loop_recovered(self) -> None:
        self.loops_stopped += 1

    def _interval(self) -> float:
        return PROGRESS_INTERVAL_SECONDS

    async def _map(
        self,
        chunks: list[str],
        prompts: SummaryPrompts,
        guards: StepGuards,
        sampling: SamplingSettings,
        request_id: str,
        tracker: ProgressTracker,
    ) -> list[str]:
        """Summarize every chunk concurrently; cancelling this cancels (aborts) them all."""
        total = len(chunks)
        limit = asyncio.Semaphore(self.settings.summary_concurrency)
        map_sampling = dataclasses.replace(
            sampling,
            max_new_tokens=self._map_tokens(self.chunk_tokens()),
            forbidden_phrases=guards.map_part(self.settings.system_prompt),
        )
        tracker.split(total, min(self.chunk_tokens(), tracker.tokens_total))

        async def one(index: int, chunk: str) -> str:
            messages = prompts.map_part(self.settings.system_prompt, chunk, index + 1, total)
            async with limit:
                summary, looped = await self._complete(messages, map_sampling, f"{request_id}-map-{index}")
            await tracker.part_done(self.engine.count_tokens(chunk), looped)
            return summary

        await tracker.tick()
        ticker = asyncio.create_task(self._tick_every(tracker))
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(one(i, chunk)) for i, chunk in enumerate(chunks)]
        finally:
            ticker.cancel()
            await asyncio.wait([ticker])
        tracker.combining = True
        await tracker.tick()
        return [task.result() for task in tasks]

    async def _tick_every(self, tracker: ProgressTracker) -> None:
        while True:
            await asyncio.sleep(self._interval())
            with contextlib.suppress(Exception):  # progress is a courtesy: it never breaks the summary
                await tracker.tick()

    def _fits(self, partials: list[str], prompts: SummaryPrompts) -> bool:
        tokens = len(self.engine.encode_chat(prompts.reduce(self.settings.system_prompt, partials)))
        return tokens + self.answer_tokens() <= self.engine.max_model_len

    async def _reduce_until_it_fits(
        self,
        partials: list[str],
        prompts: SummaryPrompts,
        guards: StepGuards,
        sampling: SamplingSettings,
        request_id: str,
    ) -> list[str]:
        """Merge groups of partial summaries (concurrently) until all of them fit one prompt."""
        sampling = dataclasses.replace(sampling, forbidden_phrases=guards.reduce(self.settings.system_prompt))
        for level in range(MAX_REDUCE_LEVELS):
            if self._fits(partials, prompts) or len(partials) == 1:
                return partials
            groups = self._groups_that_fit(partials, prompts)
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(
                        self._complete(
                            prompts.reduce(self.settings.system_prompt, members),
                            sampling,
                            f"{request_id}-reduce{level}-{i}",
                        )
                    )
                    for i, members in enumerate(groups)
                ]
            partials = [task.result()[0] for task in tasks]
        if not self._fits(partials, prompts):
            raise TokenBudgetError("The document's partial summaries still do not fit the context window.")
        return partials

    def _groups_that_fit(self, partials: list[str], prompts: SummaryPrompts) -> list[list[str]]:
        groups: list[list[str]] = [[]]
        for summary in partials:
            if groups[-1] and not self._fits([*groups[-1], summary], prompts):
                groups.append([])
            groups[-1].append(summary)
        if len(groups) == 1 and len(partials) > 1:  # never "reduce" to the same list
            middle = len(partials) // 2
            groups = [partials[:middle], partials[middle:]]
        return groups

    async def _complete(
        self, messages: list[Message], sampling: SamplingSettings, request_id: str
    ) -> tuple[str, bool]:
        """The whole answer, and whether the loop guard cut it (then the text before the loop)."""
        try:
            return "".join(
                [
                    delta
                    async for delta in self.engine.generate(messages, sampling, request_id, prose=self.prose)
                ]
            ), False
        except RepetitionError as error:
            self.loops_stopped += 1
            logger.info(
                "request %s started repeating itself; kept %d characters", request_id, len(error.kept_text)
            )
            return error.kept_text, True
