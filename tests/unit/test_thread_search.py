"""What the sidebar's search sends to FTS5 and to PostgreSQL's to_tsquery: only words, never syntax; and
the words of the message a result was found by, shown with it."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.history.search_snippets import SNIPPET_CHARS, named_with_snippet, snippet, with_snippets
from services.history.thread_search import (
    MIN_PREFIX_CHARS,
    fts5_query,
    owner_token,
    search_words,
    tsquery,
    tsquery_literal,
)

USER = "3f2b6a0e-1c4d-4e5f-8a9b-0c1d2e3f4a5b"
# A word in FTS5's query: a quoted string of letters and digits, the last one maybe a prefix.
FTS5_SHAPE = re.compile(r'owner : "[0-9A-F]+" AND body : \("[^\W_]+"( AND "[^\W_]+")*\*?\)')
TSQUERY_SHAPE = re.compile(r"[^\W_]+( & [^\W_]+)*(:\*)?")


def test_words_are_letters_and_digits_lowercased_once_each_in_order() -> None:
    assert search_words('Lisbon "pastel" NEAR(tax*) body:Lisbon', 200) == [
        "lisbon",
        "pastel",
        "near",
        "tax",
        "body",
    ]
    assert search_words("don't 3.14 e-mail", 200) == ["don", "t", "3", "14", "e", "mail"]
    assert search_words("Zürich 日本語 ÉCOLE", 200) == ["zürich", "日本語", "école"]
    assert search_words("!!! ... ( ) * : ^ \"'", 200) == []
    assert search_words("abc" * 100, 10) == ["abcabcabca"], "cut to the limit first"


def test_the_last_word_is_a_prefix_from_two_letters() -> None:
    assert fts5_query(["lisbon", "ba"], USER).endswith('("lisbon" AND "ba"*)')
    assert fts5_query(["lisbon", "b"], USER).endswith('("lisbon" AND "b")')
    assert tsquery(["lisbon", "ba"]) == "lisbon & ba:*" and tsquery(["b"]) == "b"
    assert owner_token(USER) == USER.encode().hex().upper()


@given(st.text(min_size=1, max_size=300))
def test_any_text_becomes_words_only(text: str) -> None:
    words = search_words(text, 200)
    if not words:
        return
    assert FTS5_SHAPE.fullmatch(fts5_query(words, USER)), fts5_query(words, USER)
    assert TSQUERY_SHAPE.fullmatch(tsquery(words)), tsquery(words)
    assert tsquery_literal(words) == f"'{tsquery(words)}'", "no quote inside the SQL literal"


TRIP = (
    ("Plans for the trip, day by day. " * 3)
    + "Remind me to photograph a quetzal there, near the old town, when the light is good in the "
    "morning and the birds are out."
)


def test_a_result_found_by_a_message_shows_its_words_around_the_match() -> None:
    said = snippet(TRIP, ["quetzal"], MIN_PREFIX_CHARS)
    assert (
        said == "…Remind me to photograph a quetzal there, near the old town, when the light is good in the…"
    )
    assert len(said) <= SNIPPET_CHARS + 2 and "quetzal" in said
    assert (
        snippet("Try the pastel at the bakery.", ["bakery"], MIN_PREFIX_CHARS)
        == "Try the pastel at the bakery."
    )


def test_words_are_found_as_the_index_finds_them() -> None:
    """Case and accents folded, the last word also a prefix (from two letters), white space single."""
    text = "Notes\n\n" + "filler " * 30 + "Un café   à Zürich\tce matin. " + "more " * 30
    assert "Un café à Zürich ce matin." in snippet(text, ["zurich"], MIN_PREFIX_CHARS)
    assert "Zürich" in snippet(text, ["ZÜR"], MIN_PREFIX_CHARS), "a prefix"
    assert snippet(text, ["z"], MIN_PREFIX_CHARS).startswith("Notes filler"), "one letter is no prefix"
    assert snippet("x" * 300, ["y"], MIN_PREFIX_CHARS) == "x" * SNIPPET_CHARS + "…", "one long word is cut"


def test_only_a_result_found_by_a_message_is_named_with_its_words() -> None:
    rows = [
        {"id": "a", "name": "Trip", "best": "m1"},
        {"id": "b", "name": "Quetzal notes", "best": None},  # found by its name
        {"id": "c", "name": None, "best": "m2"},
    ]
    messages = {"m1": "a quetzal there", "m2": "the quetzal"}
    named = with_snippets(rows, messages, ["quetzal"], MIN_PREFIX_CHARS)
    assert [row["name"] for row in named] == ["Trip — a quetzal there", "Quetzal notes", "the quetzal"]
    assert named_with_snippet("Trip", "   ", ["quetzal"], MIN_PREFIX_CHARS) == "Trip"


def test_a_name_that_holds_the_whole_search_is_shown_alone() -> None:
    """Chainlit names a conversation after its first message: "Notes — Notes" says nothing more."""
    found_by = "My own quetzal notes, and more about quetzals"
    assert (
        named_with_snippet("My own quetzal notes", found_by, ["quetz"], MIN_PREFIX_CHARS)
        == "My own quetzal notes"
    )
    assert named_with_snippet("Trip", found_by, ["quetzal", "notes"], MIN_PREFIX_CHARS).startswith(
        "Trip — My own"
    )
    assert named_with_snippet("Quetzal", found_by, ["quetzal", "notes"], MIN_PREFIX_CHARS) != "Quetzal", (
        "not every word"
    )
