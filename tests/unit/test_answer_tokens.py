"""Recent answers' generated ids, spliced back into the prompts that quote them (pure logic)."""

from __future__ import annotations

from harness.waiting import until_sync
from services.engine.answer_tokens import ENTRY_OVERHEAD_IDS, AnswerTokens

# A toy vocabulary: the "tokenizer" spells "hello" as [1]; the engine wrote it as [2, 3] ("hel" "lo").
PIECES = {1: "hello", 2: "hel", 3: "lo", 4: " world", 5: "<s>", 6: "</s>", 7: "Q", 8: "\n---"}


def decode(ids: list[int]) -> str:
    return "".join(PIECES[i] for i in ids)


def encode(text: str) -> list[int]:
    return {"hello world": [1, 4], "hello": [1]}[text]


MESSAGES = [
    {"role": "user", "content": "Q"},
    {"role": "assistant", "content": "hello world"},
    {"role": "user", "content": "Q"},
]
PROMPT = [5, 7, 6, 5, 1, 4, 6, 5, 7, 6]  # <s>Q</s> <s>hello world</s> <s>Q</s>


def test_a_quoted_answer_comes_back_in_the_generated_ids() -> None:
    cache = AnswerTokens(max_tokens=1000, ttl_seconds=60)
    assert cache.remember("hello world", [2, 3, 4, 6], decode)  # the end-of-turn token is dropped
    assert cache.ids_for("hello world") == [2, 3, 4]
    assert cache.splice(MESSAGES, PROMPT, encode) == [5, 7, 6, 5, 2, 3, 4, 6, 5, 7, 6]


def test_ids_of_a_stop_string_are_dropped_and_ids_that_do_not_spell_the_text_are_not_kept() -> None:
    cache = AnswerTokens(max_tokens=1000, ttl_seconds=60)
    assert cache.remember("hello", [2, 3, 8], decode)  # vLLM's text leaves out the stop string
    assert cache.ids_for("hello") == [2, 3]
    assert not cache.remember("hello world", [1], decode)
    assert cache.ids_for("hello world") is None


def test_prompts_without_a_known_answer_are_unchanged() -> None:
    cache = AnswerTokens(max_tokens=1000, ttl_seconds=60)
    assert cache.splice(MESSAGES, PROMPT, encode) is PROMPT
    cache.remember("hello", [2, 3], decode)
    changed_template = [{"role": "assistant", "content": "hello"}]
    assert cache.splice(changed_template, [5, 4, 6], encode) == [5, 4, 6]  # not found: left alone


def test_the_cache_is_bounded_in_tokens_with_each_entry_s_overhead_and_in_time() -> None:
    cache = AnswerTokens(max_tokens=2 * ENTRY_OVERHEAD_IDS + 4, ttl_seconds=60)
    cache.remember("hello world", [2, 3, 4], decode)
    cache.remember("hello", [2, 3], decode)  # 3 + 2 ids and two overheads > the bound: the older goes
    assert cache.ids_for("hello world") is None and cache.ids_for("hello") == [2, 3]
    small = AnswerTokens(max_tokens=ENTRY_OVERHEAD_IDS + 2, ttl_seconds=60)
    assert not small.remember("hello world", [2, 3, 4], decode)  # larger than the whole cache
    brief = AnswerTokens(max_tokens=1000, ttl_seconds=0.05)  # it takes no clock: 50 ms of real time
    brief.remember("hello", [2, 3], decode)
    until_sync(lambda: brief.ids_for("hello") is None, "the entry goes after its ttl")


def test_many_short_answers_stay_within_the_bound() -> None:
    cache = AnswerTokens(max_tokens=10 * (ENTRY_OVERHEAD_IDS + 1), ttl_seconds=60)
    pieces = {100 + n: f"w{n}" for n in range(1000)}
    for n in range(1000):
        assert cache.remember(f"w{n}", [100 + n], lambda ids: "".join(pieces[i] for i in ids))
    assert len(cache) == 10
