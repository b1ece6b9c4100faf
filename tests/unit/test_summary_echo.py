"""The instruction-echo measure: a summary's word n-grams that come from its prompts, not its document.

Pure logic: strings in, counts out; the instructions are taken from the prompts the summarizer sends.
"""

from __future__ import annotations

import pytest

from services.documents.echo import ECHO_THRESHOLD, echo_of, instruction_texts, ngrams, words_of
from services.documents.prompts import WORDINGS, SummaryPrompts

SYSTEM = "You are a helpful, concise assistant."
INSTRUCTIONS = ["Summarize this part in one short paragraph: keep its key facts, names and numbers."]


def test_words_are_lower_cased_without_punctuation_and_numbers_are_one_token() -> None:
    assert words_of("Part 3 of 12: Keep its KEY facts, v2.0!") == [
        "part",
        "#",
        "of",
        "#",
        "keep",
        "its",
        "key",
        "facts",
        "#",
        "#",
    ]


def test_ngrams_of_a_short_text_are_none() -> None:
    assert ngrams("one two three") == []
    assert ngrams("one two three four five") == [
        ("one", "two", "three", "four"),
        ("two", "three", "four", "five"),
    ]


def test_echoed_instruction_ngrams_are_counted_and_reported_as_phrases() -> None:
    summary = "The text says to keep its key facts, names and numbers. Licences grant rights."
    echo = echo_of(summary, INSTRUCTIONS, "Licences grant rights to use the work.")
    # 14 words, 11 4-grams; echoed: "keep its key facts" .. "key facts names and" .. "facts names and numbers"
    assert (echo.echoed, echo.total) == (4, 11)
    assert echo.score == pytest.approx(4 / 11)
    assert echo.phrases == ("keep its key facts names and numbers",)


def test_ngrams_the_document_also_holds_are_not_echo() -> None:
    summary = "Keep its key facts, names and numbers."
    document = "Rule 4: keep its key facts, names and numbers in the ledger."
    echo = echo_of(summary, INSTRUCTIONS, document)
    assert (echo.echoed, echo.score, echo.phrases) == (0, 0.0, ())


def test_part_numbers_match_whatever_the_numbers_are() -> None:
    echo = echo_of("This is part 7 of 9 of it.", ["This is part 1 of 2 of a longer document."], "")
    assert echo.phrases == ("this is part # of # of",)


def test_empty_inputs_give_no_echo() -> None:
    assert echo_of("", INSTRUCTIONS, "document").score == 0.0
    assert echo_of("a summary that is long enough", [], "").echoed == 0
    assert echo_of("a summary that is long enough", [""], "").echoed == 0
    echo = echo_of("keep its key facts, names and numbers", INSTRUCTIONS, "")
    assert echo.echoed == echo.total == 4


def test_an_honest_summary_is_below_the_threshold_and_an_echo_above() -> None:
    texts = instruction_texts(SummaryPrompts("en"), SYSTEM)
    document = (
        "Apache License 2.0. Grants a copyright licence and a patent licence; contributors give no warranty."
    )
    honest = "The Apache License 2.0 grants a copyright and a patent licence. Contributors give no warranty."
    assert not echo_of(honest, texts, document).repeats_instructions
    for language, wording in WORDINGS.items():  # the instructions, copied, are an echo in every language
        echo = echo_of(f"{wording.summarize} {wording.reduce}", texts_of(language), document)
        assert echo.echoed > ECHO_THRESHOLD and echo.repeats_instructions, language


def texts_of(language: str) -> list[str]:
    return instruction_texts(SummaryPrompts(language), SYSTEM)


def test_instruction_texts_are_every_step_s_words_without_the_document() -> None:
    texts = " ".join(instruction_texts(SummaryPrompts("en"), SYSTEM))
    words = WORDINGS["en"]
    for text in (SYSTEM, words.summarize, words.reduce):
        assert text in texts
    assert words.map_part.format(n=1, total=2) in texts
    assert "\x00" not in texts, "the marks that stood for the document are cut out"


def test_a_request_of_the_user_s_is_part_of_the_instructions() -> None:
    texts = " ".join(instruction_texts(SummaryPrompts("en", "List the licence's conditions."), SYSTEM))
    assert "List the licence's conditions." in texts
