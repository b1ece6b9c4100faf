"""Settings parsing and validation (pure logic)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config import Settings, SettingsError
from services.config.settings import settings_table


def test_defaults_need_no_environment() -> None:
    settings = Settings.from_env({})
    assert settings.model == ""
    assert settings.model_path.endswith("SmolLM2-135M-Instruct")
    assert settings.enable_prefix_caching and settings.enforce_eager


def test_values_are_parsed_by_type() -> None:
    settings = Settings.from_env(
        {"MAX_MODEL_LEN": "2048", "TOP_P": "0.5", "ENFORCE_EAGER": "false", "MODEL": "/models/x"}
    )
    assert (settings.max_model_len, settings.top_p, settings.enforce_eager) == (2048, 0.5, False)
    assert settings.model_path == "/models/x"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"MAX_MODEL_LEN": "abc"}, "MAX_MODEL_LEN='abc' is not a whole number"),
        ({"TEMPERATURE": "hot"}, "TEMPERATURE='hot' is not a number"),
        ({"ENFORCE_EAGER": "maybe"}, "ENFORCE_EAGER='maybe' is not a boolean"),
        ({"MAX_SESSIONS": "0"}, "MAX_SESSIONS='0' must be at least 1"),
        ({"VLLM_CPU_KVCACHE_SPACE": ""}, "VLLM_CPU_KVCACHE_SPACE='' is not a whole number"),
        ({"MAX_NEW_TOKENS": "5000"}, "exceeds MAX_NEW_TOKENS_LIMIT"),
        ({"MAX_NEW_TOKENS": "512", "MAX_MODEL_LEN": "512"}, "leaves no room for a prompt"),
        ({"TOP_P": "1.5"}, "TOP_P=1.5 must be at most 1"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env(env)


def test_non_default_redacts_secrets_only() -> None:
    settings = Settings.from_env({"MAX_NUM_BATCHED_TOKENS": "4096", "MAX_SESSIONS": "5"})
    assert settings.non_default() == {"MAX_NUM_BATCHED_TOKENS": 4096, "MAX_SESSIONS": 5}


def test_settings_table_lists_every_variable() -> None:
    table = settings_table()
    for name in ("MODEL", "MAX_MODEL_LEN", "SESSION_TTL_SECONDS", "VLLM_CPU_KVCACHE_SPACE"):
        assert f"`{name}`" in table


def test_the_readme_lists_every_setting_as_generated() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert settings_table() in readme, "regenerate it: python -m services.config.settings"
