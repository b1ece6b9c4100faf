"""Summaries of documents of any length: one pass when it fits, map-reduce otherwise.

The map step submits every chunk at once (bounded by SUMMARY_CONCURRENCY) so
the engine batches them; cancelling the summary cancels every chunk request.
Prompts put the document first, in the system message, so a follow-up question
shares the summary request's prefix and vLLM's prefix cache reuses its KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from services.config import Settings
from services.documents.cache import SummaryCache, summary_key
from services.documents.chunking import split_into_chunks
from services.engine.chat_engine import ChatEngine, Message, SamplingSettings
from services.engine.errors import TokenBudgetError

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], Awaitable[None]]  # (parts done, parts in all)

MAX_REDUCE_LEVELS = 4  # each level shrinks the text several times; 4 covers any MAX_DOCUMENT_TOKENS
PROMPT_OVERHEAD_TOKENS = 160  # chat template + instruction around a chunk, with a margin


def document_system_message(system_prompt: str, name: str, text: str) -> Message:
    """The system message that carries a document; identical for summary and follow-ups."""
    return {
        "role": "system",
        "content": f"{system_prompt}\n\nThe user shared the document «{name}». Its full text:\n\n"
        f"<document>\n{text}\n</document>",
    }


def summary_instruction(request: str) -> str:
    """What the user asked for, or a default request; the answer follows the request's language."""
    if request.strip():
        return f"{request.strip()}\n\n(Answer about the document above, in the language of this request.)"
    return "Summarize the document above: its purpose, main points, and conclusions, in a few paragraphs."


def map_instruction(index: int, total: int, request: str) -> str:
    language = "in the language of this request: «" + request.strip() + "»" if request.strip() else ""
    return (
        f"This is part {index} of {total} of a longer document. Summarize this part: keep its key "
        f"facts, names and numbers, in one short paragraph {language}".strip()
    )


def reduce_instruction(request: str) -> str:
    base = (
        "Above are summaries of consecutive parts of one document. Combine them into one coherent "
        "summary of the whole document: purpose, main points, conclusions."
    )
    return f"{base}\n\nThe user's request: «{request.strip()}»; answer in its language." if request else base


@dataclass(frozen=True)
class SummaryPlan:
    """How a document will be summarized."""

    single_pass: bool
    chunks: tuple[str, ...]


class Summarizer:
    """Summaries through the engine, cached by content and settings."""

    def __init__(self, engine: ChatEngine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings
        self.cache = SummaryCache(
            settings.summary_cache_entries, settings.summary_cache_bytes, settings.summary_cache_ttl_seconds
        )

    # --- planning ------------------------------------------------------------
    def _answer_tokens(self) -> int:
        return min(self.settings.summary_max_tokens, self.engine.max_model_len // 4)

    def _map_tokens(self, chunk_tokens: int) -> int:
        return max(32, min(self._answer_tokens(), chunk_tokens // 6))

    def _chunk_tokens(self) -> int:
        """Chunk size for the map step: SUMMARY_CHUNK_TOKENS, capped by the context window."""
        room = self.engine.max_model_len - PROMPT_OVERHEAD_TOKENS
        room -= max(32, min(self._answer_tokens(), self.settings.summary_chunk_tokens // 6))
        return max(64, min(self.settings.summary_chunk_tokens, room))

    def single_pass_messages(self, system_prompt: str, name: str, text: str, request: str) -> list[Message]:
        return [
            document_system_message(system_prompt, name, text),
            {"role": "user", "content": summary_instruction(request)},
        ]

    def plan(self, system_prompt: str, name: str, text: str, request: str) -> SummaryPlan:
        """One pass if document + instructions + answer fit the context, else chunks."""
        messages = self.single_pass_messages(system_prompt, name, text, request)
        if len(self.engine.encode_chat(messages)) + self._answer_tokens() <= self.engine.max_model_len:
            return SummaryPlan(True, ())
        chunks = split_into_chunks(text, self.engine.count_tokens, self._chunk_tokens())
        return SummaryPlan(False, tuple(chunks))

    def fingerprint(self, system_prompt: str, request: str, sampling: SamplingSettings) -> str:
        """What besides the text changes a summary."""
        parts = (
            self.settings.model_path, system_prompt, request.strip(), str(sampling.temperature),
            str(sampling.top_p), str(self._answer_tokens()), str(self.settings.summary_chunk_tokens),
        )  # fmt: skip
        return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()

    # --- running -------------------------------------------------------------
    async def summarize(
        self,
        *,
        system_prompt: str,
        name: str,
        text: str,
        request: str,
        sampling: SamplingSettings,
        request_id: str,
        progress: Progress | None = None,
    ) -> AsyncIterator[str]:
        """Stream the summary of `text`; cached results come back at once."""
        key = summary_key(text, self.fingerprint(system_prompt, request, sampling))
        cached = self.cache.get(key)
        if cached is not None:
            yield cached
            return
        sampling = SamplingSettings(sampling.temperature, sampling.top_p, self._answer_tokens())
        plan = self.plan(system_prompt, name, text, request)
        if plan.single_pass:
            messages = self.single_pass_messages(system_prompt, name, text, request)
        else:
            partials = await self._map(plan.chunks, request, sampling, request_id, progress)
            partials = await self._reduce_until_it_fits(partials, request, sampling, request_id)
            messages = self._reduce_messages(partials, request)
        parts: list[str] = []
        stream = self.engine.generate(messages, sampling, f"{request_id}-final")
        async with contextlib.aclosing(stream):
            async for delta in stream:
                parts.append(delta)
                yield delta
        self.cache.put(key, "".join(parts))

    async def _map(
        self,
        chunks: tuple[str, ...],
        request: str,
        sampling: SamplingSettings,
        request_id: str,
        progress: Progress | None,
    ) -> list[str]:
        """Summarize every chunk concurrently; cancelling this cancels (aborts) them all."""
        total = len(chunks)
        limit = asyncio.Semaphore(self.settings.summary_concurrency)
        map_sampling = SamplingSettings(
            sampling.temperature, sampling.top_p, self._map_tokens(self._chunk_tokens())
        )
        done = 0

        async def one(index: int, chunk: str) -> str:
            nonlocal done
            messages = [
                {"role": "system", "content": self.settings.system_prompt},
                {"role": "user", "content": f"{chunk}\n\n---\n{map_instruction(index + 1, total, request)}"},
            ]
            async with limit:
                summary = await self._complete(messages, map_sampling, f"{request_id}-map-{index}")
            done += 1
            if progress is not None:
                await progress(done, total)
            return summary

        if progress is not None:
            await progress(0, total)
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i, chunk)) for i, chunk in enumerate(chunks)]
        return [task.result() for task in tasks]

    def _reduce_messages(self, partials: list[str], request: str) -> list[Message]:
        joined = "\n\n".join(f"Part {i + 1}: {summary.strip()}" for i, summary in enumerate(partials))
        return [
            {"role": "system", "content": self.settings.system_prompt},
            {"role": "user", "content": f"{joined}\n\n---\n{reduce_instruction(request)}"},
        ]

    def _fits(self, partials: list[str], request: str) -> bool:
        tokens = len(self.engine.encode_chat(self._reduce_messages(partials, request)))
        return tokens + self._answer_tokens() <= self.engine.max_model_len

    async def _reduce_until_it_fits(
        self, partials: list[str], request: str, sampling: SamplingSettings, request_id: str
    ) -> list[str]:
        """Merge groups of partial summaries (concurrently) until all of them fit one prompt."""
        for level in range(MAX_REDUCE_LEVELS):
            if self._fits(partials, request) or len(partials) == 1:
                return partials
            groups = self._groups_that_fit(partials, request)
            async with asyncio.TaskGroup() as group:
                tasks = [
                    group.create_task(
                        self._complete(
                            self._reduce_messages(members, request),
                            sampling,
                            f"{request_id}-reduce{level}-{i}",
                        )
                    )
                    for i, members in enumerate(groups)
                ]
            partials = [task.result() for task in tasks]
        if not self._fits(partials, request):
            raise TokenBudgetError("The document's partial summaries still do not fit the context window.")
        return partials

    def _groups_that_fit(self, partials: list[str], request: str) -> list[list[str]]:
        groups: list[list[str]] = [[]]
        for summary in partials:
            if groups[-1] and not self._fits([*groups[-1], summary], request):
                groups.append([])
            groups[-1].append(summary)
        if len(groups) == 1 and len(partials) > 1:  # never "reduce" to the same list
            middle = len(partials) // 2
            groups = [partials[:middle], partials[middle:]]
        return groups

    async def _complete(self, messages: list[Message], sampling: SamplingSettings, request_id: str) -> str:
        return "".join([delta async for delta in self.engine.generate(messages, sampling, request_id)])
