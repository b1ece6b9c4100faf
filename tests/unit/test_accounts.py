"""Accounts and sign-in without a model: hashing, the store and its command, limits on failures,
the kept secret, the sign-in modes and the refusal of a public address without sign-in."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from chainlit.auth.jwt import create_jwt
from chainlit.user import User

from harness.server import ROOT
from services.accounts.devices import DeviceCookies
from services.accounts.keys import KEY_MARK, ApiKeyStore
from services.accounts.limits import SignInLimiter, address_key
from services.accounts.modes import resolve_mode
from services.accounts.passwords import check_password, hash_password
from services.accounts.secret import ENV_NAME, ensure_auth_secret, load_or_create_secret
from services.accounts.sessions import Sessions
from services.accounts.sign_in import LOCAL_USER, SignIn, SignInRequest, current_request
from services.accounts.store import AccountError, AccountStore
from services.config import Settings, SettingsError
from services.history.database import create_engine
from services.history.migrations import migrate


@pytest_asyncio.fixture(loop_scope="module")
async def store(tmp_path: Path) -> AsyncIterator[AccountStore]:
    engine = create_engine(Settings.from_env({"DATA_DIR": str(tmp_path)}))
    await migrate(engine)
    yield AccountStore(engine)
    await engine.dispose()


def test_passwords_are_argon2id_hashes() -> None:
    hashed = hash_password("correct horse")
    assert hashed.startswith("$argon2id$") and "m=65536" in hashed, "memory-hard: 64 MiB per hash"
    assert check_password(hashed, "correct horse")
    assert not check_password(hashed, "wrong horse")
    assert not check_password(None, "anything") and not check_password("garbage", "anything")


@pytest.mark.asyncio(loop_scope="module")
async def test_accounts_are_added_listed_changed_and_removed(store: AccountStore) -> None:
    admin = await store.add("Alice@Example.com", "first password", "admin")
    assert admin.identifier == "alice@example.com" and admin.role == "admin", "names are case-insensitive"
    await store.add("bob", "bobs password")
    with pytest.raises(AccountError, match="already exists"):
        await store.add("BOB", "another password")
    with pytest.raises(AccountError, match="at least 8"):
        await store.add("carol", "short")
    with pytest.raises(AccountError, match="last administrator"):
        await store.set_role("alice@example.com", "user")
    await store.set_role("bob", "admin")
    await store.reset_password("bob", "a new password")
    bob = await store.get("bob")
    assert bob is not None and bob.role == "admin" and check_password(bob.password_hash, "a new password")
    assert await store.remove("bob") == 0
    removed = await store.get("bob")
    assert removed is not None and removed.disabled and removed.password_hash is None
    assert [a.identifier for a, _ in await store.list()] == ["alice@example.com"]
    again = await store.add("bob", "back again!", "user")
    assert not again.disabled and again.role == "user", "a removed name can be given out again"


def test_the_accounts_command_manages_the_apps_database(tmp_path: Path) -> None:
    env = {**os.environ, "DATA_DIR": str(tmp_path)}

    def accounts(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "services.accounts", *args], cwd=ROOT, env=env,
                              input=stdin, capture_output=True, text=True, timeout=60)  # fmt: skip

    assert accounts("add", "alice", "--admin", stdin="a long password\n").returncode == 0
    generated = accounts("add", "bob", "--generate")
    assert generated.returncode == 0 and "password: " in generated.stdout
    listing = accounts("list").stdout
    assert "alice" in listing and "admin" in listing and "bob" in listing
    refused = accounts("set-role", "alice", "user")
    assert refused.returncode == 1 and "last administrator" in refused.stderr
    assert accounts("remove", "bob").returncode == 0
    assert "bob" not in accounts("list").stdout and "removed" in accounts("list", "--all").stdout


def test_sign_in_attempts_wait_per_account_and_address_per_address_and_per_account() -> None:
    now = [0.0]
    limiter = SignInLimiter(max_per_pair=3, max_per_address=5, max_per_account=8, window_seconds=60,
                            lockout_seconds=30, clock=lambda: now[0])  # fmt: skip
    for _ in range(3):
        assert limiter.attempt("alice", "10.0.0.1") == 0, "counted as it starts"
    assert limiter.attempt("alice", "10.0.0.1") == 30, "the account waits at this address"
    assert limiter.attempt("alice", "10.0.0.9") == 0, "not elsewhere: one address cannot lock it out"
    for name in ("bob", "carol"):
        assert limiter.attempt(name, "10.0.0.1") == 0
    assert limiter.attempt("dave", "10.0.0.1") == 2, "the address is slowed, whatever the name"
    for number in range(2, 6):  # many addresses, one account (4 tries so far): the account-wide limit
        assert limiter.attempt("alice", f"10.0.1.{number}") == 0
    assert limiter.attempt("alice", "10.0.2.1") == 30, "the account waits everywhere"
    now[0] = 31
    assert limiter.attempt("alice", "10.0.0.9") == 0, "the wait ends"
    limiter.succeeded("alice", "10.0.0.9")
    for _ in range(3):  # a success took its own attempt back and cleared its pair
        assert limiter.attempt("erin", None) == 0
    limiter.succeeded("erin", None)
    assert limiter.attempt("erin", None) == 0
    assert SignInLimiter(5, 20, 3, 60, 30).limits["account"] == 21, "always above the address limit"


def test_guessing_from_one_address_slows_it_more_and_more_but_never_locks_it_out() -> None:
    now = [0.0]
    limiter = SignInLimiter(max_per_pair=3, max_per_address=5, max_per_account=8, window_seconds=600,
                            lockout_seconds=30, clock=lambda: now[0])  # fmt: skip
    office = "203.0.113.7"  # everyone behind one NAT address, and a script among them
    for number in range(5):
        assert limiter.attempt(f"name-{number}", office) == 0
    waits = []
    for number in range(5, 12):  # the script goes on, as soon as it may
        waits.append(limiter.attempt(f"name-{number}", office))
        now[0] += waits[-1]
        assert limiter.attempt(f"name-{number}", office) == 0
    assert waits == [2, 4, 8, 16, 30, 30, 30], "a growing delay, at most SIGN_IN_LOCKOUT_SECONDS"
    assert limiter.attempt("the-admin", office) == 30, "a neighbour waits the delay too, no longer"
    now[0] += 30
    assert limiter.attempt("the-admin", office) == 0, "then tries like anyone: not locked out"
    limiter.succeeded("the-admin", office)


def test_a_browser_that_signed_in_before_is_judged_by_its_own_failures_only() -> None:
    now = [0.0]
    limiter = SignInLimiter(max_per_pair=3, max_per_address=5, max_per_account=6, window_seconds=600,
                            lockout_seconds=30, clock=lambda: now[0])  # fmt: skip
    office = "203.0.113.8"
    for number in range(5):  # a script fills the office's address ...
        assert limiter.attempt(f"name-{number}", office) == 0
    for number in range(6):  # ... and guessers elsewhere the admin's account
        assert limiter.attempt("admin", f"198.51.100.{number}") == 0
    assert limiter.attempt("admin", office) > 0, "a browser the account does not know waits"
    assert limiter.attempt("admin", office, device="admins-laptop") == 0, "the admin's own browser goes"
    limiter.succeeded("admin", office, device="admins-laptop")
    for _ in range(3):  # the same browser guessing: its own limit
        assert limiter.attempt("admin", office, device="admins-laptop") == 0
    assert limiter.attempt("admin", office, device="admins-laptop") == 30
    assert limiter.attempt("admin", office, device="admins-phone") == 0, "another known browser goes"


def test_device_cookies_name_their_browser_for_their_account_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_NAME, "a-test-secret-" * 4)
    now = [1_000_000.0]
    devices = DeviceCookies(lifetime_seconds=86_400, clock=lambda: now[0])
    cookie = devices.issue("alice")
    assert cookie and devices.device_of(cookie, "alice") == cookie.split(".")[0]
    assert devices.device_of(devices.issue("alice"), "alice") != devices.device_of(cookie, "alice")
    assert devices.device_of(cookie, "bob") is None, "bound to its account"
    device, issued, mac = cookie.split(".")
    assert devices.device_of(f"{device}.{int(issued) + 86_400}.{mac}", "alice") is None, "signed"
    assert devices.device_of(None, "alice") is None and devices.device_of("x" * 500, "alice") is None
    now[0] += 86_401
    assert devices.device_of(cookie, "alice") is None, "it expires"
    header = devices.set_cookie(cookie)
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Max-Age=86400" in header
    monkeypatch.setenv(ENV_NAME, "another-secret-" * 4)
    now[0] -= 86_401
    assert devices.device_of(cookie, "alice") is None, "a new cookie-signing secret ends them all"


def test_an_ipv6_host_counts_as_its_64_network() -> None:
    assert address_key("2001:db8:1:2:aaaa::1") == address_key("2001:db8:1:2:bbbb::2") == "2001:db8:1:2::/64"
    assert address_key("2001:db8:1:3::1") != address_key("2001:db8:1:2::1")
    assert address_key("::ffff:10.0.0.1") == address_key("10.0.0.1") == "10.0.0.1"
    assert address_key(None) is None and address_key("unix-socket") == "unix-socket"


def test_the_sign_in_secret_is_made_once_and_kept_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_NAME, "")  # recorded as it was, so what ensure_auth_secret sets is undone
    monkeypatch.delenv(ENV_NAME)
    first = load_or_create_secret(tmp_path)
    assert stat.S_IMODE((tmp_path / "auth-secret").stat().st_mode) == 0o600
    assert load_or_create_secret(tmp_path) == first and len(first) >= 32
    ensure_auth_secret(tmp_path)
    assert os.environ[ENV_NAME] == first
    monkeypatch.setenv(ENV_NAME, "from-the-environment-" * 3)
    assert ensure_auth_secret(tmp_path) == "environment"


def test_modes_and_the_refusal_of_a_public_address_without_sign_in() -> None:
    plain = Settings.from_env({})
    assert resolve_mode(plain, "127.0.0.1", []) == "local"
    assert resolve_mode(plain, "::1", []) == "local"
    assert resolve_mode(plain, "0.0.0.0", ["github"]) == "oauth"
    with pytest.raises(SettingsError, match="Refusing to start") as refusal:
        resolve_mode(plain, "0.0.0.0", [])
    assert "AUTH_MODE=password" in str(refusal.value) and "ALLOW_ANONYMOUS=true" in str(refusal.value)
    assert resolve_mode(Settings.from_env({"ALLOW_ANONYMOUS": "true"}), "0.0.0.0", []) == "anonymous"
    assert resolve_mode(Settings.from_env({"AUTH_MODE": "password"}), "0.0.0.0", []) == "password"
    with pytest.raises(SettingsError, match="AUTH_HEADER"):
        Settings.from_env({"AUTH_MODE": "header"})


@pytest.mark.asyncio(loop_scope="module")
async def test_password_sign_in_limits_failures_with_a_clear_refusal(store: AccountStore) -> None:
    settings = Settings.from_env({"AUTH_MODE": "password", "SIGN_IN_MAX_FAILURES": "2"})
    sign_in = SignIn(settings, "password", store)
    await store.add("frank", "franks password")
    request = SignInRequest(address="10.1.2.3")
    current_request.set(request)
    user = await sign_in.password("Frank", "franks password")
    assert user is not None and user.identifier == "frank" and user.metadata["role"] == "user"
    assert (
        await sign_in.password("frank", "wrong") is None and await sign_in.password("frank", "wrong") is None
    )
    assert request.refusal is None
    assert await sign_in.password("frank", "franks password") is None, "even the right password waits"
    status, detail, retry_after = request.refusal  # type: ignore[misc]
    assert status == 429 and "Too many failed sign-ins" in detail and retry_after and retry_after > 0


@pytest.mark.asyncio(loop_scope="module")
async def test_header_sign_in_trusts_only_the_proxy_and_local_only_loopback(store: AccountStore) -> None:
    settings = Settings.from_env({"AUTH_MODE": "header", "AUTH_HEADER": "X-Forwarded-User",
                                  "AUTH_PROXY_ADDRESSES": "10.0.0.0/8"})  # fmt: skip
    proxied = SignIn(settings, "header", store)
    current_request.set(SignInRequest(address="203.0.113.7", peer="10.0.0.5"))
    user = await proxied.header({"x-forwarded-user": "Grace"})
    assert user is not None and user.identifier == "grace"
    current_request.set(SignInRequest(address="192.168.1.9", peer="192.168.1.9"))
    assert await proxied.header({"x-forwarded-user": "grace"}) is None, "not from the proxy"
    current_request.set(SignInRequest(address="10.0.0.5", peer="192.168.1.9"))
    assert await proxied.header({"x-forwarded-user": "grace"}) is None, "a client naming the proxy is not it"
    local = SignIn(Settings.from_env({}), "local", None)
    current_request.set(SignInRequest(address="127.0.0.1", peer="127.0.0.1"))
    me = await local.header({"host": "127.0.0.1:8000"})
    assert me is not None and me.metadata["role"] == "admin"
    assert await local.header({"host": "127.0.0.1:8000", "x-forwarded-for": "203.0.113.7"}) is None, (
        "a proxy in front: configure sign-in"
    )
    current_request.set(SignInRequest(address="192.168.1.9", peer="192.168.1.9"))
    assert await local.header({"host": "127.0.0.1:8000"}) is None


@pytest.mark.asyncio(loop_scope="module")
async def test_first_admin_is_generated_once_and_printed(
    store: AccountStore, capsys: pytest.CaptureFixture
) -> None:
    sign_in = SignIn(Settings.from_env({"AUTH_MODE": "password"}), "password", store)
    await sign_in.ensure_first_accounts()
    printed = capsys.readouterr().err
    assert "username: admin" in printed
    password = printed.split("password: ")[1].split()[0]
    admin = await store.get("admin")
    assert admin is not None and admin.role == "admin" and check_password(admin.password_hash, password)
    await sign_in.ensure_first_accounts()
    assert "username: admin" not in capsys.readouterr().err, "only once"
    from_env = SignIn(Settings.from_env({"AUTH_MODE": "password", "ADMIN_USERNAME": "root@example.com",
                                         "ADMIN_PASSWORD": "a long secret"}), "password", store)  # fmt: skip
    await from_env.ensure_first_accounts()
    assert (await store.get("root@example.com")).role == "admin"  # type: ignore[union-attr]


@pytest.mark.asyncio(loop_scope="module")
async def test_replicas_starting_together_make_the_named_administrator_once(store: AccountStore) -> None:
    """Both looked before either added it (deploy/topology.py and compose start replicas together):
    the one that comes second finds it made, and says nothing."""
    settings = Settings.from_env(
        {"AUTH_MODE": "password", "ADMIN_USERNAME": "ops", "ADMIN_PASSWORD": "a long secret"}
    )
    await store.add("ops", "a long secret", "admin")  # the other replica, just now
    looked = []

    class LookedBefore(AccountStore):
        async def get(self, identifier: str):  # type: ignore[no-untyped-def]
            looked.append(identifier)
            return None if len(looked) == 1 else await super().get(identifier)

    await SignIn(settings, "password", LookedBefore(store.engine)).ensure_first_accounts()
    assert (await store.get("ops")).role == "admin"  # type: ignore[union-attr]


@pytest.mark.asyncio(loop_scope="module")
async def test_the_local_user_has_an_account_for_its_keys(store: AccountStore) -> None:
    """Local mode keeps no conversations with CHAT_HISTORY=false, yet `/key new` needs an owner row."""
    local = SignIn(Settings.from_env({"CHAT_HISTORY": "false"}), "local", store)
    await local.ensure_first_accounts()
    await local.ensure_first_accounts()  # idempotent
    account = await store.get(LOCAL_USER)
    assert account is not None and account.role == "admin" and not account.has_password
    assert (await ApiKeyStore(store.engine, 2).create(LOCAL_USER)).startswith(KEY_MARK)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_sign_in_ends_with_its_lifetime_and_with_each_change_to_its_account(
    store: AccountStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_NAME, "a-test-secret-" * 4)
    now = [1_000_000.0]
    sessions = Sessions("password", store, lifetime_seconds=3600, clock=lambda: now[0])
    await store.add("ivan", "ivans password", "admin")
    account = await store.add("heidi", "heidis password")

    def token() -> str:
        return create_jwt(
            sessions.stamp(User(identifier="heidi", metadata={"role": "user"}), account.generation)
        )

    first = token()
    assert await sessions.token_problem(first) is None
    assert "older version" in (await sessions.token_problem(create_jwt(User(identifier="heidi"))) or "")
    now[0] += 3601
    assert "expired" in (await sessions.token_problem(first) or ""), "an absolute lifetime"
    now[0] -= 3601
    for change in (
        lambda: store.reset_password("heidi", "a new password"),
        lambda: store.set_role("heidi", "admin"),
        lambda: store.remove("heidi"),
        lambda: store.add("heidi", "given back!"),
    ):
        account = await store.get("heidi")  # type: ignore[assignment]
        before = token()
        await change()
        problem = await sessions.token_problem(before) or ""
        assert "ended" in problem or "removed" in problem, problem
    account = await store.get("heidi")  # type: ignore[assignment]
    mine, other_device = token(), token()
    assert await sessions.token_problem(other_device) is None  # cached now
    assert await sessions.end(mine), "sign-out"
    assert await sessions.token_problem(mine) and await sessions.token_problem(other_device), "at once"
    assert not await sessions.end(mine), "an ended sign-in ends nothing more"
    local = Sessions("local", store, lifetime_seconds=3600, clock=lambda: now[0])
    assert await local.token_problem(create_jwt(local.stamp(User(identifier="local"), 0))) is None


@pytest.mark.asyncio(loop_scope="module")
async def test_a_removal_made_by_another_process_ends_the_sign_in_at_its_next_check(
    store: AccountStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_NAME, "a-test-secret-" * 4)
    sessions = SignIn(Settings.from_env({"AUTH_MODE": "password"}), "password", store).sessions
    account = await store.add("judy", "judys password")
    user = sessions.stamp(User(identifier="judy", metadata={"role": "user"}), account.generation)
    assert await sessions.problem(user) is None, "the account read once, as at every chat message"
    await AccountStore(store.engine).remove("judy")  # the accounts command, or another replica
    assert await sessions.problem(user) == "This account was removed.", "at once, not within 30 s"
