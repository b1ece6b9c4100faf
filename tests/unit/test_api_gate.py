"""The API's door without a model: keys in a real SQLite database, the request checks, OpenAI's error
shape, the /key chat command, the gate's refusals over ASGI (before anything reaches vLLM), and the
bad requests of tests/system/api/test_api.py, each answered by what its server calls."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry
from starlette.routing import Route, Router

from services.accounts.key_commands import run_key_command
from services.accounts.keys import KEY_MARK, ApiKeyStore, KeyHolder, key_hash
from services.accounts.store import AccountError, AccountStore
from services.admission.limits import user_key
from services.admission.service import Admission
from services.api.checks import check_request, parse_body
from services.api.errors import ApiError, normalize_error
from services.api.gate import ApiGate, ApiRoute, SharedAdmission
from services.api.metrics import ApiMetrics
from services.api.models import ModelsServer
from services.api.remote import RemoteApiServer
from services.api.server import OpenAiServer, model_name, vllm_args
from services.api.usage import AnswerMeter
from services.chat.commands import command_of, is_command
from services.config import Settings
from services.engine.load import EngineLoad
from services.history.database import create_engine
from services.history.migrations import migrate
from tests.conftest import TINY_MAX_MODEL_LEN

in_loop = pytest.mark.asyncio(loop_scope="module")
SETTINGS = Settings.from_env(
    {"API_MAX_MESSAGES": "4", "API_MAX_BODY_BYTES": "2000", "API_KEYS_PER_USER": "2"}
)
CHAT = "/v1/chat/completions"
# The API settings of tests/system/api/test_api.py's server, on a model folder named like its model.
API_SERVER = Settings.from_env({
    "MODEL": "/models/tiny-llama", "MAX_MODEL_LEN": str(TINY_MAX_MODEL_LEN), "API_MAX_MESSAGES": "64",
    "API_MAX_BODY_BYTES": "200000",
})  # fmt: skip
MODEL = "tiny-llama"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest_asyncio.fixture(loop_scope="module")
async def stores(tmp_path: Path) -> AsyncIterator[tuple[AccountStore, ApiKeyStore]]:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    accounts = AccountStore(engine)
    await accounts.add("admin", "admin password", "admin")
    await accounts.add("alice", "alice password")
    yield accounts, ApiKeyStore(engine, SETTINGS.api_keys_per_user)
    await engine.dispose()


@in_loop
async def test_keys_are_stored_hashed_listed_by_prefix_and_revoked(stores) -> None:
    _, keys = stores
    key = await keys.create("Alice")
    assert key.startswith(KEY_MARK) and len(key) >= 40
    holder = await keys.holder(key)
    assert holder is not None and holder.user == "alice" and holder.prefix == key[:12]
    async with keys.engine.connect() as connection:
        rows = (await connection.exec_driver_sql("SELECT prefix, key_hash FROM api_keys")).all()
    assert rows == [(key[:12], key_hash(key))], "only the prefix and the sha256 are kept"
    listed = await keys.list("alice")
    assert [k.prefix for k in listed] == [key[:12]] and listed[0].last_used_at is not None
    assert await keys.holder(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert await keys.holder("not-even-a-key") is None
    assert await keys.revoke("admin", key[:12]) == 0, "one person cannot revoke another's key"
    assert await keys.revoke("alice", key) == 1  # the whole key works as its prefix
    assert await keys.holder(key) is None and await keys.list("alice") == []
    assert len(await keys.list("alice", include_revoked=True)) == 1
    with pytest.raises(AccountError, match="prefix"):
        await keys.revoke("alice", "sk-")


@in_loop
async def test_keys_are_bounded_and_die_with_their_account(stores) -> None:
    accounts, keys = stores
    await accounts.add("carol", "carol password")
    first = await keys.create("carol")
    await keys.create("carol")
    with pytest.raises(AccountError, match="limit"):
        await keys.create("carol")
    with pytest.raises(AccountError, match="no account"):
        await keys.create("nobody")
    await accounts.remove("carol")
    assert await keys.holder(first) is None and await keys.list("carol") == []


@in_loop
async def test_the_key_command_in_chat(stores) -> None:
    _, keys = stores
    assert all(command_of(text).word == "/key" for text in (" /key new", "/key"))
    assert command_of("/keys are fun") is None
    assert is_command("/key list"), "a /key message is never replayed to the model on resume"
    made = await run_key_command(keys, "admin", "/key new", "http://127.0.0.1:8000")
    key = next(word.strip("`") for word in made.split() if word.strip("`").startswith(KEY_MARK))
    assert "shown only now" in made and "http://127.0.0.1:8000/v1/chat/completions" in made
    listed = await run_key_command(keys, "admin", "/key list", "")
    assert key[:12] in listed and key not in listed
    assert "Revoked" in await run_key_command(keys, "admin", f"/key revoke {key[:12]}", "")
    assert "None of your active keys" in await run_key_command(keys, "admin", f"/key revoke {key[:12]}", "")
    assert "/key new" in await run_key_command(keys, "admin", "/key frobnicate", "")
    assert "need sign-in" in await run_key_command(None, None, "/key new", "")


def test_checks_name_what_is_wrong() -> None:
    def refusal(body: bytes | dict, path: str = CHAT) -> ApiError:
        with pytest.raises(ApiError) as error:
            request = parse_body(body if isinstance(body, bytes) else json.dumps(body).encode(), 64)
            check_request(path, request, SETTINGS)
        return error.value

    assert refusal(b"{oops").code == "invalid_json" and refusal(b'"text"').code == "invalid_json"
    assert refusal(b"\xff\xfe").status == 400
    unknown = refusal({"messages": [], "foo": 1, "bar": 2})
    assert unknown.code == "unrecognized_argument" and "bar, foo" in str(unknown) and unknown.param == "bar"
    assert refusal({"messages": [], "priority": 0}).param == "priority"
    assert refusal({"messages": [{}] * 5}).code == "too_many_messages"
    assert refusal({"prompt": ["a"] * 5}, "/v1/completions").code == "too_many_prompts"
    assert refusal({"messages": [{"role": "user", "content": "Hi."}], "n": 2}).param == "n"
    # what vLLM itself declares passes (its extensions too), and n=1 is fine
    check_request(
        CHAT, {"model": "m", "messages": [{}] * 4, "n": 1, "top_k": 5, "ignore_eos": True}, SETTINGS
    )
    check_request("/v1/completions", {"prompt": "x", "echo": True, "logprobs": 2}, SETTINGS)


COMPLETIONS = "/v1/completions"
ONE_CHOICE = Settings.from_env({"API_MAX_CHOICES": "1"})


def refused_for(path: str, body: dict, settings: Settings = ONE_CHOICE) -> ApiError | None:
    try:
        check_request(path, body, settings)
    except ApiError as error:
        return error
    return None


@pytest.mark.parametrize("n", ["8", 8.0, "8.0", " 8 ", "8_0", 2, "2"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_n_counts_as_vllm_reads_it_whatever_its_json_type(path: str, n) -> None:
    """vLLM's request models coerce `"8"`, `8.0` and `"8.0"` to 8 (pydantic's lax mode): so does the gate."""
    body = {"messages": HELLO} if path == CHAT else {"prompt": "Once"}
    refusal = refused_for(path, {**body, "n": n})
    assert refusal is not None and refusal.param == "n" and refusal.code == "unsupported_value", n
    assert f"n={int(float(str(n).replace('_', '')))}" in str(refusal)


@pytest.mark.parametrize("n", [1, "1", 1.0, True, None, 0, -3, 8.5, "eight", [8]])
def test_n_that_is_one_or_that_vllm_refuses_itself_passes_the_gate(n) -> None:
    assert refused_for(CHAT, {"messages": HELLO, "n": n}) is None, n


@pytest.mark.parametrize(
    "prompt",
    [["a", "b"], [[1, 2], [3]], ["1", "2"]],
    ids=["texts", "token lists", "digit texts"],
)
def test_each_prompt_of_a_list_is_a_sequence_of_its_own(prompt) -> None:
    refusal = refused_for(COMPLETIONS, {"prompt": prompt})
    assert refusal is not None and refusal.code == "too_many_choices" and refusal.param == "prompt"
    assert "2 choices (2 prompts, n=1)" in str(refusal)
    with_embeds = refused_for(COMPLETIONS, {"prompt": "x", "prompt_embeds": ["AAAA"]})
    assert with_embeds is not None and with_embeds.code == "too_many_choices"


def test_one_prompt_in_any_form_is_one_sequence() -> None:
    for prompt in ("Once upon a time", [1, 2, 3], [[1, 2, 3]], ["Once"], [1, "2"]):
        assert refused_for(COMPLETIONS, {"prompt": prompt}) is None, prompt


def test_choices_are_n_times_the_prompts_up_to_the_limit() -> None:
    four = Settings.from_env({"API_MAX_CHOICES": "4"})
    assert refused_for(COMPLETIONS, {"prompt": ["a", "b"], "n": "2"}, four) is None
    beams = refused_for(COMPLETIONS, {"prompt": ["a", "b"], "n": "2.0", "use_beam_search": True}, four)
    assert beams is None, "2 x 2 is 4: within"
    refusal = refused_for(COMPLETIONS, {"prompt": ["a", "b", "c"], "n": 2.0}, four)
    assert refusal is not None and "6 choices (3 prompts, n=2)" in str(refusal)
    assert refused_for(CHAT, {"messages": HELLO, "n": "5"}, four) is not None
    assert refused_for(CHAT, {"messages": HELLO, "best_of": 8}, four).code == "unrecognized_argument"  # type: ignore[union-attr]


def test_errors_have_openai_shape() -> None:
    error = ApiError(429, "Slow down.", "rate_limited", retry_after_seconds=7.4)
    assert json.loads(error.body()) == {
        "error": {"message": "Slow down.", "type": "rate_limit_error", "param": None, "code": "rate_limited"}
    }
    assert (b"retry-after", b"7") in error.headers()
    assert (b"www-authenticate", b"Bearer") in ApiError(401, "No.").headers()


def test_model_name_is_the_folder_name_unless_set() -> None:
    assert model_name(Settings.from_env({"MODEL": "/models/Qwen3-4B/"})) == "Qwen3-4B"
    assert model_name(Settings.from_env({"MODEL": "org/model", "API_MODEL_NAME": "m"})) == "m"


@in_loop
async def test_the_gate_refuses_before_vllm(stores) -> None:
    """401 / 404 / 413 / 400 / 503 come from the gate: vLLM's state is not even built here."""
    _, keys = stores
    gate = ApiGate(SETTINGS, OpenAiServer(SETTINGS), ApiMetrics(CollectorRegistry()))
    gate.keys = keys
    key = await keys.create("admin")
    transport = httpx.ASGITransport(app=gate)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
        starting = await http.get("/v1/models")
        assert starting.status_code == 503 and starting.headers["retry-after"] == "10"
        gate.server.ready = True  # from here on, every answer is the gate's own refusal
        assert (await http.get("/v1/models")).json()["error"]["code"] == "missing_api_key"
        bad = await http.get("/v1/models", headers={"Authorization": "Bearer sk-vc-nope"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        auth = {"Authorization": f"Bearer {key}"}
        assert (await http.get("/v1/files", headers=auth)).status_code == 404
        wrong_method = await http.get(CHAT, headers=auth)
        assert wrong_method.status_code == 405 and "POST" in wrong_method.json()["error"]["message"]
        big = await http.post(CHAT, headers=auth, content=b"x" * 3000)
        assert big.status_code == 413 and "2,000 bytes" in big.json()["error"]["message"]
        chunked = await http.post(CHAT, headers=auth, content=chunks(b"x" * 1500, b"x" * 1500))
        assert chunked.status_code == 413, "a body without Content-Length is counted as it arrives"
        assert (await http.post(CHAT, headers=auth, json={"messages": [], "n": 5})).status_code == 400
    assert gate.metrics.requests.labels("/v1/models", "401")._value.get() == 2
    assert gate.metrics.requests.labels("other", "404")._value.get() == 1


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def test_the_api_route_takes_every_v1_path_and_nothing_else() -> None:
    route = ApiRoute(gate=None)  # type: ignore[arg-type]
    assert route.matches({"type": "http", "path": "/v1/chat/completions"})[0].name == "FULL"
    assert route.matches({"type": "http", "path": "/v1"})[0].name == "FULL"
    assert route.matches({"type": "http", "path": "/v10/x"})[0].name == "NONE"
    assert route.matches({"type": "http", "path": "/"})[0].name == "NONE"
    assert route.matches({"type": "websocket", "path": "/v1/x"})[0].name == "NONE"


def test_the_api_route_leaves_chainlits_named_routes_reachable() -> None:
    """In front of Chainlit's routes, it must not break `request.url_for("login")`, which Chainlit's
    OAuth callback uses to send a refused sign-in back to the login page."""
    router = Router([ApiRoute(gate=None), Route("/login", lambda request: None, name="login")])  # type: ignore[arg-type]
    assert router.url_path_for("login") == "/login"


def test_vllm_errors_are_put_in_openai_terms() -> None:
    error = {
        "message": "The model `x` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    vllm_404 = json.dumps({"error": error}).encode()
    assert json.loads(normalize_error(404, vllm_404))["error"] == {
        "message": "The model `x` does not exist.", "type": "not_found_error", "param": "model",
        "code": "model_not_found",
    }  # fmt: skip
    vllm_400 = (
        b'{"error": {"message": "too long", "type": "BadRequestError", "param": "max_tokens", "code": 400}}'
    )
    assert json.loads(normalize_error(400, vllm_400))["error"]["type"] == "invalid_request_error"
    assert json.loads(normalize_error(400, vllm_400))["error"]["code"] is None
    assert normalize_error(500, b"not json") == b"not json"


async def _metered(messages: list[dict]) -> AnswerMeter:
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    meter = AnswerMeter(send)
    for message in messages:
        await meter(message)
    assert sent == messages, "the meter passes every message on unchanged"
    return meter


def _start(content_type: bytes, status: int = 200) -> dict:
    return {"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]}


def _body(data: bytes, more: bool = True) -> dict:
    return {"type": "http.response.body", "body": data, "more_body": more}


@pytest.mark.asyncio
async def test_api_requests_pass_the_chat_admission_of_their_keys_owner() -> None:
    settings = Settings.from_env({"USER_MAX_CONCURRENT_TURNS": "1", "USER_TOKENS_PER_MINUTE": "1000"})
    admission = Admission(settings, EngineLoad(), max_running=64)
    api = SharedAdmission(admission, count_tokens=len)
    alice = KeyHolder("alice", "user", "sk-vc-alice")
    async with admission.turn(user_key("alice")):  # her chat answers
        with pytest.raises(ApiError) as refused:
            async with api.admit(alice, AnswerMeter(_discard)):
                pass
    assert refused.value.status == 429 and refused.value.code == "user_concurrent_turns"
    assert ("retry-after", "5") in [(k.decode(), v.decode()) for k, v in refused.value.headers()]
    answer = await _metered(
        [_start(b"application/json"), _body(b'{"usage": {"completion_tokens": 4}}', more=False)]
    )
    answer.request = {"messages": HELLO, "max_tokens": 8}
    async with api.admit(alice, answer) as admitted:
        assert admitted.priority is not None and admitted.priority >= settings.api_aging_seconds, "after chat"
        assert admitted.answer_tokens is None, "a request within every limit runs as it asked"
    assert admission.limits.usage(user_key("alice")).tokens_since(0) == 4, "her chat's budget"
    assert admission.status()["admitted_total"] == 1 and admission.line.engine_running == 0


async def _discard(message: dict) -> None:
    pass


@pytest.mark.asyncio
async def test_the_answer_meter_counts_streamed_text_and_trusts_vllms_usage() -> None:
    chars = len  # a stand-in tokenizer: one token per character
    chunk = b'data: {"choices": [{"delta": {"content": "%s"}}]}\n\n'
    split = chunk % b"de"
    stream = [
        _start(b"text/event-stream; charset=utf-8"),
        _body(chunk % b"abc"),
        _body(split[:20]),
        _body(split[20:]),
        _body(b"data: [DONE]\n\n", more=False),
    ]
    assert (await _metered(stream)).tokens(chars) == 5, "events split across messages are read whole"
    with_usage = [
        *stream[:2],
        _body(b'data: {"choices": [], "usage": {"completion_tokens": 9}}\n\n', more=False),
    ]
    assert (await _metered(with_usage)).tokens(chars) == 9
    whole = b'{"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 3}}'
    assert (
        await _metered([_start(b"application/json"), _body(whole[:30]), _body(whole[30:], more=False)])
    ).tokens(chars) == 3
    error = [_start(b"application/json", 400), _body(b'{"usage": {"completion_tokens": 50}}', more=False)]
    assert (await _metered(error)).tokens(chars) == 0, "an error carries no answer"


# tests/system/api/test_api.py's bad requests that the gate or vLLM's request validation answers
# (no engine needed); its system test keeps "body over the limit" and "unknown model".
BAD_INPUT = [
    # (name, body or raw bytes, status, error code or None, words in the message)
    ("malformed JSON", b'{"messages": [', 400, "invalid_json", "not valid JSON"),
    ("not an object", b"[1, 2]", 400, "invalid_json", "JSON object"),
    ("too many messages", {"model": MODEL, "messages": HELLO * 65}, 400, "too_many_messages", "at most 64"),
    ("n > 1", {"model": MODEL, "messages": HELLO, "n": 3}, 400, "unsupported_value", "n=3"),
    ("unsupported parameter", {"model": MODEL, "messages": HELLO, "frobnicate": 1}, 400,
     "unrecognized_argument", "frobnicate"),
    ("priority is the service's", {"model": MODEL, "messages": HELLO, "priority": -100}, 400,
     "unrecognized_argument", "priority"),
    ("no messages", {"model": MODEL}, 400, None, "messages"),
    ("messages not a list", {"model": MODEL, "messages": "hi"}, 400, None, "messages"),
    ("body over the limit", {"model": MODEL, "messages": [{"role": "user", "content": "x" * 250_000}]}, 413,
     "request_too_large", "200,000 bytes"),
]  # fmt: skip


@pytest.fixture(scope="module")
def api_server_args() -> argparse.Namespace:
    """vLLM's arguments for API_SERVER: what `OpenAiServer.start` puts in vLLM's app state first (its
    exception handlers read them), with the served model's name and context."""
    return vllm_args(API_SERVER)


@in_loop
@pytest.mark.parametrize(
    ("name", "body", "status", "code", "words"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT]
)
async def test_bad_input_gets_openai_errors(
    stores, api_server_args: argparse.Namespace, name: str, body, status: int, code: str | None, words: str
) -> None:
    """Through the gate and vLLM's own route function, request validation and exception handlers, as
    the server runs them, with vLLM's serving state left unbuilt (it needs an engine)."""
    _, keys = stores
    server = OpenAiServer(API_SERVER)
    server.app.state.args = api_server_args
    server.ready = True
    gate = ApiGate(API_SERVER, server, ApiMetrics(CollectorRegistry()), keys)
    headers = {"Authorization": f"Bearer {await keys.create('alice')}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://api") as http:
        if isinstance(body, bytes):
            response = await http.post(CHAT, content=body, headers=headers)
        else:
            response = await http.post(CHAT, json=body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}, error
    assert words in error["message"], error
    if code is not None:
        assert error["code"] == code


@in_loop
async def test_vllm_refuses_an_unknown_model_and_max_tokens_past_the_context(
    api_server_args: argparse.Namespace,
) -> None:
    """tests/system/api/test_api.py's "unknown model" and "max_tokens past the context": vLLM's serving
    state answers them, built over an engine there; here the same vLLM functions get the same
    requests, the served name and context from API_SERVER's arguments, and the gate's translation."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry
    from vllm.entrypoints.serve.engine.serving import BaseServing
    from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
    from vllm.exceptions import VLLMValidationError

    def answered(error) -> dict:  # vLLM's JSONResponse of an ErrorResponse, through the gate's send
        return json.loads(normalize_error(error.error.code, json.dumps(error.model_dump()).encode()))["error"]

    served = [
        BaseModelPath(name=name, model_path=api_server_args.model)
        for name in api_server_args.served_model_name
    ]
    serving = BaseServing(OpenAIModelRegistry(model_config=None, base_model_paths=served), model_config=None)  # type: ignore[arg-type]
    # what OpenAIServingChat.render_chat_request checks first
    unknown = await serving._check_model(
        ChatCompletionRequest.model_validate({"model": "gpt-9", "messages": HELLO})
    )
    assert unknown is not None and unknown.error.code == 404
    assert answered(unknown)["code"] == "model_not_found" and "gpt-9" in answered(unknown)["message"]
    assert (
        await serving._check_model(ChatCompletionRequest.model_validate({"model": MODEL, "messages": HELLO}))
        is None
    )
    # what vLLM's renderer does first with a chat request (preprocess_chat); its handlers answer the error
    too_long = ChatCompletionRequest.model_validate(
        {"model": MODEL, "messages": HELLO, "max_tokens": 100_000}
    )
    with pytest.raises(VLLMValidationError) as refused:
        too_long.build_tok_params(SimpleNamespace(max_model_len=api_server_args.max_model_len))  # type: ignore[arg-type]
    error = create_error_response(refused.value)
    assert error.error.code == 400 and refused.value.parameter == "max_tokens"
    assert (
        "max_model_len" in answered(error)["message"] and answered(error)["type"] == "invalid_request_error"
    )


@in_loop
async def test_the_models_list_names_no_path_on_the_server(api_server_args: argparse.Namespace) -> None:
    """vLLM's own listing (its registry, as init_app_state builds it) puts the model's folder in
    `root`; every kind of API server answers without it."""
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIModelRegistry

    folder = api_server_args.model
    assert folder == "/models/tiny-llama"
    server = OpenAiServer(API_SERVER)
    paths = [BaseModelPath(name=MODEL, model_path=folder)]
    server.app.state.openai_serving_models = OpenAIModelRegistry(
        model_config=SimpleNamespace(max_model_len=TINY_MAX_MODEL_LEN),  # type: ignore[arg-type]
        base_model_paths=paths,
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server.app), base_url="http://api"
    ) as http:
        listed = await http.get("/v1/models")
    assert listed.status_code == 200 and folder not in listed.text, listed.text
    [card] = listed.json()["data"]
    assert card["id"] == card["root"] == MODEL and card["max_model_len"] == TINY_MAX_MODEL_LEN

    several = ModelsServer(Settings.from_env({"MODELS": "/srv/models/tiny-a,/srv/models/tiny-b"}))
    several.models = [(name, SimpleNamespace(max_model_len=64)) for name in several.servers]  # type: ignore[assignment]
    assert "/srv" not in json.dumps(several.models_card())
    remote = RemoteApiServer(Settings.from_env({"ENGINE_URLS": "http://10.0.0.5:8000"}))
    remote.remote = SimpleNamespace(
        servers=[SimpleNamespace(models={"tiny": SimpleNamespace(id="/srv/tiny")})]
    )  # type: ignore[assignment]
    remote.models = SimpleNamespace(names=["tiny"], engine=lambda name: SimpleNamespace(max_model_len=64))  # type: ignore[assignment]
    assert [card["root"] for card in remote.models_card()["data"]] == ["tiny"]


def test_a_chat_template_error_is_one_log_line_not_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    """A bad chat_template_kwargs: transformers raises as vLLM applies the template, vLLM logs the
    traceback (then answers 400). The API's app puts the filter on that logger when it is built."""
    from vllm.renderers.hf import safe_apply_chat_template

    class Tokenizer:  # transformers' refusal of the request's arguments, as a real tokenizer raises it
        name_or_path = "tiny"

        def get_chat_template(self, chat_template: str, tools=None) -> str:
            return chat_template

        def apply_chat_template(self, conversation, tools=None, chat_template=None, tokenize=True, **kwargs):
            raise TypeError("apply_chat_template() got an unexpected value\nfor 'documents'")

    OpenAiServer(API_SERVER)  # builds the API's app, as the runtime does
    caplog.set_level(logging.INFO, logger="vllm.renderers.hf")
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(caplog.handler)  # vLLM's loggers do not propagate to the root's
    try:
        with pytest.raises(ValueError, match="unexpected value"):
            safe_apply_chat_template(
                None,  # type: ignore[arg-type]
                Tokenizer(),  # type: ignore[arg-type]
                [{"role": "user", "content": "Hi"}],
                chat_template="{{ messages }}{{ documents }}",
                tokenize=False,
                documents=5,
            )
    finally:
        vllm_logger.removeHandler(caplog.handler)
    [record] = [r for r in caplog.records if r.name == "vllm.renderers.hf"]
    assert record.exc_info is None and "Traceback" not in caplog.text
    assert (
        "(TypeError: apply_chat_template() got an unexpected value\\nfor 'documents')" in record.getMessage()
    )
    assert len(caplog.text.strip().splitlines()) == 1, caplog.text
