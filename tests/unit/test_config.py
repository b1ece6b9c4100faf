"""Settings parsing and validation (pure logic)."""

from __future__ import annotations

import dataclasses

import pytest

from services.config import Settings, SettingsError
from services.config.fields import TIERS
from services.config.reference import README_FILE, REFERENCE_FILE, essential_table, settings_reference
from services.config.settings import RETIRED_SETTINGS, SECTIONS
from services.config.transfer import TransferSettings


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


def test_every_setting_has_a_tier_and_a_section() -> None:
    in_sections = [f.name for section in SECTIONS for f in dataclasses.fields(section.declared_in)]
    assert sorted(in_sections) == sorted(f.name for f in dataclasses.fields(Settings))
    assert {f.metadata["tier"] for f in dataclasses.fields(Settings)} <= set(TIERS)


def test_a_deployer_needs_to_know_about_ten_settings() -> None:
    essential = [f.metadata["env"] for f in dataclasses.fields(Settings) if f.metadata["tier"] == "essential"]
    assert {"MODEL", "AUTH_MODE", "DATABASE_URL", "OPS_TOKEN", "ENGINE_URLS"} <= set(essential)
    assert len(essential) <= 12, "the README's table is for what a deployer must decide"


def test_the_reference_lists_every_variable_once() -> None:
    reference = settings_reference(SECTIONS)
    for f in dataclasses.fields(Settings):
        assert reference.count(f"| `{f.metadata['env']}` |") == 1, f.metadata["env"]


def test_docs_settings_md_is_the_generated_reference() -> None:
    assert REFERENCE_FILE.read_text() == settings_reference(SECTIONS), (
        "regenerate it: python -m services.config.settings"
    )


def test_the_readme_lists_the_essential_settings_as_generated() -> None:
    assert essential_table(SECTIONS) in README_FILE.read_text(), (
        "regenerate it: python -m services.config.settings"
    )


def test_the_readme_names_every_import_limit() -> None:
    """Import limits are what stands between one person's file and everyone's database: a deployer
    finds each of them in the README, beyond the essential table (which has no room for them)."""
    limits = [f.metadata["env"] for f in dataclasses.fields(TransferSettings) if f.name.startswith("import_")]
    assert len(limits) == 11
    readme = README_FILE.read_text()
    assert [env for env in limits if f"`{env}`" not in readme] == []


def test_diagnostics_are_off_unless_asked_for() -> None:
    settings = Settings.from_env({"DATA_DIR": "/srv/chat"})
    assert (settings.engine_memory_probe_dir, settings.app_memory_probe_dir) == ("", "")


def test_diagnostics_memory_runs_both_probes_as_their_knobs_defaulted() -> None:
    settings = Settings.from_env({"DIAGNOSTICS": "memory", "DATA_DIR": "/srv/chat"})
    assert settings.engine_memory_probe_dir == settings.app_memory_probe_dir == "/srv/chat/diagnostics"
    engine = (settings.engine_memory_probe_seconds, settings.engine_memory_probe_frames)
    app = (
        settings.app_memory_probe_seconds,
        settings.app_memory_probe_frames,
        settings.app_memory_probe_deep,
    )
    assert (engine, app) == ((0.0, 16), (600.0, 0, False))


def test_diagnostics_counters_never_trace_and_all_traces_everything() -> None:
    counters = Settings.from_env({"DIAGNOSTICS": "counters", "DIAGNOSTICS_DIR": "/tmp/probe"})
    assert counters.engine_memory_probe_dir == "/tmp/probe"
    assert counters.engine_memory_probe_frames == counters.app_memory_probe_frames == 0
    everything = Settings.from_env({"DIAGNOSTICS": "all"})
    assert everything.app_memory_probe_frames > 0 and everything.app_memory_probe_deep
    assert everything.engine_memory_probe_seconds > 0


def test_an_unknown_diagnostics_level_is_refused() -> None:
    with pytest.raises(SettingsError, match="DIAGNOSTICS='verbose' is not one of off, counters, memory, all"):
        Settings.from_env({"DIAGNOSTICS": "verbose"})


def test_a_retired_setting_still_set_is_named_and_a_current_one_is_not() -> None:
    assert Settings.retired_in({"LOOP_GUARD_MIN_REPEATS": "4", "MAX_SESSIONS": "10"}) == [
        "LOOP_GUARD_MIN_REPEATS"
    ]
    current = {f.metadata["env"] for f in dataclasses.fields(Settings)}
    assert not current & set(RETIRED_SETTINGS), "a retired name is a setting again"
