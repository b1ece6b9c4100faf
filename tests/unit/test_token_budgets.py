"""Token budgets and per-minute tokens hold per token, through the doors people use: /v1 requests
through the real gate, admission and ledger, answered by vLLM's request models over an engine that
writes every sequence to its limit (the worst case), and chat turns through admission's engine.

A request whose worst case (prompt + every sequence x its answer limit) does not fit what is left
runs with shorter answers or is refused (429 with Retry-After); requests of one person running at
once cannot each pass the same remainder. Prompts are counted here as the gate counts them (words),
so every bound below is exact. The fuzz test draws the number fields in every form JSON allows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from pydantic import ValidationError
from vllm.exceptions import VLLMClientError

from services.accounts.keys import KeyHolder
from services.admission.limits import user_key
from services.admission.refusals import QUOTA_DAY, Refused
from services.admission.service import Admission
from services.admission.waiting_line import CHAT, DOCUMENT
from services.api.checks import request_model
from services.api.gate import ApiGate, SharedAdmission
from services.api.metrics import ApiMetrics
from services.api.usage import prompt_parts
from services.config import Settings
from services.engine.chat_engine import SamplingSettings
from services.engine.load import EngineLoad
from services.usage import UsageLedger
from tests.fakes import FakeClock, MemoryUsageStore, WordEngine

CHAT_PATH, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
CONTEXT = 4096
NOW = datetime(2026, 12, 10, 12, 0, tzinfo=UTC)
HELLO = [{"role": "user", "content": "Say hello to me."}]


def words(text: str) -> int:
    return len(text.split())


class WorstCaseApi:
    """vLLM's layer as the gate sees it, over an engine that writes every sequence to its limit: the
    forwarded body read by vLLM's own request model, refused (400) where vLLM refuses it, and its
    tokens kept in `ran` as (prompt, answer)."""

    ready = True

    def __init__(self) -> None:
        self.ran: list[tuple[int, int]] = []

    async def app(self, scope: MutableMapping[str, Any], receive: Callable, send: Callable) -> None:
        request = json.loads((await receive())["body"])
        await asyncio.sleep(0.01)  # requests sent together run together
        tokens = worst_case(scope["path"], request)
        if tokens is None:
            error = {"message": "vLLM refuses it", "type": "BadRequestError", "param": None, "code": 400}
            await answer(send, 400, {"error": error})
            return
        self.ran.append(tokens)
        await asyncio.sleep(0.01)
        usage = {"prompt_tokens": tokens[0], "completion_tokens": tokens[1]}
        await answer(send, 200, {"choices": [], "usage": usage})


def worst_case(path: str, request: dict[str, Any]) -> tuple[int, int] | None:
    """(prompt, answer) tokens vLLM would run for `request` when every sequence writes its limit;
    None where vLLM refuses the request."""
    try:
        parsed = request_model(path).model_validate(request)
    except (ValidationError, VLLMClientError):  # pydantic's, and vLLM's own validators' refusals
        return None
    if path == CHAT_PATH:
        prompts = [sum(map(words, prompt_parts(request)[0]))]
        limit = parsed.max_completion_tokens
        limit = parsed.max_tokens if limit is None else limit
    elif parsed.prompt_embeds is not None or parsed.prompt is None:
        return None  # vLLM serves no prompt embeddings unless started for them
    else:
        prompt = parsed.prompt
        each = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else prompt
        prompts = [words(p) if isinstance(p, str) else len(p) for p in each]
        limit = 1 if parsed.echo and parsed.max_tokens == 0 else parsed.max_tokens
    choices = parsed.n or 1
    if choices < 1 or not prompts:
        return None
    answers = 0
    for prompt_tokens in prompts:
        tokens = CONTEXT - prompt_tokens if limit is None else limit
        if tokens < 1 or prompt_tokens + tokens > CONTEXT or (parsed.min_tokens or 0) > tokens:
            return None
        answers += choices * tokens
    return sum(prompts), answers


async def answer(send: Callable, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Keys:
    """Every key `key-<name>` belongs to <name>, of role user."""

    async def holder(self, key: str) -> KeyHolder:
        return KeyHolder(key.removeprefix("key-"), "user", key[:12])


class Service:
    """The gate, admission and ledger of one process, its engine the worst case; `ann` has spent
    `spent` of a day budget of `budget` tokens and received `recent` answer tokens this minute."""

    def __init__(self, settings: Settings, budget: int, spent: int = 0, recent: int = 0) -> None:
        self.settings = settings.replace(max_model_len=CONTEXT)
        store = MemoryUsageStore()
        store.day_budgets["ann"], store.spent["ann"] = budget, (spent, spent)
        self.ledger = UsageLedger(self.settings, store, clock=lambda: NOW, monotonic=FakeClock())
        self.admission = Admission(self.settings, EngineLoad(), max_running=64, accounting=self.ledger)
        self.admission.limits.record_tokens(self.admission.limits.usage(user_key("ann")), recent)
        self.api = WorstCaseApi()
        admitted = SharedAdmission(self.admission, words)
        self.gate = ApiGate(self.settings, self.api, ApiMetrics(CollectorRegistry()), Keys(), admitted)  # type: ignore[arg-type]

    async def post(self, *requests: tuple[str, Any]) -> list[httpx.Response]:
        """Send `requests` ((path, body)) as ann, all at once."""
        headers = {"Authorization": "Bearer key-ann"}
        transport = httpx.ASGITransport(app=self.gate)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
            # json.dumps writes NaN and Infinity as Python's parser reads them (httpx's json= refuses)
            sends = [http.post(path, content=json.dumps(body), headers=headers) for path, body in requests]
            return list(await asyncio.gather(*sends))

    def day_tokens(self) -> int:
        """Ann's tokens today, as the ledger counts them for her budget."""
        return self.ledger.running["ann"].day_tokens

    def minute_tokens(self) -> int:
        usage = self.admission.limits.usage(user_key("ann"))
        return usage.tokens_since(self.admission.limits.clock() - 60)


def settings(**changes: object) -> Settings:
    return Settings.from_env({}).replace(**changes)


def refusal_problems(response: httpx.Response) -> list[str]:
    """What is wrong with a refusal: a server error, not OpenAI's error shape, a 429 without Retry-After."""
    problems = [f"status {response.status_code}"] if response.status_code >= 500 else []
    try:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"] and "code" in error
    except (ValueError, KeyError, TypeError, AssertionError):
        problems.append(f"not OpenAI's error shape: {response.text[:200]}")
    if response.status_code == 429 and not response.headers.get("retry-after", "").isdigit():
        problems.append("a 429 without Retry-After")
    return problems


@pytest.mark.asyncio
async def test_a_request_with_fifty_tokens_left_uses_at_most_those() -> None:
    """The finding: with 50 tokens of the day's budget left, one chat request without max_tokens ran
    9,856 tokens. Now it runs with what is left after its prompt, and the next one is refused."""
    service = Service(settings(), budget=10_000, spent=9_950)
    (first,) = await service.post((CHAT_PATH, {"messages": HELLO}))
    assert first.status_code == 200, first.text
    assert service.api.ran == [(4, 46)], "the answer cut to the 46 tokens left after the prompt"
    assert service.day_tokens() == 10_000
    (second,) = await service.post((CHAT_PATH, {"messages": HELLO, "max_tokens": 1}))
    assert second.status_code == 429 and second.json()["error"]["code"] == QUOTA_DAY
    assert not refusal_problems(second) and service.day_tokens() == 10_000


@pytest.mark.asyncio
async def test_many_sequences_are_cut_to_the_minute_limit_together() -> None:
    """The finding: a 64 x 400-token request ran 25,600 tokens in a minute against
    USER_TOKENS_PER_MINUTE=4000. Every sequence counts: 64 sequences share the minute's 4,000."""
    service = Service(settings(api_max_choices=64, user_tokens_per_minute=4000), budget=0)
    body = {"prompt": [[1, 2, 3]] * 8, "n": "8", "max_tokens": 400}
    (response,) = await service.post((COMPLETIONS, body))
    assert response.status_code == 200, response.text
    assert service.api.ran == [(24, 64 * 62)], "4,000 // 64 = 62 tokens per sequence"
    assert service.minute_tokens() == 64 * 62 <= 4000


@pytest.mark.asyncio
async def test_too_little_left_for_the_shortest_answer_of_each_sequence_is_refused() -> None:
    service = Service(settings(api_max_choices=8), budget=1000, spent=950)  # MIN_CUT_ANSWER_TOKENS: 16
    (refused,) = await service.post((COMPLETIONS, {"prompt": [5, 6, 7], "n": 8, "max_tokens": 400}))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == QUOTA_DAY, refused.text
    assert "needs up to 131 tokens" in refused.json()["error"]["message"], "3 + 8 x 16"
    assert not refusal_problems(refused) and service.api.ran == []
    two = {"prompt": [5, 6, 7], "n": 2, "max_tokens": 400, "min_tokens": 300}
    (cut,) = await service.post((COMPLETIONS, two))
    assert cut.status_code == 200 and service.api.ran == [(3, 2 * 23)], "min_tokens lowered with the cut"
    assert service.day_tokens() == 999


@pytest.mark.asyncio
async def test_requests_sent_at_once_cannot_each_pass_the_same_remainder() -> None:
    service = Service(settings(user_max_concurrent_turns=0), budget=1000, spent=700)
    body = {"prompt": "one two three four", "max_tokens": 200}
    responses = await service.post(*[(COMPLETIONS, body)] * 4)
    assert sorted(r.status_code for r in responses) == [200, 200, 429, 429], [r.text for r in responses]
    assert sorted(service.api.ran) == [(4, 92), (4, 200)], "the second gets what the first left"
    assert service.day_tokens() == 1000


@pytest.mark.asyncio
async def test_a_chat_turn_and_its_document_parts_stop_at_the_budget() -> None:
    """Chat holds the same promise: an answer is cut to what is left after its prompt, parts of a
    document running at once share the remainder, and what cannot fit the shortest answer is refused."""
    service = Service(settings(), budget=1000, spent=940)
    engine = WordEngine(max_model_len=4096)
    sampling = SamplingSettings(temperature=0.7, top_p=0.9, max_new_tokens=512)
    chat = service.admission.engine(engine, CHAT)  # type: ignore[arg-type]
    parts = service.admission.engine(engine, DOCUMENT)  # type: ignore[arg-type]

    async def run(admitted: Any, text: str, asked: SamplingSettings = sampling) -> str:
        messages = [{"role": "user", "content": text}]
        return "".join([delta async for delta in admitted.generate(messages, asked, "r")])

    async with service.admission.turn(user_key("ann")):
        assert words(await run(chat, "one two three")) == 56, "60 left, a prompt of 3 words + 1 (template)"
    assert [s.max_new_tokens for s in engine.samplings] == [56]
    service.ledger.used(user_key("ann"), 4, 56)  # what the engine reports at its end (engine_finished)
    service.ledger.running["ann"].day_tokens = 900  # a new remainder: 100
    part = SamplingSettings(temperature=0.7, top_p=0.9, max_new_tokens=60)
    async with service.admission.turn(user_key("ann")):
        three = [run(parts, "part of it", part) for _ in range(3)]
        done = await asyncio.gather(*three, return_exceptions=True)
    refusals = [r for r in done if isinstance(r, Refused)]
    assert sorted(words(r) for r in done if isinstance(r, str)) == [32, 60], "100 left: 4 + 60, then 4 + 32"
    assert len(refusals) == 1 and refusals[0].reason == QUOTA_DAY


# --- every number field in every form ------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-5, 5000),
    st.integers(2**31, 2**63 - 1),
    st.integers(2**63, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["8", "8.0", "1e3", "8_0", " 8 ", "-1", "", "NaN", "Infinity", "0x10", "٨"]),
    st.booleans(),
    st.none(),
    st.sampled_from([[8], {"n": 8}]),
)
TOKEN_IDS = st.lists(st.integers(0, 1000), max_size=20)
PROMPTS = st.one_of(
    st.text(max_size=60),
    TOKEN_IDS,
    st.lists(st.text(max_size=30), max_size=6),
    st.lists(TOKEN_IDS, max_size=6),
    st.lists(st.lists(TOKEN_IDS, max_size=2), max_size=2),
    st.lists(st.one_of(st.integers(0, 50), st.text(max_size=5)), max_size=4),
    NUMBERS,
)
SHARED_FIELDS = {
    "n": NUMBERS,
    "max_tokens": NUMBERS,
    "min_tokens": NUMBERS,
    "temperature": NUMBERS,
    "top_p": NUMBERS,
    "best_of": NUMBERS,
    "model": st.just("tiny-llama"),
}
MESSAGE = st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=40)})
CHAT_BODIES = st.fixed_dictionaries(
    {"messages": st.one_of(st.just(HELLO), st.lists(MESSAGE, min_size=1, max_size=3))},
    optional={
        **SHARED_FIELDS,
        "max_completion_tokens": NUMBERS,
        "logprobs": NUMBERS,
        "top_logprobs": NUMBERS,
    },
)
COMPLETION_BODIES = st.fixed_dictionaries(
    {"prompt": PROMPTS},
    optional={**SHARED_FIELDS, "logprobs": NUMBERS, "echo": st.booleans(), "use_beam_search": st.booleans()},
)
REQUESTS = st.lists(
    st.one_of(st.tuples(st.just(CHAT_PATH), CHAT_BODIES), st.tuples(st.just(COMPLETIONS), COMPLETION_BODIES)),
    min_size=1,
    max_size=3,
)


@given(
    requests=REQUESTS,
    budget=st.integers(0, 3000),
    spent=st.integers(0, 3000),
    per_minute=st.integers(0, 3000),
    recent=st.integers(0, 3000),
)
@example(requests=[(CHAT_PATH, {"messages": HELLO, "n": "8", "max_tokens": "1e3"})], budget=60, spent=0,
         per_minute=0, recent=0)  # fmt: skip
@example(requests=[(COMPLETIONS, {"prompt": [[1]] * 4, "n": 2.0, "max_tokens": 400})] * 2, budget=0, spent=0,
         per_minute=500, recent=100)  # fmt: skip
def test_no_request_passes_more_tokens_than_its_person_has_left(
    requests: list[tuple[str, dict]], budget: int, spent: int, per_minute: int, recent: int
) -> None:
    """Whatever numbers a request carries and however many are sent at once: no 500, every refusal in
    OpenAI's shape, and what ran stays within the day's budget and the minute's answer tokens."""
    service = Service(
        settings(api_max_choices=8, user_max_concurrent_turns=0, user_tokens_per_minute=per_minute),
        budget,
        spent,
        recent,
    )
    responses = asyncio.run(service.post(*requests))
    for (path, body), response in zip(requests, responses, strict=True):
        if response.status_code != 200:
            assert not refusal_problems(response), (path, body, response.text)
    prompts = sum(prompt for prompt, _ in service.api.ran)
    answers = sum(answer for _, answer in service.api.ran)
    if budget:
        assert spent + prompts + answers <= max(spent, budget), (requests, service.api.ran)
    if per_minute:
        assert recent + answers <= max(recent, per_minute), (requests, service.api.ran)
