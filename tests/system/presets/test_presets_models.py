"""Presets and the choice of model on a real two-model server (MODELS), over socket.io and HTTP.

A default saved by a person applies to each of their new conversations, and survives a restart;
templates come back as their starters; nobody sees another's. Each served model answers the
conversations that chose it (the answer's stored metadata names it, and the two models' answers
differ), a resumed conversation keeps its model, /v1/models lists exactly the served models with
each one's own context length, and a model that is not served is refused, on the page and in /v1.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.chat_client import ChatClient
from harness.server import AppServer
from tests.conftest import TINY_MAX_MODEL_LEN
from tests.system.conftest import ALICE, BOB, MODELS_START_TIMEOUT_SECONDS, OTHER_MODEL_CONTEXT, accounts
from tests.system.helpers import stored_thread

# two models in one server and a restart: per commit, test_presets_store.py and
# tests/unit/test_model_choice.py
pytestmark = pytest.mark.long

in_loop = pytest.mark.asyncio(loop_scope="module")
LAST_ON_ITS_SERVER = True  # the restart test ends this module; the browser tests run before it
MODELS = ["tiny-llama", "tiny-other"]
QUESTION = "Name three colours of the rainbow."


def as_dict(metadata: Any) -> dict[str, Any]:
    """A stored step's metadata: JSON text on SQLite."""
    return json.loads(metadata) if isinstance(metadata, str) else metadata


def widgets(client: ChatClient) -> dict[str, Any]:
    return {w["id"]: w.get("initial") for w in client.settings_widgets}


async def opened(server: AppServer, who: tuple[str, str], **kwargs: Any) -> ChatClient:
    """A new conversation, once its settings panel came (the session exists)."""
    client = ChatClient(server.base_url, *who, **kwargs)
    await client.connect()
    for _ in range(100):
        if client.settings_widgets:
            return client
        await asyncio.sleep(0.1)
    raise AssertionError("no settings panel came")


async def project_settings(client: ChatClient) -> dict[str, Any]:
    response = await client.http("GET", "/project/settings", params={"language": "en-US"})
    assert response.status_code == 200
    return response.json()


async def command(client: ChatClient, text: str) -> str:
    reply = await client.ask(text, timeout=30)
    assert reply.final is not None
    return reply.final


@in_loop
async def test_a_saved_default_applies_to_each_new_conversation(models_server: AppServer) -> None:
    first = await opened(models_server, ALICE)
    await first.update_settings(temperature=0.55, system_prompt="Answer like a pirate.", top_p=0.8,
                                max_new_tokens=32)  # fmt: skip
    assert "Saved." in await command(first, "/preset save")
    await first.close()
    second = await opened(models_server, ALICE)
    shown = widgets(second)
    assert shown["system_prompt"] == "Answer like a pirate." and shown["temperature"] == 0.55
    assert shown["top_p"] == 0.8 and shown["max_new_tokens"] == 32 and shown["save_as_default"] is False
    assert "pirate" in await command(second, "/preset show")
    # The switch saves what is in effect.
    await second.update_settings(**{**shown, "system_prompt": "Answer like a poet.", "save_as_default": True})
    for _ in range(50):
        if any(
            "Saved as your default" in (d.get("output") or "")
            for _, d in second.events
            if isinstance(d, dict)
        ):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the switch did not save the default")
    await second.close()
    third = await opened(models_server, ALICE)
    assert widgets(third)["system_prompt"] == "Answer like a poet."
    await third.close()


@in_loop
async def test_a_template_is_offered_as_a_starter_to_its_owner_only(models_server: AppServer) -> None:
    alice = await opened(models_server, ALICE)
    assert "saved" in await command(alice, "/template save Rainbow | " + QUESTION)
    starters = (await project_settings(alice))["starters"]
    assert [(s["label"], s["message"]) for s in starters] == [("Rainbow", QUESTION)]
    assert "Rainbow" in await command(alice, "/template list")
    bob = await opened(models_server, BOB)
    assert (await project_settings(bob))["starters"] == []
    assert await command(bob, "/template list") == "No templates saved."
    assert await command(bob, "/template delete Rainbow") == "No template of that name."
    assert "No default saved" in await command(bob, "/preset show")
    assert widgets(bob)["system_prompt"] != "Answer like a poet.", "Bob never gets Alice's default"
    assert [s["label"] for s in (await project_settings(alice))["starters"]] == ["Rainbow"]
    await alice.close()
    await bob.close()


@in_loop
async def test_bad_presets_are_refused_and_the_chat_goes_on(models_server: AppServer) -> None:
    bob = await opened(models_server, BOB)
    assert "control characters" in await command(bob, "/template save Bell | ring \x07 ring")
    assert "template name" in await command(bob, "/template save " + "n" * 80 + " | text")
    assert "Give a name and a text" in await command(bob, "/template save no bar here")
    for i in range(3):
        await command(bob, f"/template save t{i} | text {i}")
    assert "the most allowed (3)" in await command(bob, "/template save t3 | one too many")
    await bob.update_settings(system_prompt="x" * 5000)  # longer than a preset may keep
    assert "longer than 4,000" in await command(bob, "/preset save")
    assert (await bob.ask(QUESTION)).final, "the chat still answers"
    await bob.close()


@in_loop
async def test_the_model_menu_lists_the_served_models(models_server: AppServer) -> None:
    alice = await opened(models_server, ALICE)
    profiles = (await project_settings(alice))["chatProfiles"]
    assert [p["name"] for p in profiles] == MODELS and profiles[0]["default"]
    await alice.close()


async def answer_of(server: AppServer, profile: str) -> tuple[str, str]:
    """A greedy answer to QUESTION in a new conversation on `profile`; the model its stored step names."""
    client = await opened(server, ALICE, chat_profile=profile)
    await client.update_settings(temperature=0, system_prompt="Be brief.", max_new_tokens=8)
    reply = await client.ask(QUESTION)
    assert reply.final and client.thread_id
    thread = await stored_thread(client, client.thread_id, steps=2, containing=reply.final)
    answers = [s for s in thread["steps"] if s["type"] == "assistant_message" and s["output"] == reply.final]
    await client.close()
    return reply.final, as_dict(answers[0]["metadata"])["model"]


@in_loop
async def test_each_model_answers_the_conversations_that_chose_it(models_server: AppServer) -> None:
    first, first_model = await answer_of(models_server, "tiny-llama")
    other, other_model = await answer_of(models_server, "tiny-other")
    again, _ = await answer_of(models_server, "tiny-other")
    assert (first_model, other_model) == ("tiny-llama", "tiny-other")
    assert other == again and first != other, "the same model answers alike, the other otherwise"
    default, default_model = await answer_of(models_server, "")
    assert (default, default_model) == (first, "tiny-llama"), "no choice: the first model"


@in_loop
async def test_each_model_keeps_its_own_context_length(models_server: AppServer) -> None:
    long_message = " ".join(f"fact{i}" for i in range(700))  # ~2,700 tokens: fits 4,096, not 2,048
    on_other = await opened(models_server, ALICE, chat_profile="tiny-other")
    refused = await on_other.ask(long_message)
    assert "too long for this model" in (refused.final or "") and "(2048 tokens)" in (refused.final or "")
    await on_other.close()
    on_first = await opened(models_server, ALICE, chat_profile="tiny-llama")
    answered = await on_first.ask(long_message)
    assert answered.final and "too long" not in answered.final and answered.streamed_text
    await on_first.close()


@in_loop
async def test_a_resumed_conversation_keeps_its_model(models_server: AppServer) -> None:
    client = await opened(models_server, ALICE, chat_profile="tiny-other")
    assert (await client.ask(QUESTION)).final and client.thread_id
    thread_id = client.thread_id
    await stored_thread(client, thread_id, steps=2)
    await client.leave()
    again = ChatClient(models_server.base_url, cookie=client.cookie)  # a reload: the page sends no profile
    await again.resume(thread_id)
    reply = await again.ask("And three more?")
    assert reply.final and again.messages[reply.message_id]["metadata"]["model"] == "tiny-other"
    await again.close()


@in_loop
async def test_a_model_that_is_not_served_is_refused_on_the_page(models_server: AppServer) -> None:
    client = await opened(models_server, ALICE, chat_profile="gpt-5")
    told = [d.get("output", "") for n, d in client.events if n == "new_message" and isinstance(d, dict)]
    assert any("«gpt-5» is not served here; served: tiny-llama, tiny-other" in text for text in told)
    reply = await client.ask(QUESTION, timeout=30)
    assert "not served here" in (reply.final or "") and not reply.streamed_text
    await client.close()


def api_key(server: AppServer, who: str) -> str:
    return accounts(Path(server.env["DATA_DIR"]), "key", "create", who).stdout.split()[0]


def test_the_api_lists_and_answers_from_exactly_the_served_models(models_server: AppServer) -> None:
    headers = {"Authorization": f"Bearer {api_key(models_server, 'alice')}"}
    with httpx.Client(base_url=models_server.base_url, headers=headers, timeout=60) as http:
        listed = http.get("/v1/models").json()["data"]
        assert {m["id"]: m["max_model_len"] for m in listed} == {
            "tiny-llama": TINY_MAX_MODEL_LEN, "tiny-other": OTHER_MODEL_CONTEXT,
        }  # fmt: skip
        texts = {}
        for name in MODELS:
            body = {"model": name, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8,
                    "temperature": 0}  # fmt: skip
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200 and response.json()["model"] == name
            texts[name] = response.json()["choices"][0]["message"]["content"]
        assert texts["tiny-llama"] != texts["tiny-other"]
        unknown = http.post("/v1/chat/completions", json={**body, "model": "gpt-5"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        assert "served: tiny-llama, tiny-other" in unknown.json()["error"]["message"]
        too_long = http.post("/v1/completions", json={"model": "tiny-other", "prompt": "hi",
                                                      "max_tokens": OTHER_MODEL_CONTEXT + 1})  # fmt: skip
        assert too_long.status_code == 400, "the shorter model's own context is its limit"


def restart(server: AppServer) -> None:
    """Stop the server and start it again on the same database (a new app folder: a stop removes it)."""
    server.stop()
    server.env.pop("CHAINLIT_APP_ROOT")
    server.start(MODELS_START_TIMEOUT_SECONDS)


@in_loop
async def test_presets_survive_a_restart(models_server: AppServer) -> None:
    restart(models_server)
    client = await opened(models_server, ALICE)
    assert widgets(client)["system_prompt"] == "Answer like a poet."
    assert [s["label"] for s in (await project_settings(client))["starters"]] == ["Rainbow"]
    await client.close()
