"""The OpenAI-compatible API on a real server (tiny model, SQLite), driven by the official `openai`
SDK and plain HTTP: keys, chat and completions (streamed and not), bad input, disconnects, metrics,
and chat over socket.io at the same time."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from services.config import Settings
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, TINY_OPS_TOKEN, server_env
from tests.system.conftest import accounts
from tests.system.helpers import HELLO, data_dir, metric

in_loop = pytest.mark.asyncio(loop_scope="module")
MODEL = "tiny-llama"  # the model folder's name (API_MODEL_NAME unset)
LIMITS = Settings.from_env({})  # the shared tiny server leaves the API's limits at their defaults


@pytest.fixture(scope="module")
def api_server(tiny_server: AppServer) -> AppServer:
    """The shared tiny server (tests/conftest.py): the API runs with the default limits."""
    return tiny_server


@pytest.fixture(scope="module")
def person(api_server: AppServer) -> str:
    """An account of this module's own on the shared server, so its limits are the module's alone."""
    name = f"api-{uuid.uuid4().hex[:8]}"
    accounts(data_dir(api_server), "add", name, "--generate")
    return name


@pytest.fixture(scope="module")
def key(api_server: AppServer, person: str) -> str:
    return accounts(data_dir(api_server), "key", "create", person).stdout.split()[0]


def client(server: AppServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=key, max_retries=0, timeout=60)


def test_models_list_names_the_served_model(api_server: AppServer, key: str) -> None:
    models = client(api_server, key).models.list()
    assert [model.id for model in models.data] == [MODEL]
    assert models.data[0].max_model_len == TINY_MAX_MODEL_LEN  # vLLM's own field
    assert models.data[0].model_dump()["root"] == MODEL, "vLLM's root is the model's folder on the server"


def test_chat_completion_answers_in_one_response(api_server: AppServer, key: str) -> None:
    answer = client(api_server, key).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert 0 < answer.usage.completion_tokens <= 8 and answer.usage.prompt_tokens > 0


def test_chat_completion_streams(api_server: AppServer, key: str) -> None:
    stream = client(api_server, key).chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 12


def test_completions_streamed_and_not(api_server: AppServer, key: str) -> None:
    api = client(api_server, key)
    whole = api.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6)
    assert whole.choices[0].text and whole.usage.completion_tokens <= 6
    parts = [c.choices[0].text for c in api.completions.create(model=MODEL, prompt="Hello", max_tokens=6,
                                                                 stream=True) if c.choices]  # fmt: skip
    assert "".join(parts)


def test_no_key_bad_key_and_revoked_key_get_401(api_server: AppServer, person: str) -> None:
    response = httpx.post(api_server.base_url + "/v1/chat/completions", json={"messages": HELLO})
    assert response.status_code == 401
    assert (
        response.json()["error"]["code"] == "missing_api_key"
        and "Bearer" in response.json()["error"]["message"]
    )
    with pytest.raises(openai.AuthenticationError) as refused:
        client(api_server, "sk-vc-not-a-key").chat.completions.create(model=MODEL, messages=HELLO)
    assert refused.value.status_code == 401 and refused.value.body["type"] == "authentication_error"
    doomed = accounts(data_dir(api_server), "key", "create", person).stdout.split()[0]
    assert client(api_server, doomed).models.list().data
    assert doomed[:12] in accounts(data_dir(api_server), "key", "list", person).stdout
    assert doomed not in accounts(data_dir(api_server), "key", "list", person).stdout  # prefixes only
    accounts(data_dir(api_server), "key", "revoke", doomed[:12])
    with pytest.raises(openai.AuthenticationError):
        client(api_server, doomed).models.list()


# One request the gate refuses off the real socket (413 before the body is read), one that only vLLM's
# serving state over the engine answers.
OVER_THE_LIMIT = LIMITS.api_max_body_bytes + 1
BAD_INPUT = [
    # (name, body, status, error code or None, words in the message)
    ("body over the limit", {"model": MODEL, "messages": [{"role": "user", "content": "x" * OVER_THE_LIMIT}]},
     413, "request_too_large", f"{LIMITS.api_max_body_bytes:,} bytes"),
    ("unknown model", {"model": "gpt-9", "messages": HELLO}, 404, None, "gpt-9"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "body", "status", "code", "words"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT]
)
def test_bad_input_gets_openai_errors(
    api_server: AppServer, key: str, name, body, status, code, words
) -> None:
    """Bad requests on the real server are answered in OpenAI's error shape, by the gate or by vLLM,
    and the service goes on answering. Every case (these two too) is a unit test:
    tests/unit/test_api_gate.py::test_bad_input_gets_openai_errors (the gate and vLLM's request
    validation) and ::test_vllm_refuses_an_unknown_model_and_max_tokens_past_the_context."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    response = httpx.post(api_server.base_url + "/v1/chat/completions", json=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}, error
    assert words in error["message"], error
    if code is not None:
        assert error["code"] == code
    assert client(api_server, key).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2).choices


def test_api_paths_come_before_the_chat_page(api_server: AppServer, key: str) -> None:
    """Chainlit serves its page for any unknown path (issue #1819): /v1 must never get it."""
    unknown = httpx.get(api_server.base_url + "/v1/engines", headers={"Authorization": f"Bearer {key}"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "unknown_url"
    page = httpx.get(api_server.base_url + "/")
    assert page.status_code == 200 and "<html" in page.text.lower()


@in_loop
async def test_disconnect_mid_stream_aborts_the_engine_request(api_server: AppServer, key: str) -> None:
    """Closing the stream aborts the engine request: it ends far short of the 2,000 tokens it asked for
    (vLLM's own count of generated tokens tells, not a clock), and the gate stops counting it."""
    api = openai.AsyncOpenAI(base_url=api_server.base_url + "/v1", api_key=key, max_retries=0)
    generated_before = await asyncio.to_thread(metric, api_server, "vllm:generation_tokens_total")
    stream = await api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2000, stream=True,
                                               temperature=1.0, extra_body={"ignore_eos": True})  # fmt: skip
    received = 0
    async for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received >= 3:
            break
    assert (await api_server.astatus())["engine_unfinished_requests"] == 1
    await stream.close()
    # Waits for the end, aborted or not: a request left running ends at 2,000 tokens (or times out).
    await api_server.poll(lambda s: s["engine_unfinished_requests"] == 0, timeout=120, interval=0.02)
    generated = await asyncio.to_thread(metric, api_server, "vllm:generation_tokens_total") - generated_before
    assert 3 <= generated < 1000, f"{generated:.0f} tokens generated: the request ran on after the close"
    # the gate saw the request end, and the engine goes on serving
    route = "/v1/chat/completions"
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(metric, api_server, "api_requests_in_flight", route=route) != 0:
        assert time.monotonic() < deadline, "the gate still counts the closed stream in flight"
        await asyncio.sleep(0.05)
    answer = await api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert answer.choices[0].message.content
    await api.close()


@in_loop
async def test_chat_and_api_are_served_together(api_server: AppServer, key: str) -> None:
    chat = ChatClient(api_server.base_url)
    await chat.connect()
    api = openai.AsyncOpenAI(base_url=api_server.base_url + "/v1", api_key=key, max_retries=0)
    try:
        chat_reply, *answers = await asyncio.gather(
            chat.ask("Hello there", timeout=60),
            *(
                api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=12)
                for _ in range(LIMITS.user_max_concurrent_turns)  # as many as one person may run
            ),
        )
        assert chat_reply.final and not chat_reply.final.startswith("⚠️")
        assert all(answer.choices[0].message.content for answer in answers)
        # the streams overlapped in the engine: the chat answer started before the API answers ended
        assert chat_reply.first_token_at is not None
    finally:
        await chat.close()
        await api.close()


@in_loop
async def test_keys_in_the_chat_are_shown_once_and_never_stored(api_server: AppServer) -> None:
    chat = ChatClient(api_server.base_url)
    await chat.connect()
    try:
        made = await chat.ask("/key new", timeout=30)
        key = next(word.strip("`") for word in made.final.split() if word.strip("`").startswith("sk-vc-"))
        api = openai.AsyncOpenAI(base_url=api_server.base_url + "/v1", api_key=key, max_retries=0)
        assert (await api.models.list()).data
        listed = await chat.ask("/key list", timeout=30)
        assert key[:12] in listed.final and key not in listed.final
        revoked = await chat.ask(f"/key revoke {key[:12]}", timeout=30)
        assert "Revoked" in revoked.final
        with pytest.raises(openai.AuthenticationError):
            await api.models.list()
        await api.close()
    finally:
        await chat.close()
    database = sqlite3.connect(Path(api_server.env["DATA_DIR"]) / "chat.db")
    try:
        stored = database.execute("SELECT COUNT(*) FROM steps WHERE output LIKE ?", (f"%{key}%",)).fetchone()[
            0
        ]
        hashed = database.execute(
            "SELECT COUNT(*) FROM api_keys WHERE key_hash LIKE ?", (f"%{key}%",)
        ).fetchone()
    finally:
        database.close()
    assert stored == 0 and hashed[0] == 0


def test_metrics_are_labelled_by_route(api_server: AppServer, key: str) -> None:
    client(api_server, key).chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    route = "/v1/chat/completions"
    assert metric(api_server, "api_requests_total", route=route, status="200") >= 1
    assert metric(api_server, "api_requests_total", route=route, status="401") >= 1
    assert metric(api_server, "api_request_seconds_count", route=route) >= 1
    assert metric(api_server, "api_first_chunk_seconds_count", route="/v1/models") >= 1
    assert metric(api_server, "api_requests_in_flight", route=route) == 0


@in_loop
async def test_over_the_per_user_limit_gets_429_with_retry_after(api_server: AppServer, key: str) -> None:
    """USER_MAX_CONCURRENT_TURNS (the default): one request more while that many stream is refused."""
    api = openai.AsyncOpenAI(base_url=api_server.base_url + "/v1", api_key=key, max_retries=0)
    long_answer = {"model": MODEL, "messages": HELLO, "max_tokens": 2000, "extra_body": {"ignore_eos": True}}
    running = LIMITS.user_max_concurrent_turns
    streams = [await api.chat.completions.create(stream=True, **long_answer) for _ in range(running)]
    try:
        for stream in streams:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    break
        with pytest.raises(openai.RateLimitError) as refused:
            await api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert refused.value.body["type"] == "rate_limit_error" and "limit" in refused.value.body["message"]
    finally:
        for stream in streams:
            await stream.close()
        await api.close()
    await api_server.poll(lambda s: s["engine_unfinished_requests"] == 0, timeout=30)


@pytest.fixture(scope="module")
def budget_server(tiny_model_dir: Path) -> Iterator[AppServer]:
    """A server of its own with a small per-minute token budget (the long test below only)."""
    env = server_env(
        MODEL=tiny_model_dir,
        MAX_MODEL_LEN=TINY_MAX_MODEL_LEN,
        MAX_NUM_BATCHED_TOKENS=4096,
        OPS_TOKEN=TINY_OPS_TOKEN,
        USER_TOKENS_PER_MINUTE=TOKENS_PER_MINUTE,
    )
    server = AppServer(env, ARTIFACTS / "logs" / "api-budget-server.log").start()
    yield server
    assert not server.stop(), "engine processes outlived the server"


TOKENS_PER_MINUTE = 2000


# spends a minute's token budget on a server of its own: per commit,
# test_over_the_per_user_limit_gets_429_with_retry_after and tests/unit/test_api_gate.py
@pytest.mark.long
def test_api_answers_count_toward_the_per_user_token_limit(budget_server: AppServer) -> None:
    """USER_TOKENS_PER_MINUTE=2000 (the fixture): streamed answers without a usage report are counted
    from their text, and the owner is refused with Retry-After once over the limit."""
    accounts(data_dir(budget_server), "add", "carol", "--generate")
    api = client(budget_server, accounts(data_dir(budget_server), "key", "create", "carol").stdout.split()[0])
    long_answer = {"model": MODEL, "messages": HELLO, "max_tokens": 1200, "extra_body": {"ignore_eos": True}}
    answered = 0
    with pytest.raises(openai.RateLimitError) as refused:
        while answered < 4:
            for _ in api.chat.completions.create(stream=True, **long_answer):
                pass
            answered += 1
    assert answered >= 2, "refused before the limit was reached"
    assert "answer tokens" in refused.value.body["message"]
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 61
