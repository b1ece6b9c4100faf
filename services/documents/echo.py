"""Instruction echo: the words of a summary that come from its own prompts, not from the document.

A small model asked to "keep the key facts, names and numbers" may write "The document
contains key facts, names and numbers": the summary repeats its instructions instead
of the document. Measured on word n-grams (lower-cased, punctuation stripped, every
number one token "#", so "part 3 of 7" matches "part {n} of {total}"): the summary's
n-grams that occur in the instruction text and not in the document (a document that
itself says those words never counts as echo): their count, their share of the summary's
n-grams, and the phrases they make.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

ECHO_NGRAM = 4
# A summary with more echoed 4-grams than this repeats its instructions: 3 are a copied run of 6
# words or several shorter ones. On the 40 summaries of 14 documents of the 2026-12-01 quality run
# (bench/documents/echo_rescore.py, BENCHMARKS.md) 34 had 0 or 1 ("of a longer document"), the 6
# that copy an instruction sentence 6 to 21.
ECHO_THRESHOLD = 2
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_NUMBER = re.compile(r"\d")
DOCUMENT_MARK = "\x00document\x00"  # stands for the document's text while instructions are collected
NAME_MARK = "\x00name\x00"


def words_of(text: str) -> list[str]:
    """Lower-cased words without punctuation; a word with a digit becomes "#"."""
    return ["#" if _NUMBER.search(w) else w for w in (m.lower() for m in _WORD.findall(text))]


def ngrams(text: str, n: int = ECHO_NGRAM) -> list[tuple[str, ...]]:
    """Word n-grams of `text`, in order (none for a text of fewer than n words)."""
    tokens = words_of(text)
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


@dataclass(frozen=True)
class Echo:
    """How much of a summary repeats its instructions: share of its n-grams, and the phrases."""

    score: float  # echoed n-grams / all n-grams of the summary (0.0 for a summary too short)
    echoed: int
    total: int
    phrases: tuple[str, ...]  # runs of consecutive echoed n-grams, joined back into words

    @property
    def repeats_instructions(self) -> bool:
        return self.echoed > ECHO_THRESHOLD


def instruction_ngrams(
    instructions: Iterable[str], document: str, n: int = ECHO_NGRAM
) -> set[tuple[str, ...]]:
    """The instructions' n-grams that the document does not contain."""
    wanted = {gram for text in instructions for gram in ngrams(text, n)}
    return wanted - set(ngrams(document, n)) if wanted else wanted


def echo_of(summary: str, instructions: Iterable[str], document: str, n: int = ECHO_NGRAM) -> Echo:
    """The summary's echo of `instructions`, not counting n-grams that `document` holds too."""
    echo_grams = instruction_ngrams(instructions, document, n)
    grams = ngrams(summary, n)
    hits = [gram in echo_grams for gram in grams]
    phrases: list[str] = []
    run: list[tuple[str, ...]] = []
    for gram, hit in [*zip(grams, hits, strict=True), ((), False)]:
        if hit:
            run.append(gram)
        elif run:
            phrases.append(" ".join([*run[0], *(g[-1] for g in run[1:])]))
            run = []
    echoed = sum(hits)
    return Echo(echoed / len(grams) if grams else 0.0, echoed, len(grams), tuple(phrases))


def instruction_texts(prompts, system_prompt: str) -> list[str]:
    """Every instruction string a summary with `prompts` (a SummaryPrompts) sends, without the document.

    Built by asking the prompts for each step's messages around marks that stand for the
    document, its name and the partial summaries, then cutting the marks out: whatever
    is left is what the summarizer itself says to the model.
    """
    steps = (
        prompts.single_pass(system_prompt, NAME_MARK, DOCUMENT_MARK),
        prompts.map_part(system_prompt, DOCUMENT_MARK, 1, 2),
        prompts.reduce(system_prompt, [DOCUMENT_MARK]),
    )
    texts = []
    for messages in steps:
        for message in messages:
            for piece in str(message["content"]).replace(NAME_MARK, DOCUMENT_MARK).split(DOCUMENT_MARK):
                if piece.strip():
                    texts.append(piece)
    return texts
