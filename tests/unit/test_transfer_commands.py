"""The chat commands of export, import and sharing never reach the model (live or on resume), and
only the import route gets IMPORT_MAX_BYTES as its body limit."""

from __future__ import annotations

import pytest

from services.chat.commands import is_command
from services.history.resume import history_from_steps
from services.web.transfer_routes import IMPORT_PATH, MULTIPART_OVERHEAD_BYTES, with_import_limit


@pytest.mark.parametrize("text", ["/export", " /import ", "/share", "/share revoke", "/key list", "/stats"])
def test_commands_are_not_the_models(text: str) -> None:
    assert is_command(text)


@pytest.mark.parametrize("text", ["/exported files?", "share /share", "", "export"])
def test_other_messages_are(text: str) -> None:
    assert not is_command(text)


def test_a_resumed_conversation_leaves_the_commands_out() -> None:
    steps = [{"type": "user_message", "output": "/share"}, {"type": "user_message", "output": "Hello"}]
    assert history_from_steps(steps, 1000) == [{"role": "user", "content": "Hello"}]


def test_only_the_import_route_gets_the_import_limit() -> None:
    limit = with_import_limit(lambda scope: 1024, 10_000)
    assert limit({"path": IMPORT_PATH, "method": "POST"}) == 10_000 + MULTIPART_OVERHEAD_BYTES
    assert limit({"path": IMPORT_PATH, "method": "GET"}) == 1024
    assert limit({"path": "/project/threads", "method": "POST"}) == 1024
