"""The deploy folder names only settings that exist, with values the app accepts (pure parsing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from services.config import Settings
from services.config.reference import OTHER_VARIABLES
from services.config.settings import SECTIONS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SETTING_NAMES = {
    f.metadata["env"] for section in SECTIONS for f in section.declared_in.__dataclass_fields__.values()
    if "env" in f.metadata
}  # fmt: skip
OTHER_NAMES = {name for names, _, _ in OTHER_VARIABLES for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", names)}
PLACEHOLDER = re.compile(r"\$\{[^}]*\}|\{\{[^}]*\}\}")


def compose_app_env() -> dict[str, str]:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    app = compose["services"]["app-1"]
    assert compose["services"]["app-2"]["environment"] == app["environment"], "replicas differ"
    return {name: str(value) for name, value in app["environment"].items()}


def helm_app_env() -> dict[str, str]:
    values = yaml.safe_load((DEPLOY / "helm" / "vllm-chat" / "values.yaml").read_text())
    template = (DEPLOY / "helm" / "vllm-chat" / "templates" / "deployment.yaml").read_text()
    named = dict.fromkeys(re.findall(r"name: ([A-Z][A-Z0-9_]+)", template), "x")
    named.update(dict.fromkeys(re.findall(r'"([A-Z][A-Z0-9_]+)"', template), "x"))
    named.update({"ENGINE_URLS": values["engine"]["url"], "ENGINE_ROUTER": str(values["engine"]["router"])})
    named["MODEL"] = values["engine"]["model"]
    return {**named, **{name: str(value) for name, value in values["settings"].items()}}


@pytest.mark.parametrize("env", [compose_app_env, helm_app_env], ids=["compose", "helm"])
def test_deploy_files_name_only_settings_that_exist_with_values_the_app_accepts(env) -> None:
    values = env()
    unknown = sorted(set(values) - SETTING_NAMES - OTHER_NAMES)
    assert not unknown, f"not settings of the app: {unknown}"
    own = {name: value for name, value in values.items() if name in SETTING_NAMES}
    filled = {name: PLACEHOLDER.sub("secret", value) for name, value in own.items()}
    filled["DATABASE_URL"] = "postgresql://chat:secret@postgres:5432/chat"
    settings = Settings.from_env(filled)  # raises on a value the app refuses
    assert settings.engine_router and settings.engine_url_list, "the replicas go through a router"


def test_the_balancer_checks_the_route_that_tells_readiness() -> None:
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert "GET /healthz" in config and "cookie CHAT_REPLICA" in config
    assert "CHAT_REPLICA" in (DEPLOY / "helm" / "vllm-chat" / "values.yaml").read_text()
