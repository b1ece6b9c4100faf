"""ENGINE_URLS: the app chats through a real `vllm serve` (tiny model) instead of its own engine."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from harness.chat_client import ChatClient
from harness.server import AppServer, VllmServer, vllm_processes_without_workarounds
from services.admission.service import REFRESH_SECONDS
from services.engine.backends.remote import completion_body
from services.engine.backends.remote.server_load import POLL_SECONDS
from services.engine.chat_engine import PROSE_STOP, SamplingSettings, _sampling_params
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.system.conftest import accounts
from tests.system.helpers import HELLO, data_dir, idle

# vllm serve + an app: per commit, tests/unit/test_remote_engine.py against fake servers
pytestmark = pytest.mark.topology

LONG_ANSWER_TOKENS = 3000
STOP_ROUNDS = 4
NOT_AVAILABLE = "The model is not available right now"
API_MODEL = "tiny-llama"  # the model folder's name


# --- the real path: vllm serve + chainlit run -------------------------------------------
@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir: Path) -> Iterator[VllmServer]:
    server = VllmServer(tiny_model_dir, ARTIFACTS / "logs" / "vllm-serve.log", TINY_MAX_MODEL_LEN).start()
    yield server
    server.stop()


def test_a_vllm_server_started_as_the_readme_says_runs_the_workarounds(vllm_server: VllmServer) -> None:
    """With services/memory/vllm_plugins on PYTHONPATH, EngineCore and the worker of a vLLM server
    apply our workaround for the libzmq mailbox (README, "Scaling out")."""
    assert not vllm_processes_without_workarounds(vllm_server.log_path.read_text(errors="replace"))


def test_a_summary_keeps_its_minimum_length_and_its_stop_on_a_vllm_server(
    vllm_server: VllmServer, tiny_model_dir: Path
) -> None:
    """The body carries vLLM's min_tokens and stop; the real server ends at once without the minimum
    (the test favours its end-of-text token by +100) and writes the minimum with it."""
    eos = AutoTokenizer.from_pretrained(tiny_model_dir).eos_token_id
    model = httpx.get(f"{vllm_server.url}/v1/models").json()["data"][0]["id"]
    params = _sampling_params(SamplingSettings(1.0, 1.0, 40, min_new_tokens=24), 40, PROSE_STOP)
    body = completion_body(model, [1, 2, 3, 4], params)
    assert body["min_tokens"] == 24 and body["stop"] == list(PROSE_STOP)

    def answer_tokens(min_tokens: int) -> int:
        sent = {**body, "min_tokens": min_tokens, "stream": False, "logit_bias": {str(eos): 100}}
        response = httpx.post(f"{vllm_server.url}/v1/completions", json=sent, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["completion_tokens"]

    assert answer_tokens(0) <= 1
    assert answer_tokens(24) >= 24


@pytest.fixture(scope="module")
def remote_app(vllm_server: VllmServer, tiny_model_dir: Path) -> Iterator[AppServer]:
    """The app with ENGINE_URLS pointing at the vllm server; MODEL only names the tokenizer."""
    env = server_env(ENGINE_URLS=vllm_server.url, MODEL=tiny_model_dir, MAX_NEW_TOKENS=48, MAX_SESSIONS=50)
    app = AppServer(env, ARTIFACTS / "logs" / "remote-app.log").start()
    yield app
    app.stop()


@pytest.mark.asyncio(loop_scope="module")
async def test_sessions_stream_from_the_vllm_server(remote_app: AppServer, vllm_server: VllmServer) -> None:
    assert remote_app.engine_processes == [], "no engine runs inside the app"
    clients = [ChatClient(remote_app.base_url) for _ in range(4)]
    await asyncio.gather(*(c.connect() for c in clients))
    try:
        replies = await asyncio.gather(*(c.ask(f"Question {i}?") for i, c in enumerate(clients)))
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    for reply in replies:
        assert reply.final and NOT_AVAILABLE not in reply.final
        assert reply.streamed_text == reply.final, "streamed tokens add up to the final message"
        assert len(reply.streamed) > 1, "the answer was streamed, not sent whole"
    status = await remote_app.poll(lambda s: s["sessions"] == 0, timeout=5)
    assert status["engine_unfinished_requests"] == 0
    assert vllm_server.requests_held() == 0
    code, detail = remote_app.healthz()
    assert code == 200, detail


@pytest.mark.asyncio(loop_scope="module")
async def test_stop_aborts_the_request_on_the_vllm_server(
    remote_app: AppServer, vllm_server: VllmServer
) -> None:
    client = ChatClient(remote_app.base_url)
    await client.connect()
    try:
        # Several rounds: where the Stop lands (a token being read from the server or
        # being sent to the browser) varies, and each place must close the stream.
        for _ in range(STOP_ROUNDS):
            reply = await client.start_long_answer(LONG_ANSWER_TOKENS)
            assert vllm_server.requests_held() == 1, "the answer is generated on the server"
            await client.stop()
            await remote_app.poll(idle, 5)
            deadline = time.monotonic() + 5
            while vllm_server.requests_held() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert vllm_server.requests_held() == 0, "closing the stream aborted the request on the server"
            assert len(reply.streamed) < LONG_ANSWER_TOKENS
        await client.update_settings(max_new_tokens=8)
        assert (await client.ask("Still there?")).final, "the session keeps working after Stop"
    finally:
        await client.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_api_is_served_by_the_vllm_servers_behind_the_gate(
    remote_app: AppServer, vllm_server: VllmServer
) -> None:
    """/v1 in ENGINE_URLS mode: keys checked here, answers from the server, a disconnect aborts there."""
    accounts(data_dir(remote_app), "add", "dora", "--generate")
    key = accounts(data_dir(remote_app), "key", "create", "dora").stdout.split()[0]
    api = openai.AsyncOpenAI(base_url=remote_app.base_url + "/v1", api_key=key, max_retries=0, timeout=60)
    try:
        assert [m.id for m in (await api.models.list()).data] == [API_MODEL]
        answer = await api.chat.completions.create(model=API_MODEL, messages=HELLO, max_tokens=8)
        assert answer.choices[0].message.content and answer.usage.completion_tokens > 0
        parts = [c.choices[0].text async for c in await api.completions.create(
            model=API_MODEL, prompt="Once upon a time", max_tokens=6, stream=True) if c.choices]  # fmt: skip
        assert len(parts) > 1, "streamed from the server, not sent whole"
        with pytest.raises(openai.NotFoundError):
            await api.chat.completions.create(model="no-such-model", messages=HELLO, max_tokens=2)
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(base_url=remote_app.base_url + "/v1", api_key="sk-vc-wrong",
                                     max_retries=0).models.list()  # fmt: skip
        long_answer = {"max_tokens": LONG_ANSWER_TOKENS, "extra_body": {"ignore_eos": True}}
        stream = await api.chat.completions.create(
            model=API_MODEL, messages=HELLO, stream=True, **long_answer
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
        assert vllm_server.requests_held() == 1
        await stream.close()
        deadline = time.monotonic() + 5
        while vllm_server.requests_held() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert vllm_server.requests_held() == 0, "the client left: the server aborted the request"
    finally:
        await api.close()
    await remote_app.poll(lambda s: s["engine_unfinished_requests"] == 0, timeout=5)


@pytest.mark.asyncio(loop_scope="module")
async def test_others_requests_on_the_vllm_server_count_against_the_apps_running_limit(
    remote_app: AppServer, vllm_server: VllmServer
) -> None:
    """Another client of the same server (another app replica) holds slots of the engine's running
    limit: the app reads them from the server's /metrics, its own requests left out."""
    model = httpx.get(f"{vllm_server.url}/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": LONG_ANSWER_TOKENS,
            "ignore_eos": True, "stream": True}  # fmt: skip
    client = ChatClient(remote_app.base_url)

    async def read_to_the_end(others: httpx.AsyncClient) -> None:
        async with others.stream("POST", f"{vllm_server.url}/v1/completions", json=body) as response:
            async for _ in response.aiter_lines():
                pass

    async with httpx.AsyncClient(timeout=60) as others:
        readers = [asyncio.create_task(read_to_the_end(others)) for _ in range(2)]
        try:
            status = await remote_app.poll(lambda s: s["admission"]["others_running"] == 2, timeout=10)
            assert status["admission"]["running"].get("chat", 0) == 0
            await client.connect()
            await client.start_long_answer(LONG_ANSWER_TOKENS)
            await asyncio.sleep(2 * POLL_SECONDS + REFRESH_SECONDS)  # readings with our answer in them
            status = (await remote_app.astatus())["admission"]
            assert status["running"].get("chat") == 1 and status["others_running"] == 2, status
            await client.stop()
        finally:
            await client.close()
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
    await remote_app.poll(lambda s: s["admission"]["others_running"] == 0, timeout=10)
    await remote_app.poll(lambda s: s["engine_unfinished_requests"] == 0, timeout=5)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_server_lost_mid_answer_gives_a_clear_message_and_the_app_stays_up(
    remote_app: AppServer, vllm_server: VllmServer
) -> None:
    client = ChatClient(remote_app.base_url)
    await client.connect()
    try:
        reply = await client.start_long_answer(LONG_ANSWER_TOKENS)
        vllm_server.stop(signal.SIGKILL)  # last test of the module: the server is gone for good
        await asyncio.wait_for(reply.done.wait(), 30)
        assert reply.final is not None and NOT_AVAILABLE in reply.final, reply.final
        assert reply.streamed_text and reply.final.startswith(reply.streamed_text), "the partial answer stays"
        again = await client.ask("Anyone there?", timeout=30)
        assert again.final is not None and NOT_AVAILABLE in again.final
    finally:
        await client.close()
    status = remote_app.status()
    assert status["ready"] and status["engine_unfinished_requests"] == 0 and status["turns_in_flight"] == 0
    code, detail = remote_app.healthz()
    assert code == 503 and "ServerUnreachableError" in detail["error"], detail
    assert detail["engine_servers"]["state"] == "none" and detail["engine_servers"]["remote"], detail
    assert remote_app.probe("/readyz")[0] == 200, "a balancer keeps the replica: it serves pages"
    assert remote_app.probe("/livez")[0] == 200, "a restart would not bring the server back"
