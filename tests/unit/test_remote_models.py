"""The models of the vLLM servers (ENGINE_URLS): hostile /v1/models listings read and merged, the
listing read over real sockets (oversized, broken, gone), the served set that changes while the
service runs, and the choice of a model that went away (refused, never switched silently)."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from pathlib import Path

import pytest

from harness.loopback_http import LoopbackHttp
from services.chat.model_choice import OfferedChats, chat_for, choose
from services.chat.session import ChatSession
from services.config import Settings
from services.engine import SamplingSettings, ServedModels, UnavailableModelError, UnknownModelError
from services.engine.backends.remote import RemoteLLM, Server, ServerUnreachableError
from services.engine.backends.remote.listing import Card, Offer, merge, parse_listing
from services.engine.backends.remote.model_listings import MAX_LISTING_BYTES, read_listing, refresh_listings
from services.engine.backends.remote.routing import model_id
from services.engine.remote_models import tokenizer_source


def card(model_id: str, length: int = 4096, root: str = "") -> dict:
    return {"id": model_id, "object": "model", "max_model_len": length, "root": root or model_id}


def test_a_vllm_listing_is_read_by_each_ids_last_part() -> None:
    listing = {"object": "list", "data": [card("/models/tiny-llama"), card("Org/Other-7B", 2048)]}
    cards = parse_listing(listing, 32)
    assert list(cards) == ["tiny-llama", "Other-7B"]
    assert cards["Other-7B"] == Card("Org/Other-7B", 2048, "Org/Other-7B")


@pytest.mark.parametrize(
    "document",
    [None, [], "data", 7, {"data": None}, {"data": {"id": "x"}}, {"data": "x" * 100}, {"object": "list"}],
)
def test_a_listing_of_another_shape_lists_nothing(document: object) -> None:
    assert parse_listing(document, 32) == {}


@pytest.mark.parametrize(
    "entry",
    [
        None, 5, "tiny", ["tiny"], {}, {"id": 5, "max_model_len": 10}, {"id": "", "max_model_len": 10},
        {"id": "   ", "max_model_len": 10}, {"id": "x" * 201, "max_model_len": 10},
        {"id": ["a"], "max_model_len": 10}, {"id": "tiny"}, {"id": "tiny", "max_model_len": "4096"},
        {"id": "tiny", "max_model_len": True}, {"id": "tiny", "max_model_len": 0},
        {"id": "tiny", "max_model_len": -5}, {"id": "tiny", "max_model_len": 4096.0},
        {"id": "tiny", "max_model_len": 10**30}, {"id": "tiny", "max_model_len": None},
        {"id": "ti\nny", "max_model_len": 10}, {"id": "a/\x1b[31m", "max_model_len": 9},
    ],
)  # fmt: skip
def test_an_entry_without_a_usable_id_or_context_is_skipped(entry: object) -> None:
    listing = {"data": [entry, card("/m/kept")]}
    assert list(parse_listing(listing, 32)) == ["kept"]


def test_a_root_of_the_wrong_type_is_dropped_not_the_model() -> None:
    listing = {"data": [{"id": "tiny", "max_model_len": 64, "root": {"path": "/etc"}}]}
    assert parse_listing(listing, 32)["tiny"].root == ""


class Untouchable(dict):
    """A listing entry that fails the test when it is read: shows what a parse looks at without
    timing it (a time bound says the same only on a quiet machine)."""

    def get(self, *args: object) -> object:
        raise AssertionError("an entry past the limit was read")


def test_duplicates_keep_the_first_card_and_a_huge_listing_is_cut() -> None:
    listing = {"data": [card("/a/tiny", 100), card("/a/tiny", 200), card("/b/tiny", 300), card("other", 50)]}
    assert parse_listing(listing, 32) == {
        "tiny": Card("/a/tiny", 100, "/a/tiny"),
        "other": Card("other", 50, "other"),
    }
    past_the_limit = Untouchable(card("late"))
    huge = {"data": [card(f"m{i}") for i in range(32)] + [past_the_limit] * 200_000}
    cards = parse_listing(huge, 32)  # only the first `limit` entries are looked at
    assert list(cards) == [f"m{i}" for i in range(32)]


def listings(*servers: tuple[bool, list[dict]]) -> list[tuple[bool, dict[str, Card]]]:
    return [(healthy, parse_listing({"data": cards}, 32)) for healthy, cards in servers]


def test_a_model_is_offered_while_a_healthy_server_lists_it() -> None:
    both = listings((True, [card("/m/a"), card("/m/b", 2048)]), (True, [card("/n/b", 1024), card("c")]))
    offers = merge(both, [])
    assert list(offers) == ["a", "b", "c"]
    assert offers["b"].max_model_len == 1024, "a request may land on either server: the smaller context"
    assert offers["b"].card.id == "/m/b"
    down = listings((False, [card("/m/a"), card("/m/b", 2048)]), (True, [card("/n/b", 1024)]))
    assert list(merge(down, [])) == ["b"]
    assert merge(listings((False, [card("a")])), []) == {}


def test_models_restrict_and_order_what_is_offered() -> None:
    servers = listings((True, [card("/m/a"), card("/m/b"), card("/m/c")]))
    assert list(merge(servers, ["c", "a", "missing"])) == ["c", "a"]


def test_each_server_is_asked_by_its_own_id_for_the_model() -> None:
    first, second = Server("http://a", model="/m/a"), Server("http://b", model="/n/x")
    first.models = parse_listing({"data": [card("/m/a"), card("/m/b")]}, 32)
    second.models = parse_listing({"data": [card("/n/x"), card("/n/b")]}, 32)
    assert (model_id(first, "b"), model_id(second, "b")) == ("/m/b", "/n/b")
    assert model_id(first, "") == "/m/a", "no model named: the server's first"
    llm = RemoteLLM(
        ["http://a", "http://b"], tokenizer=None, connect_timeout=1, idle_timeout=1, max_connections=2
    )
    llm.servers[0].models, llm.servers[1].models = first.models, second.models
    assert [s.url for s in llm.serving("b")] == ["http://a", "http://b"]
    assert [s.url for s in llm.serving("x")] == ["http://b"], "requests for a model go where it is listed"
    with pytest.raises(ServerUnreachableError, match="no vLLM server lists the model gone"):
        llm.serving("gone")


# --- reading listings over real sockets --------------------------------------------------------
class ListingServer(LoopbackHttp):
    """A loopback HTTP server that answers every request with `status` and `body` (changeable)."""

    def __init__(self, body: bytes, status: int = 200) -> None:
        super().__init__()
        self.body, self.status = body, status

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        head = f"HTTP/1.1 {self.status} X\r\ncontent-length: {len(self.body)}\r\nconnection: close\r\n\r\n"
        writer.write(head.encode() + self.body)
        await writer.drain()
        writer.close()


async def read(url: str) -> dict[str, Card]:
    llm = RemoteLLM([url], tokenizer=None, connect_timeout=2, idle_timeout=2, max_connections=2)
    try:
        return await read_listing(llm._client, llm.servers[0], 32, 2)
    finally:
        await llm.aclose()


@pytest.mark.asyncio
async def test_a_listing_is_read_over_http() -> None:
    async with ListingServer(json.dumps({"data": [card("/m/tiny", 64)]}).encode()) as server:
        assert await read(server.url) == {"tiny": Card("/m/tiny", 64, "/m/tiny")}


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        (b"{" + b" " * (MAX_LISTING_BYTES + 10) + b"}", 200, "more than"),
        (b"not json", 200, "JSONDecodeError"),
        (b'{"error": "down"}', 500, "HTTPStatusError"),
    ],
)
async def test_an_oversized_broken_or_failing_listing_is_refused(body: bytes, status: int, said: str) -> None:
    async with ListingServer(body, status) as server:
        with pytest.raises(ServerUnreachableError, match=said):
            await read(server.url)


@pytest.mark.asyncio
async def test_a_server_that_stops_answering_is_down_and_comes_back_with_its_new_listing() -> None:
    async with ListingServer(json.dumps({"data": [card("/m/a")]}).encode()) as up:
        llm = RemoteLLM([up.url], tokenizer=None, connect_timeout=1, idle_timeout=1, max_connections=2)
        try:
            await refresh_listings(llm._client, llm.servers, 32, 1)
            assert llm.servers[0].healthy and list(llm.servers[0].models) == ["a"]
            up.body, up.status = b"{}", 503
            await refresh_listings(llm._client, llm.servers, 32, 1)
            assert not llm.servers[0].listed and list(llm.servers[0].models) == ["a"], "kept, not offered"
            up.body, up.status = json.dumps({"data": [card("/m/b")]}).encode(), 200
            await refresh_listings(llm._client, llm.servers, 32, 1)
            assert llm.servers[0].listed and list(llm.servers[0].models) == ["b"]
        finally:
            await llm.aclose()


# --- the served set, and the choice of a model that went away ----------------------------------
def session() -> ChatSession:
    return ChatSession("tab", SamplingSettings(0.2, 0.9, 16), "system", deque())


def test_a_model_that_went_away_is_refused_saying_so_and_one_seen_later_is_added() -> None:
    offered = ["a", "b"]
    models = ServedModels({"a": "engine a", "b": "engine b"}, lambda: list(offered))  # type: ignore[dict-item]
    added: list[str] = []
    models.on_added(lambda name, _: added.append(name))
    assert models.resolve("b") == "b" and models.resolve(None) == "a"
    offered.remove("b")
    with pytest.raises(UnavailableModelError, match=r"«b» is not available right now.*available: a"):
        models.resolve("b")
    with pytest.raises(UnknownModelError, match="not served here; served: a"):
        models.resolve("c")
    offered.append("c")
    assert models.names == ["a"], "offered only once its engine exists"
    models.add("c", "engine c")  # type: ignore[arg-type]
    assert models.names == ["a", "c"] and added == ["c"] and models.known == ["a", "b", "c"]
    offered.remove("a")
    assert models.default_name == "c", "no choice: the first model offered now"
    offered.clear()
    assert models.names == ["a"], "none listed: the first stays, its requests fail as the engine's do"


def test_a_conversation_on_a_model_that_went_away_is_refused_not_switched() -> None:
    offered = ["a", "b"]
    models = ServedModels({"a": "engine a", "b": "engine b"}, lambda: list(offered))  # type: ignore[dict-item]
    chats = OfferedChats({"a": "chat a", "b": "chat b"}, models)
    s = session()
    assert choose(chats, s, "b") is None and chat_for(chats, s) == "chat b"
    offered.remove("b")
    assert list(chats) == ["a"] and len(chats) == 1 and "b" not in chats
    refusal = choose(chats, s, "b")  # a resume of the conversation
    assert refusal is not None and "«b» is not available right now" in refusal and "available: a" in refusal
    assert chat_for(chats, s, None) is None and s.model == "b"
    assert choose(chats, s, "zzz") is None and chat_for(chats, s) == "chat a", "one model: no choice"
    assert choose(chats, s, ["b"]) is None and choose(chats, s, {"b": 1}) is None, "any type is no choice"
    offered.append("b")
    assert choose(chats, s, "b") is None and chat_for(chats, s) == "chat b", "back when listed again"


def test_a_models_tokenizer_comes_from_models_then_the_servers_folder_then_model(tmp_path: Path) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    here = Offer("tiny", 64, Card("/srv/tiny", 64, str(folder)))
    elsewhere = Offer("Other-7B", 64, Card("Org/Other-7B", 64, "/srv/models/Other-7B"))
    remote = {"ENGINE_URLS": "http://a:8000"}
    named = Settings.from_env({**remote, "MODELS": "/mine/tiny,Other-7B"})
    assert tokenizer_source(named, here, False) == "/mine/tiny", "a MODELS folder wins"
    assert tokenizer_source(named, elsewhere, False) == "/srv/models/Other-7B", "a bare name gives no folder"
    plain = Settings.from_env({**remote, "MODEL": "/local/Other-7B"})
    assert tokenizer_source(plain, here, False) == str(folder), (
        "the folder the server loaded, when it is here"
    )
    assert tokenizer_source(plain, elsewhere, False) == "/local/Other-7B", "MODEL names this model"
    other = Offer("x", 64, Card("x", 64, ""))
    assert tokenizer_source(plain, other, True) == "/local/Other-7B", "one model served: MODEL's tokenizer"
    assert tokenizer_source(plain, other, False) == "", "no source: not offered"
