"""The directory side of LDAP sign-in, in process, against a real slapd (tests/conftest.py `slapd`):
both ways of finding a person (DN template, search-then-bind), the three group shapes, what is
refused before any bind, the attempt limits, and a directory that is down. The server-level tests
are in test_ldap_sign_in.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from harness.slapd import ADMINS_GROUP, GROUPS, PEOPLE, READER_DN, Slapd, binds_of, user_dn
from services.accounts.ldap_directory import DirectoryUnavailable, LdapDirectory
from services.accounts.ldap_sign_in import LdapSignIn
from services.accounts.limits import SignInLimiter
from services.accounts.shared_attempts import SignInAttempts
from services.accounts.store import AccountStore
from services.config import Settings
from services.history.database import create_engine
from services.history.migrations import migrate
from tests.conftest import LDAP_PEOPLE, LDAP_READER_PASSWORD

in_loop = pytest.mark.asyncio(loop_scope="module")


def settings(directory: Slapd, how: str = "template", **changes: str) -> Settings:
    env = {"AUTH_MODE": "ldap", "LDAP_URL": directory.url, "LDAP_ADMIN_GROUP_DN": ADMINS_GROUP,
           "LDAP_BIND_DN": READER_DN, "LDAP_BIND_PASSWORD": LDAP_READER_PASSWORD}  # fmt: skip
    if how == "template":
        env["LDAP_USER_DN_TEMPLATE"] = f"uid={{username}},{PEOPLE}"
    else:
        env["LDAP_USER_SEARCH_BASE"] = PEOPLE
    return Settings.from_env({**env, **changes})


def new_person(directory: Slapd) -> tuple[str, str]:
    name, password = f"p{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    directory.add_person(name, password)
    return name, password


class Refusals:
    def __init__(self) -> None:
        self.said: list[tuple] = []

    def __call__(self, *args: object) -> None:
        self.said.append(args)


@in_loop
@pytest.mark.parametrize("how", ["template", "search"])
async def test_the_right_password_finds_the_person_and_their_group(slapd: Slapd, how: str) -> None:
    directory = LdapDirectory(settings(slapd, how))
    root = await directory.authenticate("root", LDAP_PEOPLE["root"])
    alice = await directory.authenticate("alice", LDAP_PEOPLE["alice"])
    assert root is not None and root.admin and root.dn == user_dn("root")
    assert alice is not None and not alice.admin
    assert await directory.authenticate("alice", LDAP_PEOPLE["bob"]) is None
    assert await directory.authenticate("nobody", "whatever") is None
    assert (await directory.look_up("root")).admin and await directory.look_up("nobody") is None  # type: ignore[union-attr]


@in_loop
@pytest.mark.parametrize(
    ("object_class", "attribute"), [("posixGroup", "memberUid"), ("groupOfUniqueNames", "uniqueMember")]
)
async def test_other_group_shapes_make_admins_too(slapd: Slapd, object_class: str, attribute: str) -> None:
    name, password = new_person(slapd)
    group = f"cn={object_class.lower()}-{name},{GROUPS}"
    slapd.add_group(group, object_class, attribute, [name if attribute == "memberUid" else user_dn(name)])
    directory = LdapDirectory(settings(slapd, LDAP_ADMIN_GROUP_DN=group))
    assert (await directory.authenticate(name, password)).admin  # type: ignore[union-attr]
    assert not (await directory.authenticate("alice", LDAP_PEOPLE["alice"])).admin  # type: ignore[union-attr]


@in_loop
async def test_a_search_matching_several_entries_signs_no_one_in(slapd: Slapd) -> None:
    directory = LdapDirectory(settings(slapd, "search", LDAP_USER_FILTER="(|(uid={username})(uid=bob))"))
    assert await directory.authenticate("alice", LDAP_PEOPLE["alice"]) is None


@in_loop
async def test_a_wrong_service_password_is_unavailable_not_wrong(slapd: Slapd) -> None:
    directory = LdapDirectory(settings(slapd, "search", LDAP_BIND_PASSWORD="not-the-reader-password"))
    with pytest.raises(DirectoryUnavailable, match="LDAP_BIND_DN could not bind"):
        await directory.authenticate("alice", LDAP_PEOPLE["alice"])


@in_loop
@pytest.mark.parametrize("how", ["template", "search"])
async def test_empty_passwords_and_hostile_names_are_refused_before_any_bind(slapd: Slapd, how: str) -> None:
    sign_in = LdapSignIn(
        LdapDirectory(settings(slapd, how)), None, SignInAttempts(SignInLimiter(50, 50, 50, 900, 300)), 30
    )
    refusals = Refusals()
    before = slapd.log()
    for name, password in [
        ("bob", ""),
        ("*", "x"),
        (")(uid=*", "x"),
        ("admin,ou=x", "x"),
        ("bob)(|(uid=*", "x"),
    ]:
        assert await sign_in.sign_in(name, password, "10.0.0.1", refusals) is None
    await asyncio.sleep(0.3)  # slapd writes its log as it goes
    after = slapd.log()[len(before) :]
    assert " ACCEPT " not in after and " BIND " not in after, after  # not even a connection
    assert binds_of(slapd.log(), user_dn("bob")) == binds_of(before, user_dn("bob"))
    assert not refusals.said


@in_loop
async def test_tries_are_counted_before_the_bind_and_a_right_one_clears_them(slapd: Slapd) -> None:
    limiter = SignInAttempts(SignInLimiter(3, 20, 25, 900, 300))
    sign_in = LdapSignIn(LdapDirectory(settings(slapd)), None, limiter, 30)
    name, password = new_person(slapd)
    refusals = Refusals()
    for _ in range(2):
        assert await sign_in.sign_in(name, "wrong", "10.0.0.2", refusals) is None
    signed = await sign_in.sign_in(name, password, "10.0.0.2", refusals)
    assert signed is not None and signed[0].identifier == f"ldap:{name}" and signed[1] == 0
    for _ in range(3):
        assert await sign_in.sign_in(name, "wrong", "10.0.0.2", refusals) is None
    binds = binds_of(slapd.log(), user_dn(name))
    assert await sign_in.sign_in(name, password, "10.0.0.2", refusals) is None
    assert refusals.said and refusals.said[-1][0] == 429, refusals.said
    assert binds_of(slapd.log(), user_dn(name)) == binds, "a refused try must not reach the directory"


@in_loop
async def test_a_directory_that_is_down_is_unavailable_and_not_counted(slapd: Slapd) -> None:
    limiter = SignInAttempts(SignInLimiter(1, 20, 25, 900, 300))
    sign_in = LdapSignIn(LdapDirectory(settings(slapd)), None, limiter, 30)
    slapd.stop()
    try:
        refusals = Refusals()
        for _ in range(3):
            assert await sign_in.sign_in("alice", LDAP_PEOPLE["alice"], "10.0.0.3", refusals) is None
        assert [said[0] for said in refusals.said] == [503, 503, 503], refusals.said
        assert "directory cannot be reached" in refusals.said[0][1]
    finally:
        slapd.start()
    assert await sign_in.sign_in("alice", LDAP_PEOPLE["alice"], "10.0.0.3", Refusals()) is not None


@pytest_asyncio.fixture(loop_scope="module")
async def store(tmp_path: Path) -> AsyncIterator[AccountStore]:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    yield AccountStore(engine)
    await engine.dispose()


def with_store(directory: Slapd, store: AccountStore, check_seconds: float = 30) -> LdapSignIn:
    return LdapSignIn(
        LdapDirectory(settings(directory)),
        store,
        SignInAttempts(SignInLimiter(5, 20, 25, 900, 300)),
        check_seconds,
    )


@in_loop
async def test_the_role_follows_the_group_and_a_change_ends_older_sign_ins(
    slapd: Slapd, store: AccountStore
) -> None:
    sign_in = with_store(slapd, store)
    name, password = new_person(slapd)
    slapd.add_to_admins(name)
    first = await sign_in.sign_in(name, password, "10.0.1.1", Refusals())
    assert first is not None and first[0].metadata["role"] == "admin" and first[1] == 0
    assert (await store.get(f"ldap:{name}")).role == "admin"  # type: ignore[union-attr]
    again = await sign_in.sign_in(name, password, "10.0.1.1", Refusals())
    assert again is not None and again[1] == 0, "the same role keeps the sign-ins"
    slapd.remove_from_admins(name)
    demoted = await sign_in.sign_in(name, password, "10.0.1.1", Refusals())
    assert demoted is not None and demoted[0].metadata["role"] == "user" and demoted[1] == 1
    assert (await store.get(f"ldap:{name}")).role == "user"  # type: ignore[union-attr]


@in_loop
async def test_a_linked_identity_signs_in_as_its_account_and_keeps_its_role(
    slapd: Slapd, store: AccountStore
) -> None:
    sign_in = with_store(slapd, store)
    name, password = new_person(slapd)
    await store.add("carol", "carols-local-password", "admin")
    await store.link("carol", f"ldap:{name}")
    signed = await sign_in.sign_in(name, password, "10.0.1.2", Refusals())
    assert signed is not None and (signed[0].identifier, signed[0].metadata["role"]) == ("carol", "admin")
    await store.add("spare", "spare-password-1", "admin")  # carol is not the last administrator
    await store.remove("carol")
    assert await sign_in.sign_in(name, password, "10.0.1.2", Refusals()) is None, (
        "linked to a removed account"
    )


@in_loop
async def test_an_account_an_administrator_removed_stays_refused(slapd: Slapd, store: AccountStore) -> None:
    sign_in = with_store(slapd, store)
    name, password = new_person(slapd)
    assert await sign_in.sign_in(name, password, "10.0.1.3", Refusals()) is not None
    await store.remove(f"ldap:{name}")
    assert await sign_in.sign_in(name, password, "10.0.1.3", Refusals()) is None


@in_loop
async def test_a_signed_in_person_is_checked_against_the_directory(slapd: Slapd, store: AccountStore) -> None:
    sign_in = with_store(slapd, store, check_seconds=0)
    name, password = new_person(slapd)
    signed = await sign_in.sign_in(name, password, "10.0.1.4", Refusals())
    assert signed is not None and await sign_in.session_problem(signed[0]) is None
    slapd.add_to_admins(name)
    assert "role in the directory changed" in (await sign_in.session_problem(signed[0]) or "")
    slapd.delete_person(name)
    assert "no longer in the directory" in (await sign_in.session_problem(signed[0]) or "")
    slapd.stop()
    try:
        assert await sign_in.session_problem(signed[0]) is None, "a directory that is down ends no one"
    finally:
        slapd.start()
