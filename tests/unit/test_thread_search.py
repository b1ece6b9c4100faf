"""What the sidebar's search sends to FTS5 and to PostgreSQL's to_tsquery: only words, never syntax."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.history.thread_search import fts5_query, owner_token, search_words, tsquery, tsquery_literal

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
