"""ENGINE_URLS with two models: two real `vllm serve` on loopback, each serving another tiny model (the
second with other weights, a shorter context and a chat template of its own), and an app that offers
what they list at /v1/models.

The model menu and our /v1/models list both; a conversation on the second model is answered by its
server only (the servers' own request counters), rendered with that model's own chat template (the
prompt the server logged), and keeps that model when resumed; an unknown model is refused; once the
second server is gone the app stops offering its model within a refresh, refuses it with a clear
message, and the first model still answers.
"""

from __future__ import annotations

import ast
import asyncio
import re
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from harness.chat_client import ChatClient
from harness.server import AppServer, VllmServer
from harness.tiny_model import build_tiny_model
from services.config import Settings
from services.config.engine import ENGINE_MODELS_MAX
from services.engine import SamplingSettings, ServedModels
from services.engine.backends.remote import Server
from services.engine.backends.remote.engine import remote_llm
from services.engine.remote_models import RemoteCatalogue
from tests.conftest import ARTIFACTS, TINY_MAX_MODEL_LEN, server_env
from tests.system.conftest import ADMIN, ALICE, accounts, add_alice_and_bob
from tests.system.helpers import stored_thread

# two vllm serve + an app: per commit, tests/unit/test_remote_models.py
pytestmark = pytest.mark.topology

in_loop = pytest.mark.asyncio(loop_scope="module")
FIRST, SECOND = "tiny-llama", "tiny-templated"
SECOND_CONTEXT = 2048  # the second model's own context (its server's --max-model-len)
MARK = "templated-turn"  # what the second model's chat template writes into every turn
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + ' " + MARK + "\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
QUESTION = "Name three colours of the rainbow."
REFRESH_SECONDS = 1


@pytest.fixture(scope="module")
def second_model_dir(default_model_dir: Path, tiny_model_dir: Path) -> Path:
    """Another tiny model: other weights, a shorter context, and a chat template of its own."""
    folder = build_tiny_model(default_model_dir, tiny_model_dir.parent / SECOND,
                              max_position_embeddings=SECOND_CONTEXT, seed=1, tied=False)  # fmt: skip
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


@pytest.fixture(scope="module")
def servers(tiny_model_dir: Path, second_model_dir: Path) -> Iterator[tuple[VllmServer, VllmServer]]:
    logs = ARTIFACTS / "logs"
    first = VllmServer(tiny_model_dir, logs / "vllm-serve-first.log", TINY_MAX_MODEL_LEN)
    # The second logs each request's prompt token ids (DEBUG): the test reads which template made them.
    second = VllmServer(
        second_model_dir, logs / "vllm-serve-second.log", SECOND_CONTEXT, "--enable-log-requests"
    )
    second.env["VLLM_LOGGING_LEVEL"] = "DEBUG"
    try:
        first.start()
        second.start()
        yield first, second
    finally:
        first.stop()
        second.stop()


@pytest.fixture(scope="module")
def app(
    servers: tuple[VllmServer, VllmServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AppServer]:
    """The app on both servers; no MODEL: each model's tokenizer is the folder its server loaded."""
    env = server_env(
        ENGINE_URLS=",".join(s.url for s in servers), ENGINE_MODELS_REFRESH_SECONDS=REFRESH_SECONDS,
        MAX_NEW_TOKENS=8, AUTH_MODE="password", ADMIN_USERNAME=ADMIN[0], ADMIN_PASSWORD=ADMIN[1],
        DATA_DIR=tmp_path_factory.mktemp("remote-models-data"),
    )  # fmt: skip
    server = AppServer(env, ARTIFACTS / "logs" / "remote-models-app.log").start()
    try:
        add_alice_and_bob(server)
        yield server
    finally:
        server.stop()


def answered(server: VllmServer) -> float:
    """Requests the server has finished, from its own Prometheus metrics."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("vllm:request_success_total{")
    )


def logged_prompts(server: VllmServer) -> list[list[int]]:
    """The prompt token ids of every request the server logged (--enable-log-requests, DEBUG)."""
    text = server.log_path.read_text(errors="replace")
    return [ast.literal_eval(ids) for ids in re.findall(r"prompt_token_ids: (\[[\d, ]*\])", text)]


async def opened(app: AppServer, profile: str = "") -> ChatClient:
    """A new conversation of Alice's on `profile`, once its settings panel came (the session exists)."""
    client = ChatClient(app.base_url, *ALICE, chat_profile=profile)
    await client.connect()
    for _ in range(100):
        if client.settings_widgets:
            return client
        await asyncio.sleep(0.1)
    raise AssertionError("no settings panel came")


def told(client: ChatClient) -> list[str]:
    return [d.get("output", "") for n, d in client.events if n == "new_message" and isinstance(d, dict)]


def api(app: AppServer) -> httpx.Client:
    key = accounts(Path(app.env["DATA_DIR"]), "key", "create", ALICE[0]).stdout.split()[0]
    return httpx.Client(base_url=app.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


@in_loop
async def test_the_menu_and_the_api_offer_what_the_servers_list(app: AppServer) -> None:
    client = await opened(app)
    profiles = (await client.http("GET", "/project/settings", params={"language": "en-US"})).json()
    assert [p["name"] for p in profiles["chatProfiles"]] == [FIRST, SECOND]
    await client.close()
    with api(app) as http:
        listed = http.get("/v1/models").json()["data"]
    assert {m["id"]: m["max_model_len"] for m in listed} == {
        FIRST: TINY_MAX_MODEL_LEN,
        SECOND: SECOND_CONTEXT,
    }


@in_loop
async def test_the_second_model_answers_from_its_server_under_its_template_and_keeps_it(
    app: AppServer, servers: tuple[VllmServer, VllmServer], second_model_dir: Path
) -> None:
    first, second = servers
    before = answered(first), answered(second)
    client = await opened(app, SECOND)
    reply = await client.ask(QUESTION)
    assert reply.final and client.thread_id
    assert (answered(first), answered(second)) == (before[0], before[1] + 1), "only its server answered"
    assert reply.message_id and client.messages[reply.message_id]["metadata"]["model"] == SECOND
    prompt = AutoTokenizer.from_pretrained(second_model_dir).decode(logged_prompts(second)[-1])
    assert f"user {MARK}\n{QUESTION}" in prompt, f"rendered with the second model's own template: {prompt!r}"
    # A reload: the page sends no profile; the stored answers name the model.
    thread_id = client.thread_id
    await stored_thread(client, thread_id, steps=2)
    await client.leave()
    again = ChatClient(app.base_url, cookie=client.cookie)
    await again.resume(thread_id)
    more = await again.ask("And three more?")
    assert more.final and again.messages[more.message_id]["metadata"]["model"] == SECOND
    assert (answered(first), answered(second)) == (before[0], before[1] + 2)
    await again.close()


@in_loop
async def test_no_choice_is_the_first_model_and_an_unknown_one_is_refused(
    app: AppServer, servers: tuple[VllmServer, VllmServer]
) -> None:
    first, second = servers
    before = answered(first), answered(second)
    client = await opened(app)
    assert (await client.ask(QUESTION)).final
    assert (answered(first), answered(second)) == (before[0] + 1, before[1])
    await client.close()
    unknown = await opened(app, "gpt-5")
    assert any(f"«gpt-5» is not served here; served: {FIRST}, {SECOND}" in text for text in told(unknown))
    refused = await unknown.ask(QUESTION, timeout=30)
    assert "not served here" in (refused.final or "") and not refused.streamed_text
    await unknown.close()


def test_the_api_sends_each_model_to_its_own_server(app: AppServer, servers: tuple[VllmServer, VllmServer],
                                                   second_model_dir: Path) -> None:  # fmt: skip
    first, second = servers
    before = answered(first), answered(second)
    body = {"model": SECOND, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 4}
    with api(app) as http:
        answer = http.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200 and answer.json()["model"] == str(second_model_dir), answer.text
        assert (answered(first), answered(second)) == (before[0], before[1] + 1)
        unknown = http.post("/v1/chat/completions", json={**body, "model": "gpt-5"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    assert f"served: {FIRST}, {SECOND}" in unknown.json()["error"]["message"]


@in_loop
async def test_stop_on_the_second_model_aborts_its_request_on_its_server(
    app: AppServer, servers: tuple[VllmServer, VllmServer]
) -> None:
    _, second = servers
    client = await opened(app, SECOND)
    reply = await client.start_long_answer(3000)
    assert second.requests_held() == 1, "the answer is generated on the second model's server"
    await client.stop()
    for _ in range(100):
        if not second.requests_held():
            break
        await asyncio.sleep(0.05)
    assert second.requests_held() == 0, "closing the stream aborted the request on its server"
    assert len(reply.streamed) < 3000
    await app.poll(lambda status: status["engine_unfinished_requests"] == 0, 5)
    await client.close()


@in_loop
async def test_a_model_listed_after_the_start_is_added_with_its_own_template_and_context(
    servers: tuple[VllmServer, VllmServer],
) -> None:
    """As when a router gains a server of another model: the next reading serves the new model, its
    engine built here with that model's tokenizer, and its requests go to the server listing it."""
    first, second = servers
    settings = Settings.from_env({"ENGINE_URLS": first.url, "MAX_NEW_TOKENS": "4"})
    remote = remote_llm(settings, None)
    try:
        await remote.connect(ENGINE_MODELS_MAX)
        catalogue = RemoteCatalogue(settings, remote)
        engine = await catalogue.engine_for(catalogue.offers()[FIRST], True)
        assert engine is not None
        catalogue.served = ServedModels({FIRST: engine}, catalogue.offered)
        added: list[str] = []
        catalogue.served.on_added(lambda name, _: added.append(name))
        remote.servers.append(Server(second.url))  # the fleet gained a server of another model
        await catalogue.refresh()
        assert catalogue.served.names == [FIRST, SECOND] and added == [SECOND]
        late = catalogue.served.engine(SECOND)
        assert late.max_model_len == SECOND_CONTEXT
        assert MARK in late.tokenizer.decode(late.encode_chat([{"role": "user", "content": QUESTION}]))
        before = answered(first), answered(second)
        ask = [{"role": "user", "content": QUESTION}]
        text = [t async for t in late.generate(ask, SamplingSettings(0.0, 1.0, 4), "late-model-1")]
        assert text and (answered(first), answered(second)) == (before[0], before[1] + 1)
    finally:
        await remote.aclose()


@in_loop
async def test_a_model_whose_server_went_away_is_refused_and_the_other_still_answers(
    app: AppServer, servers: tuple[VllmServer, VllmServer]
) -> None:
    first, second = servers
    on_second = await opened(app, SECOND)
    assert (await on_second.ask(QUESTION)).final
    second.stop(signal.SIGKILL)  # last test of the module: the server is gone for good
    with api(app) as http:
        for _ in range(REFRESH_SECONDS * 30):
            if [m["id"] for m in http.get("/v1/models").json()["data"]] == [FIRST]:
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("the app still lists the model whose server went away")
        gone = http.post("/v1/chat/completions", json={"model": SECOND, "messages": [
            {"role": "user", "content": QUESTION}], "max_tokens": 4})  # fmt: skip
        assert gone.status_code == 503 and gone.json()["error"]["code"] == "model_unavailable", gone.text
        assert f"«{SECOND}» is not available right now" in gone.json()["error"]["message"]
        kept = http.post("/v1/chat/completions", json={"model": FIRST, "messages": [
            {"role": "user", "content": QUESTION}], "max_tokens": 4})  # fmt: skip
        assert kept.status_code == 200, kept.text
    refused = await on_second.ask("Still there?", timeout=30)
    assert f"«{SECOND}» is not available right now" in (refused.final or "") and not refused.streamed_text
    await on_second.close()
    late = await opened(app, SECOND)
    assert any(f"available: {FIRST}" in text for text in told(late))
    await late.close()
    before = answered(first)
    on_first = await opened(app, FIRST)
    assert (await on_first.ask(QUESTION)).final and answered(first) == before + 1
    profiles = (await on_first.http("GET", "/project/settings", params={"language": "en-US"})).json()
    assert [p["name"] for p in profiles["chatProfiles"]] == [FIRST]
    await on_first.close()
    code, _ = app.healthz()
    assert code == 200, "one server still serves: the service is up"
