"""The owner PostgreSQL's search index holds in each message's vector: no typed word can match it, and
its SQL literal can hold nothing but '@' and hex digits whatever the user id."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.history.thread_search import owner_lexeme, owner_literal, search_words, tsquery

LITERAL = re.compile(r"'''@[0-9a-f]*'''")


@given(st.text(max_size=80), st.text(min_size=1, max_size=200))
def test_no_search_reaches_the_owner_lexeme(user_id: str, typed: str) -> None:
    assert LITERAL.fullmatch(owner_literal(user_id)), "a quoted lexeme: nothing to escape"
    assert bytes.fromhex(owner_lexeme(user_id)[1:]).decode() == user_id, "one lexeme per user id"
    words = search_words(typed, 200)
    assert all("@" not in word for word in words), "a typed word never holds the owner's '@'"
    if words:
        assert "@" not in tsquery(words) and "'" not in tsquery(words)


def test_the_owner_lexeme_of_a_user_id() -> None:
    assert owner_lexeme("ab-1") == "@" + b"ab-1".hex()
    assert owner_literal("x'y") == "'''@" + b"x'y".hex() + "'''"
    assert search_words("@" + b"ab".hex(), 200) == ["6162"], "typed: '@' is a separator"
