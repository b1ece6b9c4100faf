"""The loop guard's detector on crafted token streams: loops fire, lists and tables do not.

How the two are told apart: a loop re-emits the same unit of tokens exactly,
again and again; a list or a table repeats its markup (bullets, numbers, pipes,
separator rows) but every item or row brings new content, and each token that
differs from the token one period back restarts the count. The detector fires
only when one unit has been repeated exactly `min_repeats` times over at least
`min_tokens` tokens. These tests use a word-level tokenizer; tests/system/engine/test_answer_quality.py
runs the same texts (tests/loop_texts.py) through the model's real tokenizer.
"""

from __future__ import annotations

import re

import pytest

from bench.documents.quality_metrics import distinct_ngram_ratio
from services.engine.errors import EchoError, RepetitionError
from services.engine.loop_guard import EchoDetector, LoopGuardConfig, RepetitionDetector, repeats_in
from tests.loop_texts import LEGITIMATE, LOOPS, SENTENCE, TABLE

CONFIG = LoopGuardConfig()
_TOKEN = re.compile(r"\w+|\s+|([^\w\s])\1{0,15}")  # like BPE: runs of one mark in pieces of <= 16


class WordTokenizer:
    """Words, runs of whitespace and single punctuation marks as tokens, with stable ids."""

    def __init__(self) -> None:
        self.vocabulary: dict[str, int] = {}
        self.pieces: list[str] = []

    def encode(self, text: str) -> list[int]:
        ids = []
        for piece in (match.group() for match in _TOKEN.finditer(text)):
            if piece not in self.vocabulary:
                self.vocabulary[piece] = len(self.pieces)
                self.pieces.append(piece)
            ids.append(self.vocabulary[piece])
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def stream(
    tokenizer: WordTokenizer, text: str, config: LoopGuardConfig = CONFIG, *, echoes: bool = False
) -> RepetitionError | None:
    """Feed `text` in deltas of 3 tokens with their text, as ChatEngine.generate does; the error if any.

    `echoes` is what a summary's request gets (prose=True): the echo guard too.
    """
    detector = RepetitionDetector(config, tokenizer.decode, echoes=echoes)
    ids = tokenizer.encode(text)
    try:
        for start in range(0, len(ids), 3):
            piece = ids[start : start + 3]
            detector.feed(piece, tokenizer.decode(piece))
    except RepetitionError as error:
        assert detector.fired
        return error
    assert not detector.fired
    return None


@pytest.mark.parametrize("name", LOOPS)
def test_a_loop_fires_and_keeps_the_text_before_the_repetition(name: str) -> None:
    tokenizer = WordTokenizer()
    text = LOOPS[name]
    error = stream(tokenizer, text)
    assert error is not None, f"{name}: the loop was not caught"
    assert error.repeated_tokens >= CONFIG.min_tokens
    assert error.repeated_tokens >= (CONFIG.min_repeats - 1) * error.period_tokens
    assert text.startswith(error.kept_text)
    # the kept text holds the opening and at most one copy of the unit, plus less than a unit
    assert len(tokenizer.encode(error.kept_text)) < len(tokenizer.encode(text)) - error.repeated_tokens + 1


def test_it_fires_as_soon_as_the_thresholds_are_reached() -> None:
    tokenizer = WordTokenizer()
    unit = tokenizer.encode(SENTENCE)  # 25 tokens
    detector = RepetitionDetector(CONFIG, tokenizer.decode)
    detector.feed(unit * 2)  # two copies: 25 repeated tokens, below both thresholds
    with pytest.raises(RepetitionError) as caught:
        detector.feed(unit * 2)
    assert caught.value.period_tokens == len(unit)
    assert caught.value.repeated_tokens == max(CONFIG.min_tokens, 2 * len(unit))
    assert caught.value.kept_text == SENTENCE


@pytest.mark.parametrize("name", LEGITIMATE)
def test_lists_and_tables_do_not_fire(name: str) -> None:
    assert stream(WordTokenizer(), LEGITIMATE[name]) is None


def test_prose_does_not_fire() -> None:
    prose = (
        "Debian is an operating system and a distribution of free software. It is maintained by "
        "volunteers. The package manager installs, upgrades and removes programs, and it resolves "
        "the dependencies between them. Security updates are published by a dedicated team. "
    )
    assert stream(WordTokenizer(), prose * 1) is None


def test_the_guard_can_be_switched_off() -> None:
    assert stream(WordTokenizer(), LOOPS["one word"], LoopGuardConfig(min_tokens=0)) is None


def test_repeats_in_reports_a_finished_answer() -> None:
    tokenizer = WordTokenizer()
    assert repeats_in(tokenizer.encode(LOOPS["one sentence over and over"]), CONFIG, tokenizer.decode)
    assert repeats_in(tokenizer.encode(TABLE), CONFIG, tokenizer.decode) is None


# --- the echo guard: loops in paraphrase, for summaries ----------------------------------------
# Real summaries of the default model from runs of bench/documents/summary_quality.py: each
# restates itself with a word or two changed, so no exact period exists.
PARAPHRASES = {
    "a sentence again with one word changed (Portuguese)": (
        "Ao verá a documentação, estou desenhados os nomes, comando e números importantes para cada "
        "secção.\n\nPara verá as conclusões, estou desenhados os pontos principais de cada secção.\n\n"
        "Para verá as conclusões, estou desenhidos os nomes, comando e números importantes para cada secção."
    ),
    "a run-on phrase with changing platforms": (
        "It covers commands to install packages using pip, command for installing package from "
        "virtualenv installed on Windows Server platform installed on Linux server platform installed "
        "on Windows Server platform installed on Linux server platform installed on Unix system"
    ),
    "the same sentence with other misspellings (German)": (
        'Diesen können die "jährlichen Abschnitts" und "jährlichen Schlussfolgerungen" aufrufen.\n\n'
        'Diesen können die "järlichen Abschnitts" und "järliche Schlussfolgerungen" aufruften.\n\n'
        'Diesen können die "järlichen Abschnitts" und der "järliich Schlussfolgerungen" zusammen.'
    ),
    "the summary written again after a rule": (
        "The document is a collection of information about the group adm and its usage. The user-group "
        "system is explained in detail, including its features and limitations.\n\n---\nThe document "
        "ends with a summary of the file and how it is used to manage files. The user-group system is "
        "explained in detail, including its features and limitations."
    ),
}


def echo_stream(
    text: str, config: LoopGuardConfig = CONFIG, *, echoes: bool = True
) -> RepetitionError | None:
    """`stream` with a summary's guard (echoes=True) unless told otherwise."""
    return stream(WordTokenizer(), text, config, echoes=echoes)


@pytest.mark.parametrize("name", PARAPHRASES)
def test_a_summary_that_restates_itself_is_stopped_before_the_restatement(name: str) -> None:
    text = PARAPHRASES[name]
    assert stream(WordTokenizer(), text) is None, "an exact-period loop: this case is for the echo guard"
    error = echo_stream(text)
    assert isinstance(error, EchoError), f"{name}: the paraphrase was not caught"
    assert error.kept_text and text.startswith(error.kept_text)
    assert distinct_ngram_ratio(error.kept_text) > distinct_ngram_ratio(text)


@pytest.mark.parametrize("name", LEGITIMATE)
def test_lists_tables_and_code_do_not_trip_the_echo_guard(name: str) -> None:
    assert echo_stream(LEGITIMATE[name]) is None


def test_chat_answers_get_only_the_exact_guard() -> None:
    """A templated list is a fine chat answer, so chat turns (echoes=False) let it through."""
    templated = "".join(
        f"- Test case {n}: verify that the login page shows an error when the password is wrong for "
        f"user {name}.\n"
        for n, name in enumerate(("ana", "bo", "cy", "dee", "ed"))
    )
    assert echo_stream(templated, echoes=False) is None
    assert isinstance(echo_stream(templated), EchoError)  # in a summary, it counts as a loop
    assert echo_stream(PARAPHRASES["a run-on phrase with changing platforms"], echoes=False) is None


@pytest.mark.parametrize("name", PARAPHRASES)
def test_the_echo_guard_reads_the_text_however_it_is_split(name: str) -> None:
    text = PARAPHRASES[name]
    kept = set()
    for size in (1, 3, 7, 50):
        detector = EchoDetector(CONFIG.echo_window, CONFIG.echo_share, CONFIG.echo_sentence_share)
        with pytest.raises(EchoError) as caught:
            for start in range(0, len(text), size):
                detector.feed(text[start : start + size])
        kept.add(caught.value.kept_text)
    assert len(kept) == 1


def test_a_summary_that_comes_back_to_its_subject_is_not_an_echo() -> None:
    summary = (
        "The guide explains how Debian assigns user and group ids to system accounts. It lists the "
        "accounts the base system creates, such as root, daemon and bin, and what each is for. The "
        "groups follow, from adm, which may read the logs, to staff and users. It ends with advice "
        "for package maintainers: a package that needs its own account should create it with "
        "adduser when it is installed, and the guide explains why ids of system accounts stay fixed."
    )
    assert echo_stream(summary) is None


def test_the_echo_guard_skips_code_blocks_and_can_be_switched_off() -> None:
    loop = PARAPHRASES["a run-on phrase with changing platforms"]
    assert echo_stream(f"Here is the log:\n```\n{loop}\n```\nThat is all.\n") is None
    assert echo_stream(loop, LoopGuardConfig(echo_window=0)) is None
