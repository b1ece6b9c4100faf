"""The loop guard, planning and the prefix cache on the real vLLM engine (tiny model, in process).

- A crafted repeating stream (the engine may only emit one token) is stopped by the
  loop guard, and its engine request is aborted inside vLLM.
- The model's real tokenizer: the loops of test_loop_guard.py fire, its lists and tables do not
  (not even under the summaries' echo guard).
- A follow-up quotes the previous answer in the ids the engine wrote, so the prefix cache serves it.
- A follow-up on a document summarized in one pass raises vLLM's prefix_cache_hits
  counter by at least the document's token count.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import deque
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import services.engine.chat_engine as chat_engine_module
from harness.documents import long_document
from harness.waiting import WAIT_SECONDS
from services.chat.service import ChatService
from services.chat.session import ChatSession
from services.documents.echo import ngrams
from services.documents.echo_guard import phrases_of
from services.documents.summarizer import Summarizer
from services.engine.chat_engine import ChatEngine, SamplingSettings
from services.engine.errors import REPETITION_STOPPED, RepetitionError, report_failure
from services.engine.loop_guard import LoopGuardConfig, RepetitionDetector
from services.engine.rewrite import Rewrite
from services.engine.stream_stats import StreamStats
from tests.conftest import tiny_settings
from tests.loop_texts import LEGITIMATE, LOOPS

# The engine is the session's in-process runtime's (conftest.py), on the session's event loop.
pytestmark = pytest.mark.asyncio(loop_scope="session")

QUESTION = [{"role": "user", "content": "Tell me a long story."}]
LONG = SamplingSettings(temperature=0.0, top_p=1.0, max_new_tokens=2000)


@pytest.fixture
def finished(engine: ChatEngine):
    seen: list[StreamStats] = []
    unregister = engine.on_finish(seen.append)
    yield seen
    unregister()


@pytest.fixture
def one_token_only(engine: ChatEngine, monkeypatch: pytest.MonkeyPatch) -> int:
    """Every request may emit only the token " and": the engine streams "and and and ..."."""
    token = engine.tokenizer.encode(" and", add_special_tokens=False)[0]
    original = chat_engine_module._sampling_params

    def looping(sampling: SamplingSettings, max_tokens: int, *stop):
        params = original(sampling, max_tokens, *stop)
        params.allowed_token_ids = [token]
        return params

    monkeypatch.setattr(chat_engine_module, "_sampling_params", looping)
    return token


def counter(name: str, **labels: str) -> float:
    """The value of a vLLM Prometheus counter in this process, summed over the other labels."""
    return sum(
        sample.value
        for metric in REGISTRY.collect()
        for sample in metric.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


async def gained(name: str, before: float, expected: float) -> float:
    """How far counter `name` rose from `before`, once it rose by `expected` or WAIT_SECONDS passed:
    vLLM's stat logger records a step after it hands out the step's outputs."""
    deadline = time.monotonic() + WAIT_SECONDS
    while counter(name) - before < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return counter(name) - before


async def test_a_repeating_stream_is_stopped_and_its_request_aborted(
    engine: ChatEngine, finished: list[StreamStats], one_token_only: int
) -> None:
    received: list[str] = []
    with pytest.raises(RepetitionError) as caught:
        async for delta in engine.generate(QUESTION, LONG, "loop-1"):
            received.append(delta)
    assert caught.value.period_tokens == 1
    assert caught.value.kept_text.strip() == "and"
    stats = finished[-1]
    assert stats.finish_reason == "repetition"
    assert stats.output_tokens < 2 * engine.loop_guard.min_tokens, "stopped early, not at the 2,000-token cap"
    # vLLM's output processor dropped the request at once (aborted, its KV freed in EngineCore);
    # a client-side abort is not counted in vLLM's request_success metrics.
    assert engine.unfinished_requests() == 0


async def test_a_chat_answer_that_loops_tells_the_user_and_keeps_no_repetition(
    engine: ChatEngine, one_token_only: int
) -> None:
    chat = ChatService(engine, tiny_settings(Path(".")))
    session = ChatSession("s-loop", LONG, "Be brief.", deque(maxlen=10))
    prompt = chat.build_prompt(session, "Tell me a long story.")
    with pytest.raises(RepetitionError) as caught:
        async for _ in chat.reply(session, prompt, "loop-chat"):
            pass
    assert report_failure(caught.value, "loop-chat") == REPETITION_STOPPED
    assert "started repeating itself and was stopped" in REPETITION_STOPPED
    assert session.history[-1] == {"role": "assistant", "content": caught.value.kept_text}
    assert engine.unfinished_requests() == 0


async def test_the_engine_serves_normally_after_a_loop(engine: ChatEngine) -> None:
    sampling = SamplingSettings(1.0, 1.0, 16, repetition_penalty=1.1, frequency_penalty=0.3)
    assert "".join([d async for d in engine.generate(QUESTION, sampling, "after-loop")])
    assert engine.unfinished_requests() == 0


@pytest.mark.parametrize("name", LOOPS)
async def test_loops_fire_with_the_real_tokenizer(engine: ChatEngine, name: str) -> None:
    detector = RepetitionDetector(LoopGuardConfig(), engine.tokenizer.decode)
    with pytest.raises(RepetitionError):
        detector.feed(engine.tokenizer.encode(LOOPS[name], add_special_tokens=False))


@pytest.mark.parametrize("name", LEGITIMATE)
async def test_lists_and_tables_do_not_fire_with_the_real_tokenizer(engine: ChatEngine, name: str) -> None:
    detector = RepetitionDetector(
        LoopGuardConfig(), engine.tokenizer.decode, echoes=True
    )  # a summary's guard
    detector.feed(engine.tokenizer.encode(LEGITIMATE[name], add_special_tokens=False))
    assert not detector.fired


async def test_a_follow_up_reuses_the_whole_document_from_the_prefix_cache(
    engine: ChatEngine, tiny_model_dir: Path
) -> None:
    chat = ChatService(engine, tiny_settings(tiny_model_dir, summary_max_tokens=24))
    session = ChatSession("s-cache", SamplingSettings(0.7, 0.9, 24), "Be brief.", deque(maxlen=20))
    folder = Path(tempfile.mkdtemp())
    (folder / "report.txt").write_text(long_document(1200, seed=1313))  # unique: nothing cached yet
    result = await chat.attach_files(session, [(str(folder / "report.txt"), "report.txt")])
    folder.rmdir()
    document = result.document
    assert document is not None and document.plan is not None and document.plan.whole
    assert document.tokens > 1000
    assert "".join([d async for d in chat.summarize(session, "", "cache-summary")])
    hits_before = counter("vllm:prefix_cache_hits_total")
    prompt = chat.build_prompt(session, "Which figures does the report mention?")
    assert prompt.messages[0]["content"].endswith("</document>"), "the whole document, first"
    assert "".join([d async for d in chat.reply(session, prompt, "cache-follow-up")])
    reused = await gained("vllm:prefix_cache_hits_total", hits_before, document.tokens)
    assert reused >= document.tokens, f"the follow-up reused {reused:.0f} cached tokens of {document.tokens}"


async def test_a_follow_up_reuses_the_previous_answer_in_the_ids_the_engine_wrote(
    engine: ChatEngine, tiny_model_dir: Path
) -> None:
    """The tiny model writes tokens the tokenizer would not pick for the same text (so does the
    default model under a frequency penalty); re-encoded, the answer would miss the prefix cache
    from the first such token on. The follow-up's prompt carries the generated ids instead."""
    chat = ChatService(engine, tiny_settings(tiny_model_dir))
    for attempt in range(5):
        session = ChatSession(
            f"s-ids-{attempt}", SamplingSettings(1.0, 1.0, 48), "Be brief.", deque(maxlen=20)
        )
        first = chat.build_prompt(session, f"Tell me about ledger {attempt} of the archive.")
        first_ids = engine.encode_chat(first.messages)
        answer = "".join([d async for d in chat.reply(session, first, f"ids-{attempt}")])
        generated = engine.answer_tokens.ids_for(answer)
        assert generated, "the answer's ids were kept"
        re_encoded = engine.tokenizer.encode(answer, add_special_tokens=False)
        if re_encoded != generated:
            break
    else:
        pytest.skip("five answers in a row were spelled the tokenizer's way")
    same = next(
        (i for i, (a, b) in enumerate(zip(re_encoded, generated, strict=False)) if a != b), len(generated)
    )
    hits_before = counter("vllm:prefix_cache_hits_total")
    follow_up = chat.build_prompt(session, "And what else?")
    follow_up_ids = engine.encode_chat(follow_up.messages)
    assert follow_up_ids[: len(first_ids) + len(generated)] == first_ids + generated
    assert "".join([d async for d in chat.reply(session, follow_up, f"ids-{attempt}-next")])
    block = engine.backend.vllm_config.cache_config.block_size
    expected = len(first_ids) + len(generated) - block
    reused = await gained("vllm:prefix_cache_hits_total", hits_before, expected)
    assert reused >= expected, (
        f"the follow-up reused {reused:.0f} cached tokens; re-encoding would have kept "
        f"{len(first_ids) + same} at most"
    )


@pytest.fixture
def eager_to_end(engine: ChatEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every request wants to end at once (its end-of-text token is favoured by +100)."""
    eos = engine.tokenizer.eos_token_id
    original = chat_engine_module._sampling_params

    def ending(sampling: SamplingSettings, max_tokens: int, *stop):
        params = original(sampling, max_tokens, *stop)
        params.logit_bias = {eos: 100.0}
        return params

    monkeypatch.setattr(chat_engine_module, "_sampling_params", ending)
    monkeypatch.setattr(engine, "loop_guard", LoopGuardConfig(min_tokens=0))  # the tiny model loops


async def test_a_summary_is_never_shorter_than_its_minimum_unless_the_user_asked(
    engine: ChatEngine, tiny_model_dir: Path, finished: list[StreamStats], eager_to_end: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(Summarizer, "min_summary_tokens", 20)
    chat = ChatService(engine, tiny_settings(tiny_model_dir, summary_max_tokens=64))
    session = ChatSession("s-min", SamplingSettings(1.0, 1.0, 64), "Be brief.", deque(maxlen=20))
    folder = Path(tempfile.mkdtemp())
    (folder / "notes.txt").write_text(long_document(400, seed=2718))
    result = await chat.attach_files(session, [(str(folder / "notes.txt"), "notes.txt")])
    folder.rmdir()
    assert result.document is not None and result.document.tokens >= 4 * 20
    [_ async for _ in chat.summarize(session, "", "min-summary")]
    assert finished[-1].output_tokens >= 20, "the summary may not end before its minimum"
    [_ async for _ in chat.summarize(session, "In one line, please.", "min-request")]
    assert finished[-1].output_tokens <= 1, "a request of the user's is not padded"
    assert engine.unfinished_requests() == 0


async def test_a_summary_that_loops_early_goes_on_without_the_loop(
    engine: ChatEngine, tiny_model_dir: Path, finished: list[StreamStats], monkeypatch: pytest.MonkeyPatch
) -> None:
    counting = engine.tokenizer.encode(" one two three four five six", add_special_tokens=False)
    original, calls = chat_engine_module._sampling_params, []

    def first_request_counts(sampling: SamplingSettings, max_tokens: int, *stop):
        params = original(sampling, max_tokens, *stop)
        calls.append(params)
        if len(calls) == 1:  # the summary's first request may only count to six: it loops
            params.allowed_token_ids = counting
        return params

    monkeypatch.setattr(chat_engine_module, "_sampling_params", first_request_counts)
    monkeypatch.setattr(Summarizer, "min_summary_tokens", 120)
    settings = tiny_settings(tiny_model_dir, summary_max_tokens=240)
    chat = ChatService(engine, settings)
    session = ChatSession("s-relooped", SamplingSettings(0.0, 1.0, 240), "Be brief.", deque(maxlen=20))
    folder = Path(tempfile.mkdtemp())
    (folder / "notes.txt").write_text(long_document(600, seed=4242))
    result = await chat.attach_files(session, [(str(folder / "notes.txt"), "notes.txt")])
    folder.rmdir()
    assert result.document is not None and result.document.plan is not None and result.document.plan.whole

    deltas: list[str] = []
    answer = None
    try:
        async for delta in chat.summarize(session, "", "relooped"):
            deltas.append(delta)
    except RepetitionError as error:  # the tiny model may loop again: then it ends there
        answer = error.kept_text
    rewrites = [i for i, delta in enumerate(deltas) if isinstance(delta, Rewrite)]
    assert len(rewrites) == 1, "cut back once (SUMMARY_LOOP_RECOVERIES=1)"
    kept, shown = str(deltas[rewrites[0]]), "".join(deltas[: rewrites[0]])
    assert shown.startswith(kept) and len(kept) < len(shown), "the loop was shown, then taken back"
    going_on = "".join(deltas[rewrites[0] + 1 :])
    answer = answer if answer is not None else kept + going_on
    assert answer.startswith(kept) and session.history[-1] == {"role": "assistant", "content": answer}
    said = {gram for _, gram in phrases_of(shown)}
    assert said, "the loop gave words to forbid"
    assert set(calls[1].bad_words) >= {phrase for phrase, _ in phrases_of(shown)}
    assert not said & set(ngrams(going_on)), "nothing shown before is said again, the loop least of all"
    requests = [stats.request_id for stats in finished]
    assert requests[-2:] == ["relooped-final", "relooped-final1"], requests
    assert finished[-2].finish_reason == "repetition"
    assert engine.unfinished_requests() == 0
