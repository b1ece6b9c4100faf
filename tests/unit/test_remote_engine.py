"""The ENGINE_URLS client without a model: stream events, server choice, closing streams, refused
connections against fake servers, and the setting's checks (through a real `vllm serve`:
tests/system/engine/test_remote.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import types
from collections.abc import Iterator

import httpx
import pytest

from harness.loopback_http import LoopbackHttp
from harness.server import free_port
from services.config import Settings, SettingsError
from services.engine.backends.remote import (
    RemoteEngineError,
    RemoteLLM,
    Server,
    ServerUnreachableError,
    chunk_output,
    parse_event,
    servers_to_try,
)
from services.engine.backends.remote.server_load import router_workers
from services.engine.route_hint import PERSON_HEADERS, SESSION_HEADER, route_headers, set_route_hint

LONG_ANSWER_TOKENS = 3000
STOP_ROUNDS = 4


# --- pure logic ---------------------------------------------------------------------
def test_stream_events_become_outputs_and_errors_raise() -> None:
    assert parse_event(": keep-alive") is None
    assert parse_event("data: [DONE]") is None
    event = parse_event('data: {"choices": [{"text": "Hi", "token_ids": [5, 6], "finish_reason": null}]}')
    assert event is not None
    output = chunk_output(event)
    assert (output.outputs[0].text, output.outputs[0].token_ids, output.finished) == ("Hi", [5, 6], False)
    last = chunk_output({"choices": [{"text": "", "token_ids": [], "finish_reason": "length"}]})
    assert last.finished and last.outputs[0].finish_reason == "length"
    with pytest.raises(RemoteEngineError, match="too long"):
        chunk_output({"error": {"message": "prompt too long", "code": 400}})


def test_requests_go_to_the_least_busy_server_healthy_ones_first() -> None:
    a, b, c = Server("http://a"), Server("http://b"), Server("http://c")
    a.in_flight.update({"1", "2"})
    b.in_flight.add("3")
    c.in_flight.update({"4", "5", "6"})
    assert servers_to_try([a, b, c]) == [b, a, c]
    b.healthy = False
    assert servers_to_try([a, b, c]) == [a, c, b], "a server that failed is tried after the healthy ones"
    a.healthy = c.healthy = False
    assert servers_to_try([a, b, c])[0] is b, "with all failing, all are still tried"


@contextlib.contextmanager
def no_asyncgen_hooks() -> Iterator[None]:
    """As under `chainlit run`: its nest_asyncio loop never installs asyncio's async-generator
    hooks, so the garbage collector closes an abandoned async generator synchronously."""
    saved = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=None, finalizer=None)
    try:
        yield
    finally:
        sys.set_asyncgen_hooks(*saved)


class EndlessAnswers(LoopbackHttp):
    """A loopback HTTP server whose every /v1/completions stream goes on until its client leaves."""

    HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    EVENT = b'data: {"choices": [{"text": "x", "token_ids": [7], "finish_reason": null}]}\n\n'

    def __init__(self) -> None:
        super().__init__()
        self.left: asyncio.Queue[None] = asyncio.Queue()  # one item per client that went away

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(self.HEAD)
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(self.EVENT), self.EVENT))
                await writer.drain()
                await asyncio.sleep(0.002)
        except ConnectionError:
            self.left.put_nowait(None)

    async def client_left(self, timeout: float = 2) -> bool:
        try:
            await asyncio.wait_for(self.left.get(), timeout)
            return True
        except TimeoutError:
            return False


def remote_llm(*urls: str) -> RemoteLLM:
    llm = RemoteLLM(list(urls), tokenizer=None, connect_timeout=2, idle_timeout=2, max_connections=4)
    for server in llm.servers:
        server.model = "tiny"
    return llm


async def first_token_then_stop(llm: RemoteLLM, request_id: str) -> None:
    params = types.SimpleNamespace(max_tokens=LONG_ANSWER_TOKENS, temperature=1.0, top_p=1.0)
    stream = llm.generate({"prompt_token_ids": [1, 2]}, params, request_id)
    async with contextlib.aclosing(stream):
        async for _ in stream:
            break  # the user pressed Stop after the first token


@pytest.mark.asyncio(loop_scope="function")
async def test_closing_a_stream_mid_answer_closes_its_connection() -> None:
    """Closing must reach the socket, so the server sees its client leave and aborts."""
    stops_seen = []
    async with EndlessAnswers() as answers:
        llm = remote_llm(answers.url)
        try:
            with no_asyncgen_hooks():
                for round_ in range(STOP_ROUNDS):
                    await first_token_then_stop(llm, f"r{round_}")
                    stops_seen.append(await answers.client_left())
                gc.collect()  # abandoned generators are finalized here, not during pytest's report
        finally:
            await llm.aclose()
    assert stops_seen == [True] * STOP_ROUNDS, "the server saw its client leave after every Stop"
    assert llm.get_num_unfinished_requests() == 0


@pytest.mark.asyncio(loop_scope="function")
async def test_a_server_that_refuses_the_connection_is_skipped() -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with EndlessAnswers() as answers:
        llm = remote_llm(down, answers.url)
        try:
            await first_token_then_stop(llm, "first")  # tried `down` first (a tie), then the other
            assert [s.healthy for s in llm.servers] == [False, True]
            await first_token_then_stop(llm, "second")
            assert llm.get_num_unfinished_requests() == 0
            await answers.close()
            with pytest.raises(ServerUnreachableError, match="refused the connection"):
                await first_token_then_stop(llm, "third")
            assert llm.get_num_unfinished_requests() == 0
        finally:
            await llm.aclose()


def test_engine_urls_are_parsed_and_checked() -> None:
    settings = Settings.from_env({"ENGINE_URLS": " http://10.0.0.5:8000/, https://gpu-2:8000 ,"})
    assert settings.engine_url_list == ["http://10.0.0.5:8000/", "https://gpu-2:8000"]
    assert Settings.from_env({}).engine_url_list == []
    with pytest.raises(SettingsError, match="ENGINE_URLS entry 'gpu-3:8000'"):
        Settings.from_env({"ENGINE_URLS": "http://gpu-1:8000,gpu-3:8000"})


def test_engine_router_names_one_url_and_turns_our_affinity_off() -> None:
    settings = Settings.from_env({"ENGINE_URLS": "http://router:8000", "ENGINE_ROUTER": "true"})
    assert settings.engine_router and not settings.engine_affinity_on
    assert Settings.from_env({"ENGINE_URLS": "http://a:8000,http://b:8000"}).engine_affinity_on
    with pytest.raises(SettingsError, match="exactly one router URL"):
        Settings.from_env({"ENGINE_URLS": "http://a:8000,http://b:8000", "ENGINE_ROUTER": "true"})
    with pytest.raises(SettingsError, match="exactly one router URL"):
        Settings.from_env({"ENGINE_ROUTER": "true"})


@pytest.mark.asyncio(loop_scope="function")
async def test_a_turn_tags_its_own_requests_only_and_with_hashes() -> None:
    async def turn(conversation: str, person: str) -> dict[str, str]:
        set_route_hint(conversation, person)
        await asyncio.sleep(0)  # the other turn runs meanwhile
        return route_headers()

    first, second = await asyncio.gather(
        asyncio.create_task(turn("thread-1", "user:alice")), asyncio.create_task(turn("thread-2", "user:bob"))
    )
    assert route_headers() == {}, "nothing outside a turn"
    assert first[SESSION_HEADER] != second[SESSION_HEADER]
    assert {first[h] for h in PERSON_HEADERS} != {second[h] for h in PERSON_HEADERS}
    again = await asyncio.create_task(turn("thread-1", "user:alice"))
    assert again == first, "the same conversation and person give the same keys"
    assert not any(raw in str(first) for raw in ("thread-1", "alice")), "only hashes leave the app"


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"urls": ["http://a:8000/", "http://b:8000"]}', ["http://a:8000", "http://b:8000"]),
        (200, b'{"urls": ["http://a:8000", 5, null, "file:///etc/passwd", {"x": 1}]}', ["http://a:8000"]),
        (200, b'{"urls": "http://a:8000"}', []),
        (200, b"[1, 2]", []),
        (200, b"not json", []),
        (404, b'{"urls": ["http://a:8000"]}', []),
    ],
)
async def test_the_servers_a_router_lists_are_read_warily(
    status: int, body: bytes, expected: list[str]
) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
    async with httpx.AsyncClient(transport=transport) as client:
        assert await router_workers(client, "http://router:8000") == expected
