"""Size rules without a server: a message rebuilt as the page sends it, chat settings of the offered
kinds, a body limit or a guard for every route (on a real server: tests/system/security/test_sizes.py).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from harness.chat_client import user_message_payload
from services.web.body_limit import limits_by_route
from services.web.client_messages import MessageRefused, SocketRules, kept_settings, page_message

# --- the rules, without a server --------------------------------------------------------------------
RULES = SocketRules(
    max_message_chars=10, max_files=2, chat_settings={"temperature": float, "system_prompt": str}
)


def test_a_message_is_rebuilt_as_the_page_sends_it() -> None:
    sent = user_message_payload("hi", [str(uuid.uuid4())])
    sent["message"].update(type="assistant_message", metadata={"answer": True, "location": "http://x/"},
                           parentId="p", command="c", modes={"a": "b"}, name="vLLM Chat")  # fmt: skip
    rebuilt = page_message(sent, RULES, "alice")["message"]
    assert rebuilt["type"] == "user_message" and rebuilt["name"] == "alice"
    assert rebuilt["metadata"] == {"location": "http://x/"}
    assert not {"parentId", "command", "modes", "language"} & set(rebuilt)
    for bad in (
        "not a dict",
        {"message": "x"},
        user_message_payload("x" * 11),
        {**user_message_payload("hi"), "fileReferences": [{"id": "../../etc"}]},
        {**user_message_payload("hi"), "fileReferences": [{"id": str(uuid.uuid4())} for _ in range(3)]},
        {"message": {**user_message_payload("hi")["message"], "id": str(uuid.uuid1())}},
        {"message": {**user_message_payload("hi")["message"], "output": ["a"]}},
    ):
        with pytest.raises(MessageRefused):
            page_message(bad, RULES, "alice")


def test_chat_settings_keep_the_offered_keys_with_values_of_their_kind() -> None:
    values = {"temperature": 0.4, "top_p": 0.5, "system_prompt": "x" * 11, "evil": "e", 3: 1}
    assert kept_settings(values, RULES) == {"temperature": 0.4}
    assert kept_settings({"temperature": True, "system_prompt": "short"}, RULES) == {"system_prompt": "short"}
    assert kept_settings({"temperature": float("nan")}, RULES) == {}
    assert kept_settings(["temperature"], RULES) == {}


def test_each_route_has_a_body_limit_or_a_guard_of_its_own() -> None:
    limit_for = limits_by_route(1000, 5000, "/project/file", api_served=True)

    def scope(method: str, path: str, root: str = "") -> dict[str, Any]:
        return {"type": "http", "method": method, "path": root + path, "root_path": root}

    assert limit_for(scope("PUT", "/project/thread")) == 1000
    assert limit_for(scope("GET", "/anything/at/all")) == 1000
    assert limit_for(scope("POST", "/ws/socket.io/", root="/chat")) == 5000, "one event, as engine.io reads"
    assert limit_for(scope("PUT", "/project/file")) == 1000, "only the upload itself has the upload's limit"
    assert limit_for(scope("POST", "/project/file")) is None, "UploadSizeGuard: MAX_UPLOAD_BYTES"
    assert limit_for(scope("POST", "/v1/chat/completions")) is None, "ApiGate: API_MAX_BODY_BYTES"
    assert limits_by_route(1000, 5000, "/project/file", api_served=False)(scope("POST", "/v1/x")) == 1000
