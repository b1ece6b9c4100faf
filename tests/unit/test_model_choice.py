"""Choosing a model: names from MODELS, a client's choice checked against what is served, the model a
stored conversation was answered by, and the settings that bound how many models one process holds."""

from __future__ import annotations

import json
from collections import deque

import pytest

from services.chat.model_choice import chat_for, choose, model_of_thread
from services.chat.session import ChatSession
from services.config import Settings, SettingsError
from services.config.engine import ENGINE_MODELS_MAX
from services.engine import SamplingSettings, UnknownModelError, model_names
from services.engine.models import model_settings

CHATS = {"tiny-a": "chat of a", "tiny-b": "chat of b"}


def session() -> ChatSession:
    return ChatSession("tab", SamplingSettings(0.2, 0.9, 16), "system", deque())


def test_no_choice_is_the_default_model() -> None:
    s = session()
    assert choose(CHATS, s, None) is None and s.model == "tiny-a"
    assert choose(CHATS, s, "") is None and chat_for(CHATS, s) == "chat of a"


def test_a_served_model_answers_the_conversation() -> None:
    s = session()
    assert choose(CHATS, s, "tiny-b") is None
    assert chat_for(CHATS, s) == "chat of b"


@pytest.mark.parametrize("requested", ["tiny-c", "TINY-A", "../tiny-a", "x" * 10_000, 7, ["tiny-a"]])
def test_a_model_that_is_not_served_is_refused_naming_the_served_ones(requested: object) -> None:
    s = session()
    refusal = choose(CHATS, s, requested)
    assert refusal is not None and "is not served here; served: tiny-a, tiny-b" in refusal
    assert len(refusal) < 300, "a huge name is not echoed whole"
    assert chat_for(CHATS, s, None) is None
    with pytest.raises(UnknownModelError):
        chat_for(CHATS, s)


def test_with_one_model_a_client_choice_is_ignored() -> None:
    s = session()
    assert choose({"": "only"}, s, "anything") is None and chat_for({"": "only"}, s) == "only"


def test_a_stored_conversation_names_the_model_of_its_newest_answer() -> None:
    steps = [
        {"type": "assistant_message", "metadata": json.dumps({"answer": True, "model": "tiny-a"})},
        {"type": "user_message", "metadata": "{}"},
        {"type": "assistant_message", "metadata": {"answer": True, "model": "tiny-b"}},
        {"type": "assistant_message", "metadata": "not json"},
    ]
    assert model_of_thread({"steps": steps}) == "tiny-b"
    assert model_of_thread({"steps": [{"metadata": {"model": 3}}]}) is None
    assert model_of_thread({}) is None


def test_models_are_named_by_their_folders() -> None:
    settings = Settings.from_env({"MODELS": "/m/tiny-a, /m/tiny-b/", "MAX_IN_PROCESS_MODELS": "2"})
    assert model_names(settings) == ["tiny-a", "tiny-b"]
    assert settings.model_path == "/m/tiny-a"
    each = model_settings(settings)
    assert [(name, s.model, s.models, s.api_model_name) for name, s in each] == [
        ("tiny-a", "/m/tiny-a", "", "tiny-a"), ("tiny-b", "/m/tiny-b/", "", "tiny-b"),
    ]  # fmt: skip
    one = Settings.from_env({"MODEL": "/m/tiny-a", "API_MODEL_NAME": "chat"})
    assert model_names(one) == ["chat"] and model_settings(one) == [("chat", one)]


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"MODELS": "/a,/b,/c"}, "MAX_IN_PROCESS_MODELS=2"),
        ({"MODELS": "/x/a,/y/a"}, "same folder name"),
        ({"MODELS": "/a,/b", "MODEL": "/a"}, "MODELS replaces MODEL"),
        (
            {
                "MODELS": ",".join(f"m{i}" for i in range(ENGINE_MODELS_MAX + 1)),
                "ENGINE_URLS": "http://h:8000",
            },
            f"at most {ENGINE_MODELS_MAX} with ENGINE_URLS",
        ),
        ({"MAX_IN_PROCESS_MODELS": "0"}, "at least 1"),
    ],
)
def test_settings_bound_the_models_one_process_holds(env: dict[str, str], said: str) -> None:
    with pytest.raises(SettingsError, match=said):
        Settings.from_env(env)
