"""The instructions' own phrases, forbidden in the summary they ask for (vLLM's `bad_words`).

Moving the instructions out of the user turn lowered instruction echo (echo.py measures it) but did
not end it: on a long license the default model still opened its final summary with the reduce
instruction ("The user sends notes on one document, in order...") and looped. A prompt can only ask;
the sampler can forbid. The map and reduce steps' instructions (system prompt and the step's
instruction; not the text being read, nor the person's own request) give their word 4-grams, as
written in the prompt, and vLLM sets the last token of each to -inf whenever the answer's previous
tokens spell the rest: the step cannot copy four instruction words in a row. A 4-gram the document
itself holds stays allowed (the echo measure does not count it either).

A single-pass summary gets none: it never went over the echo threshold (0 of 25 measured, 2026-12-01
and 2026-12-05), and forbidding its instruction's phrases ("its main points", "the names, commands
and numbers") lowered its mean coverage from 0.147 to 0.129 over 14 documents (BENCHMARKS.md).

vLLM takes at most VLLM_MAX_NUM_BAD_WORDS (128) token sequences of VLLM_MAX_BAD_WORDS_TOTAL_TOKENS
(1024) tokens in all per request, and each phrase makes up to two (with and without a leading space);
past either a request is refused (a GPU worker raises). So phrases are counted with the model's own
tokenizer and taken while both fit: every 4-gram as written first, then with its first letter's
case swapped (a copy that starts a sentence, or one in the middle of one) while room is left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from services.documents.echo import DOCUMENT_MARK, ECHO_NGRAM, NAME_MARK, ngrams, words_of
from services.documents.prompts import SummaryPrompts
from services.engine import Message

MAX_SEQUENCES = 128  # vLLM's defaults (envs.VLLM_MAX_NUM_BAD_WORDS, VLLM_MAX_BAD_WORDS_TOTAL_TOKENS)
MAX_TOKENS = 1024
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def phrases_of(text: str, n: int = ECHO_NGRAM) -> list[tuple[str, tuple[str, ...]]]:
    """Each run of `n` words of `text` as written (punctuation between them kept), with its n-gram."""
    words = list(_WORD.finditer(text))
    runs = []
    for i in range(len(words) - n + 1):
        phrase = text[words[i].start() : words[i + n - 1].end()]
        runs.append((phrase, tuple(words_of(phrase))))
    return runs


def forbidden_phrases(
    instructions: Iterable[str], document: str, count_tokens: Callable[[str], int]
) -> tuple[str, ...]:
    """The phrases a summary may not write: the instructions' 4-grams the document does not hold,
    as many as vLLM takes in one request (`count_tokens`: the model's tokenizer)."""
    allowed = set(ngrams(document))
    seen: set[tuple[str, ...]] = set()
    written: list[str] = []
    for text in instructions:
        for phrase, gram in phrases_of(text):
            if gram not in allowed and gram not in seen:
                seen.add(gram)
                written.append(phrase)
    swapped = [p[0].swapcase() + p[1:] for p in written if p[0].swapcase() != p[0]]
    return fitting([*written, *swapped], count_tokens)


def fitting(phrases: Iterable[str], count_tokens: Callable[[str], int]) -> tuple[str, ...]:
    """The first of `phrases` (without repeats) that vLLM takes together in one request."""
    taken: list[str] = []
    sequences = tokens = 0
    for phrase in dict.fromkeys(phrases):
        cost = count_tokens(phrase) + count_tokens(" " + phrase)
        if sequences + 2 > MAX_SEQUENCES or tokens + cost > MAX_TOKENS:
            break
        taken.append(phrase)
        sequences += 2
        tokens += cost
    return tuple(taken)


def past_a_loop(
    shown: str, kept: str, forbidden: Iterable[str], count_tokens: Callable[[str], int]
) -> tuple[str, ...]:
    """The phrases an answer that goes on after a loop may not write, as many as vLLM takes: the
    loop's 4-grams (what was `shown` past the `kept` text), then `forbidden`, then the kept text's
    own 4-grams, newest first, so it can say none of it again."""
    loop = [phrase for phrase, _ in phrases_of(shown[len(kept) :])]
    said = [phrase for phrase, _ in reversed(phrases_of(kept))]
    return fitting([*loop, *forbidden, *said], count_tokens)


def step_instructions(messages: list[Message], marks: Iterable[str]) -> list[str]:
    """The pieces of one step's messages around `marks` (stand-ins for what is read)."""
    pieces = []
    for message in messages:
        content = str(message["content"])
        for mark in marks:
            content = content.replace(mark, DOCUMENT_MARK)
        pieces.extend(piece for piece in content.split(DOCUMENT_MARK) if piece.strip())
    return pieces


class StepGuards:
    """The forbidden phrases of the steps of one summary in parts: map part and reduce."""

    def __init__(self, prompts: SummaryPrompts, document: str, count_tokens: Callable[[str], int]) -> None:
        self.prompts = prompts
        self.document = document
        self.count_tokens = count_tokens
        request = prompts.request.strip()
        self.marks = [NAME_MARK, *([request] if request else [])]  # the person's own words are allowed

    def _guard(self, messages: list[Message]) -> tuple[str, ...]:
        return forbidden_phrases(step_instructions(messages, self.marks), self.document, self.count_tokens)

    def map_part(self, system_prompt: str) -> tuple[str, ...]:
        return self._guard(self.prompts.map_part(system_prompt, DOCUMENT_MARK, 1, 2))

    def reduce(self, system_prompt: str) -> tuple[str, ...]:
        return self._guard(self.prompts.reduce(system_prompt, [DOCUMENT_MARK]))
