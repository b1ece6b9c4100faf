"""Token budgets and per-minute tokens on a real server (tiny model, SQLite, API_MAX_CHOICES=8): a
/v1 request for many sequences of many tokens, with little left, is cut to fit or refused, and the
usage the ledger keeps afterwards stays within the budget; the number fields drawn in every JSON
form against the real engine get no server error.

The bounds: token-id prompts are counted exactly, so the ledger holds at most the budget; a text
prompt's chat template and special tokens are not counted before it runs, so with text prompts the
ledger holds at most the budget plus those prompts' tokens. Each person here is the test's own."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from harness.server import ROOT, AppServer
from tests.conftest import ServerPool, pooled, tiny_server_env
from tests.system.conftest import accounts
from tests.system.helpers import data_dir
from tests.system.security.fuzzing import ServerLog, fuzz_settings

# a server of its own (small budgets): per commit, tests/unit/test_token_budgets.py holds the same
# requests, the /v1 number fields fuzzed, against the gate and admission
pytestmark = pytest.mark.long

MODEL = "tiny-llama"
CHOICES = 8
TOKENS_PER_MINUTE = 800
FLUSH_SECONDS = 1  # the server's USAGE_FLUSH_SECONDS
FLUSH_BOUND_SECONDS = FLUSH_SECONDS + 20  # plus slack for a busy machine: only says when to give up


@pooled
def budgets_server(server_pool: ServerPool, tiny_model_dir: Path) -> AppServer:
    """A tiny server whose API runs up to CHOICES sequences a request and writes usage every second."""
    env = {
        **tiny_server_env(tiny_model_dir),
        "API_MAX_CHOICES": str(CHOICES),
        "USER_TOKENS_PER_MINUTE": str(TOKENS_PER_MINUTE),
        "USAGE_FLUSH_SECONDS": str(FLUSH_SECONDS),
    }
    return server_pool.get(env, "api-budgets-server")


def usage_command(server: AppServer, *args: str) -> str:
    """`python -m services.usage ...` on the server's database, as an operator runs it."""
    env = {**os.environ, "DATA_DIR": str(data_dir(server))}
    done = subprocess.run([sys.executable, "-m", "services.usage", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    return done.stdout


def new_person(server: AppServer, day_budget: int) -> tuple[str, dict[str, str]]:
    """A person of role user with `day_budget` tokens a day: their name and API headers."""
    name = f"budget-{uuid.uuid4().hex[:8]}"
    accounts(data_dir(server), "add", name, "--generate")
    usage_command(server, "quota", "set", name, "--day", str(day_budget))
    key = accounts(data_dir(server), "key", "create", name).stdout.split()[0]
    return name, {"Authorization": f"Bearer {key}"}


def ledger_tokens(server: AppServer, name: str, at_least: int) -> int:
    """The person's prompt + answer tokens today as the ledger wrote them, once it holds at least
    `at_least` (what the answers reported: each is counted when it ends, written within a flush)."""
    deadline = time.monotonic() + FLUSH_BOUND_SECONDS
    while True:
        rows = list(csv.DictReader(io.StringIO(usage_command(server, "show", "--user", name, "--csv"))))
        written = int(rows[0]["prompt_tokens"]) + int(rows[0]["answer_tokens"]) if rows else 0
        if written >= at_least:
            return written
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)


def reported(usages: list[dict]) -> int:
    """Prompt + answer tokens the answers' `usage` reported."""
    return sum(usage["prompt_tokens"] + usage["completion_tokens"] for usage in usages)


def refusal_problem(response: httpx.Response) -> str | None:
    """Why a refusal is not OpenAI's error shape, or a 429 comes without Retry-After."""
    try:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and isinstance(error["type"], str) and "code" in error
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{response.status_code} without an OpenAI error: {response.text[:300]}"
    if response.status_code == 429 and not response.headers.get("retry-after", "").isdigit():
        return "a 429 without Retry-After"
    return None


def test_many_sequences_with_little_left_are_cut_to_the_budget(budgets_server: AppServer) -> None:
    """8 sequences x 1,000 tokens asked with 300 left: each answer is cut to (300 - 8) // 8 = 36, the
    next request is refused, and the ledger holds 296 tokens, within the budget."""
    name, headers = new_person(budgets_server, 300)
    body = {"model": MODEL, "prompt": [[1, 2, 3, 4], [5, 6, 7, 8]], "n": "4", "max_tokens": 1000,
            "ignore_eos": True}  # fmt: skip
    url = budgets_server.base_url + "/v1/completions"
    cut = httpx.post(url, json=body, headers=headers, timeout=120)
    assert cut.status_code == 200, cut.text
    answer = cut.json()
    assert len(answer["choices"]) == 8 and {c["finish_reason"] for c in answer["choices"]} == {"length"}
    assert answer["usage"]["prompt_tokens"] == 8 and answer["usage"]["completion_tokens"] == 8 * 36
    refused = httpx.post(url, json=body, headers=headers, timeout=120)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "quota_day", refused.text
    assert refusal_problem(refused) is None
    assert ledger_tokens(budgets_server, name, at_least=296) == 296 <= 300


def test_requests_sent_at_once_share_what_is_left(budgets_server: AppServer) -> None:
    """Two chat requests for 4 sequences with no answer limit (up to the context each), sent at once
    with 400 left: the first is cut to 4 x 99, what it holds (or then used) leaves the second nothing,
    and the ledger stays within the budget plus the prompt (its template's tokens are not counted
    before it runs)."""
    name, headers = new_person(budgets_server, 400)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell a story."}], "n": 4,
            "ignore_eos": True}  # fmt: skip

    async def both() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=budgets_server.base_url, headers=headers, timeout=120) as http:
            return list(await asyncio.gather(*[http.post("/v1/chat/completions", json=body) for _ in "ab"]))

    responses = asyncio.run(both())
    ran = [r.json()["usage"] for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code != 200]
    assert len(ran) == 1 and [r.json()["error"]["code"] for r in refused] == ["quota_day"], refused
    assert refusal_problem(refused[0]) is None
    assert ran[0]["completion_tokens"] == 4 * 99, "(400 - the 4 tokens of the text) // 4"
    assert ledger_tokens(budgets_server, name, at_least=reported(ran)) <= 400 + ran[0]["prompt_tokens"]


def test_many_sequences_share_the_minute(budgets_server: AppServer) -> None:
    """USER_TOKENS_PER_MINUTE=800: 8 sequences of 2,000 are cut to 100 each; the minute is then full."""
    _, headers = new_person(budgets_server, 1_000_000)
    body = {"model": MODEL, "prompt": [1, 2, 3], "n": 8, "max_tokens": 2000, "ignore_eos": True}
    url = budgets_server.base_url + "/v1/completions"
    cut = httpx.post(url, json=body, headers=headers, timeout=120)
    assert cut.status_code == 200 and cut.json()["usage"]["completion_tokens"] == 8 * 100, cut.text
    refused = httpx.post(url, json={**body, "n": 1, "max_tokens": 1}, headers=headers, timeout=120)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "user_tokens_per_minute"
    assert refusal_problem(refused) is None and int(refused.headers["retry-after"]) <= 61


NUMBERS = st.one_of(
    st.integers(-2, 3000),
    st.integers(2**31, 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["8", "8.0", "1e3", "8_0", " 8 ", "-1", "", "NaN", "Infinity", True, False, None, [8]]),
)
FIELDS = {name: NUMBERS for name in ("n", "max_tokens", "min_tokens", "temperature", "top_p", "logprobs")}
PROMPTS = st.one_of(
    st.just("Once upon a time"),
    st.lists(st.integers(0, 500), max_size=6),
    st.lists(st.sampled_from(["a", "b c", "8"]), max_size=4),
    st.lists(st.lists(st.integers(0, 500), max_size=3), max_size=4),
    NUMBERS,
)
BODIES = st.one_of(
    st.tuples(st.just("/v1/completions"), st.fixed_dictionaries({"prompt": PROMPTS}, optional=FIELDS)),
    st.tuples(
        st.just("/v1/chat/completions"),
        st.fixed_dictionaries(
            {"messages": st.just([{"role": "user", "content": "Hi."}])},
            optional={**FIELDS, "max_completion_tokens": NUMBERS, "best_of": NUMBERS},
        ),
    ),
)
FUZZ_BUDGET = 2000


def test_number_fields_in_every_form_never_pass_the_budget(budgets_server: AppServer) -> None:
    """Whatever form `n`, `max_tokens` and the other numbers take (strings, floats, bools, huge,
    NaN), and whatever the prompt list holds: no server error and no traceback, every refusal in
    OpenAI's shape, and the ledger within the person's budget plus the prompts' tokens."""
    name, headers = new_person(budgets_server, FUZZ_BUDGET)
    log = ServerLog(budgets_server.log_path)
    mark = log.mark()
    ran: list[dict] = []

    @fuzz_settings()
    @given(request=BODIES)
    @example(request=("/v1/completions", {"prompt": [[1, 2]] * 4, "n": "2.0", "max_tokens": "1e3"}))
    @example(request=("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi."}], "n": 8}))
    def one(request: tuple[str, dict]) -> None:
        path, body = request
        content = json.dumps({"model": MODEL, **body})  # NaN and Infinity as Python writes them
        sent = {**headers, "Content-Type": "application/json"}
        response = httpx.post(budgets_server.base_url + path, content=content, headers=sent, timeout=120)
        assert response.status_code < 500, (request, response.text[:300])
        if response.status_code == 200:
            ran.append(response.json()["usage"])
        else:
            assert refusal_problem(response) is None, (request, response.text[:300])

    one()
    assert not log.problems_since(mark), log.problems_since(mark)
    prompts = sum(usage["prompt_tokens"] for usage in ran)
    assert sum(usage["completion_tokens"] for usage in ran) <= FUZZ_BUDGET
    assert ledger_tokens(budgets_server, name, at_least=reported(ran)) <= FUZZ_BUDGET + prompts
