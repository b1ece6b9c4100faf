"""The edge's rules as pure logic: how deep a JSON body may nest, who may read the operators' routes."""

from __future__ import annotations

import json

import pytest

from services.api.checks import JsonTooDeep, parse_json
from services.config import Settings, SettingsError
from services.observability.ops_access import operator_refusal, require_ops_token

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_parse_json_bounds_the_nesting() -> None:
    assert parse_json(b'{"a": [1, {"b": [2]}]}', max_depth=4) == {"a": [1, {"b": [2]}]}
    with pytest.raises(JsonTooDeep):
        parse_json(b'{"a": [1, {"b": [2]}]}', max_depth=3)
    with pytest.raises(JsonTooDeep):
        parse_json(DEEP, max_depth=64)
    with pytest.raises(ValueError):
        parse_json(b"{not json", max_depth=64)
    assert parse_json(json.dumps([[]] * 10_000).encode(), max_depth=2) == [[]] * 10_000


def test_a_public_bind_needs_an_ops_token() -> None:
    plain = Settings.from_env({})
    require_ops_token(plain, "127.0.0.1")
    require_ops_token(plain, "::1")
    require_ops_token(Settings.from_env({"OPS_TOKEN": "t"}), "0.0.0.0")
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        with pytest.raises(SettingsError, match="OPS_TOKEN"):
            require_ops_token(plain, host)


def test_operators_are_token_holders_or_direct_local_callers() -> None:
    assert operator_refusal("t", "Bearer t", "10.0.0.5", {}) is None
    assert operator_refusal("t", "Bearer wrong", "127.0.0.1", {})[0] == 401
    assert operator_refusal("t", "t", "127.0.0.1", {})[0] == 401
    assert operator_refusal("", "", "127.0.0.1", {}) is None
    assert operator_refusal("", "", "10.0.0.5", {})[0] == 403
    assert operator_refusal("", "", "127.0.0.1", {"x-forwarded-for": "10.0.0.5"})[0] == 403, "a local proxy"
