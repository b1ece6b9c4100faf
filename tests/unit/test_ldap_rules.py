"""LDAP sign-in rules that need no directory: which names may be looked up, how a name is escaped
into a DN and a filter, and which settings stop the app at start."""

from __future__ import annotations

import asyncio

import pytest
from ldap3.utils.dn import parse_dn

from harness.server import free_port
from services.accounts.ldap_directory import (
    LdapDirectory,
    directory_name,
    membership_filter,
    user_dn,
    user_filter,
)
from services.config import Settings, SettingsError

BASE = "ou=people,dc=example,dc=org"
TEMPLATE = f"uid={{username}},{BASE}"
GOOD = {"AUTH_MODE": "ldap", "LDAP_URL": "ldap://127.0.0.1:389", "LDAP_USER_DN_TEMPLATE": TEMPLATE}


@pytest.mark.parametrize(
    "hostile",
    ["*", ")(uid=*", "admin,ou=x", "a=b", "al\\ice", "al ice", "al\x00ice", "al+ice", "", " ", "(", "#x",
     "x" * 65, "ål", "-x"],
)  # fmt: skip
def test_names_that_could_change_a_dn_or_a_filter_are_refused(hostile: str) -> None:
    assert directory_name(hostile) is None


@pytest.mark.parametrize(
    ("typed", "name"),
    [
        ("Alice", "alice"),
        (" bob ", "bob"),
        ("Ann@Example.COM", "ann@example.com"),
        ("j.doe-2_x", "j.doe-2_x"),
    ],
)
def test_ordinary_names_are_looked_up_lower_case(typed: str, name: str) -> None:
    assert directory_name(typed) == name


@pytest.mark.parametrize("value", ["admin,ou=x", "a+b=c", "x\\", '"q"', "#start", " lead", "<>;"])
def test_a_name_stays_one_rdn_value_in_the_dn(value: str) -> None:
    """Even a name the pattern would refuse cannot add an RDN or change the base (escape_rdn)."""
    dn = user_dn(TEMPLATE, value)
    parts = parse_dn(dn)
    assert len(parts) == 4 and parts[0][0] == "uid", dn
    assert dn.endswith("," + BASE)


def test_a_name_in_a_filter_is_a_literal_value() -> None:
    assert user_filter("(uid={username})", "*)(uid=*") == r"(uid=\2a\29\28uid=\2a)"
    assert (
        user_filter("(&(objectClass=person)(mail={username}))", "a\\b")
        == r"(&(objectClass=person)(mail=a\5cb))"
    )


def test_the_membership_filter_escapes_the_dn_and_the_name() -> None:
    dn = user_dn(TEMPLATE, "x,y")
    found = membership_filter(dn, "a*")
    assert found == (
        r"(|(member=uid=x\5c,y,ou=people,dc=example,dc=org)(uniqueMember=uid=x\5c,y,ou=people,dc=example,dc=org)"
        r"(memberUid=a\2a))"
    )


def test_an_empty_password_never_reaches_the_directory() -> None:
    """Nothing listens on the port: had the directory been asked, it would say it is unavailable."""
    settings = Settings.from_env({**GOOD, "LDAP_URL": f"ldap://127.0.0.1:{free_port()}"})
    assert asyncio.run(LdapDirectory(settings).authenticate("alice", "")) is None


def test_good_settings_are_accepted() -> None:
    settings = Settings.from_env(GOOD)
    assert settings.auth_mode == "ldap" and settings.ldap_timeout_seconds == 5.0
    search = {**GOOD, "LDAP_USER_DN_TEMPLATE": "", "LDAP_USER_SEARCH_BASE": BASE, "LDAP_START_TLS": "true",
              "LDAP_BIND_DN": "cn=reader,dc=example,dc=org", "LDAP_BIND_PASSWORD": "x",
              "LDAP_ADMIN_GROUP_DN": "cn=admins,ou=groups,dc=example,dc=org"}  # fmt: skip
    assert Settings.from_env(search).ldap_start_tls


def test_ldap_settings_are_not_checked_in_other_modes() -> None:
    assert Settings.from_env({"LDAP_URL": "nonsense"}).ldap_url == "nonsense"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"LDAP_URL": ""}, "AUTH_MODE=ldap needs LDAP_URL"),
        ({"LDAP_URL": "http://dir"}, "AUTH_MODE=ldap needs LDAP_URL"),
        ({"LDAP_URL": "ldap://"}, "AUTH_MODE=ldap needs LDAP_URL"),
        ({"LDAP_URL": "ldaps://dir", "LDAP_START_TLS": "true"}, "LDAP_START_TLS=true is for ldap://"),
        ({"LDAP_BIND_DN": "cn=reader,dc=x"}, "LDAP_BIND_DN and LDAP_BIND_PASSWORD are set together"),
        ({"LDAP_BIND_PASSWORD": "x"}, "LDAP_BIND_DN and LDAP_BIND_PASSWORD are set together"),
        ({"LDAP_USER_DN_TEMPLATE": ""}, "one way to find a person's entry"),
        ({"LDAP_USER_SEARCH_BASE": BASE}, "one way to find a person's entry"),
        ({"LDAP_USER_DN_TEMPLATE": f"uid=x,{BASE}"}, "must contain {username} once"),
        ({"LDAP_USER_DN_TEMPLATE": "uid={username},cn={username}"}, "must contain {username} once"),
        ({"LDAP_USER_DN_TEMPLATE": "", "LDAP_USER_SEARCH_BASE": BASE}, "needs LDAP_BIND_DN"),
        ({"LDAP_USER_DN_TEMPLATE": "", "LDAP_USER_SEARCH_BASE": BASE, "LDAP_BIND_DN": "cn=r,dc=x",
          "LDAP_BIND_PASSWORD": "x", "LDAP_USER_FILTER": "uid={username}"}, "LDAP_USER_FILTER must be"),
        ({"LDAP_USER_DN_TEMPLATE": "{username}"}, "LDAP_USER_DN_TEMPLATE='{username}' is not a DN"),
        ({"LDAP_ADMIN_GROUP_DN": "admins"}, "LDAP_ADMIN_GROUP_DN='admins' is not a DN"),
        ({"LDAP_CA_FILE": "/nonexistent/ca.pem"}, "LDAP_CA_FILE='/nonexistent/ca.pem' cannot be read"),
        ({"LDAP_TIMEOUT_SECONDS": "0"}, "LDAP_TIMEOUT_SECONDS='0' must be at least 0.1"),
    ],
)  # fmt: skip
def test_bad_ldap_settings_stop_the_start_with_what_to_fix(changes: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as error:
        Settings.from_env({**GOOD, **changes})
    assert message in str(error.value)


def test_the_bind_password_is_redacted_in_the_start_up_log() -> None:
    env = {**GOOD, "LDAP_BIND_DN": "cn=reader,dc=example,dc=org", "LDAP_BIND_PASSWORD": "s3cret-reader"}
    changed = Settings.from_env(env).non_default()
    assert changed["LDAP_BIND_PASSWORD"] == "***" and changed["LDAP_BIND_DN"] == "cn=reader,dc=example,dc=org"
