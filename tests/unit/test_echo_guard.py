"""The summary's forbidden phrases: each step's instruction 4-grams, as vLLM's bad_words takes them.

Pure logic on the prompts, counted with a stand-in tokenizer (a token per word), plus vLLM's own
SamplingParams with the default model's tokenizer: what a request is refused past, in process and
on a vLLM server alike, and what vLLM forbids.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from services.documents.echo import ECHO_THRESHOLD, echo_of, instruction_texts
from services.documents.echo_guard import (
    MAX_SEQUENCES,
    MAX_TOKENS,
    StepGuards,
    forbidden_phrases,
    past_a_loop,
    phrases_of,
)
from services.documents.prompts import WORDINGS, SummaryPrompts, wording
from services.engine.rewrite import Rewrite, followed_by

SYSTEM = "You are a helpful, concise assistant."
REDUCE = wording("en").reduce
LICENSE = "Permission is hereby granted, free of charge, to any person obtaining a copy of this software."
LANGUAGES = [*sorted(WORDINGS), "ja"]


def words(text: str) -> int:
    return len(text.split())


def every_step(guards: StepGuards) -> dict[str, tuple[str, ...]]:
    return {
        "map part": guards.map_part(SYSTEM),
        "reduce": guards.reduce(SYSTEM),
    }


def test_phrases_are_written_as_in_the_prompt_with_their_ngram() -> None:
    assert phrases_of("Keep names, commands and numbers.") == [
        ("Keep names, commands and", ("keep", "names", "commands", "and")),
        ("names, commands and numbers", ("names", "commands", "and", "numbers")),
    ]


def test_the_reduce_step_forbids_its_own_instruction_in_both_cases() -> None:
    forbidden = StepGuards(SummaryPrompts("en"), LICENSE, words).reduce(SYSTEM)
    assert "The user sends notes" in forbidden and "the user sends notes" in forbidden
    assert "You are a helpful" in forbidden and "you are a helpful" in forbidden


def test_words_the_document_says_itself_stay_allowed() -> None:
    document = f"{LICENSE} The user sends notes on one document to the maintainers."
    forbidden = forbidden_phrases([REDUCE], document, words)
    assert "The user sends notes" not in forbidden and "user sends notes on" not in forbidden
    assert "Write one summary of" in forbidden


def test_the_persons_own_request_and_the_documents_name_are_never_forbidden() -> None:
    request = "List the licence's conditions for every copy of the software."
    guards = StepGuards(SummaryPrompts("en", request), LICENSE, words)
    for step, forbidden in every_step(guards).items():
        text = " ".join(forbidden).lower()
        assert "conditions for every" not in text and "every copy of" not in text, step


def test_phrases_stop_at_vllms_bounds_as_written_ones_first() -> None:
    names = [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(400)]  # wa..: numbers are all "#"
    instructions = [" ".join(names)]
    forbidden = forbidden_phrases(instructions, "", words)
    assert len(forbidden) == MAX_SEQUENCES // 2, "two token sequences a phrase"
    assert forbidden[0] == "waa wab wac wad" and forbidden[-1].islower(), "as written first, in prompt order"
    heavy = forbidden_phrases(instructions, "", lambda text: 40)
    assert len(heavy) == MAX_TOKENS // 80


def test_an_answer_past_a_loop_forbids_the_loop_then_the_instructions_then_what_it_kept() -> None:
    kept = "The license allows copying and selling it. It asks for the notice."
    shown = kept + " It asks for the notice. It asks for the notice."
    instructions = ("write one summary", "in a few paragraphs")
    taken = past_a_loop(shown, kept, instructions, words)
    loop = list(dict.fromkeys(phrase for phrase, _ in phrases_of(shown[len(kept) :])))
    assert list(taken[: len(loop)]) == loop and taken[len(loop) : len(loop) + 2] == instructions
    assert set(taken) >= {phrase for phrase, _ in phrases_of(kept)}, "then every phrase it kept"
    assert len(taken) == len(set(taken)), "each phrase once"
    long_kept = " ".join(f"word{i}" for i in range(400))
    bounded = past_a_loop(long_kept + " again and again and again", long_kept, instructions, words)
    assert bounded[:3] == ("again and again and", "and again and again", *instructions[:1])
    assert bounded[4] == "word396 word397 word398 word399", "what it kept, newest first"
    assert len(bounded) * 2 <= MAX_SEQUENCES, "within vLLM's bounds"


def test_a_rewrite_replaces_the_answer_so_far() -> None:
    answer = functools.reduce(followed_by, ["one ", "two ", "two ", Rewrite("one two "), "three"], "")
    assert answer == "one two three"


@pytest.mark.parametrize("language", LANGUAGES)
def test_every_language_forbids_something_at_every_step_without_duplicates(language: str) -> None:
    for step, forbidden in every_step(StepGuards(SummaryPrompts(language), LICENSE, words)).items():
        assert forbidden and len(set(forbidden)) == len(forbidden), step


def test_what_is_forbidden_covers_what_the_echo_measure_counts() -> None:
    prompts = SummaryPrompts("en")
    copied = f"{REDUCE} {wording('en').map_part} {SYSTEM}"
    assert echo_of(copied, instruction_texts(prompts, SYSTEM), LICENSE).echoed > ECHO_THRESHOLD
    steps = every_step(StepGuards(prompts, LICENSE, words))
    assert all(any(phrase in copied for phrase in steps[step]) for step in ("reduce", "map part"))


def test_vllm_takes_every_step_s_phrases_with_the_default_model_s_tokenizer(default_model_dir: Path) -> None:
    """Counted with the model's tokenizer, each step stays within what vLLM accepts, and vLLM
    forbids the instruction's opening words at the start of the answer and within it."""
    from vllm import SamplingParams
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(default_model_dir))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    for language in LANGUAGES:
        for step, forbidden in every_step(StepGuards(SummaryPrompts(language), LICENSE, count)).items():
            params = SamplingParams(bad_words=list(forbidden))
            params.update_from_tokenizer(tokenizer)
            sequences = params.bad_words_token_ids or []
            assert 0 < len(sequences) <= MAX_SEQUENCES, (language, step)
            assert sum(map(len, sequences)) <= MAX_TOKENS, (language, step)
    params = SamplingParams(bad_words=list(StepGuards(SummaryPrompts("en"), LICENSE, count).reduce(SYSTEM)))
    params.update_from_tokenizer(tokenizer)
    for opening in ("The user sends notes", " the user sends notes"):
        assert tokenizer.encode(opening, add_special_tokens=False) in params.bad_words_token_ids
