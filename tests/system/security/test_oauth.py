"""GitHub sign-in through Chainlit's real OAuth routes (`/auth/oauth/github` and its callback), against
a fake GitHub on loopback: a provider's user is `github:<login>`, never the local account of the same
name; they get in only when the allowlist (organisation, verified e-mail domain, named users) or an
administrator's link says so."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from harness.fake_github import FakeGitHub, GitHubPerson, ProviderSignIn, sign_in_with_github
from harness.server import AppServer
from tests.system.security.conftest import ALLOWED_DOMAIN, ALLOWED_GITHUB_USER, GITHUB_ORG, accounts

in_loop = pytest.mark.asyncio(loop_scope="package")


async def github_sign_in(server: AppServer, github: FakeGitHub, person: GitHubPerson) -> ProviderSignIn:
    return await sign_in_with_github(server.base_url, github.register(person))


async def who(server: AppServer, cookie: str) -> dict:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        response = await http.get("/user", headers={"Cookie": cookie})
    assert response.status_code == 200, response.text
    return response.json()


def refused(signed: ProviderSignIn) -> bool:
    return signed.cookie is None and "error=oauthSignin" in signed.location


@in_loop
async def test_a_github_user_named_like_the_administrator_does_not_become_it(
    target: AppServer, fake_github: FakeGitHub
) -> None:
    signed = await github_sign_in(target, fake_github, GitHubPerson("Admin", orgs={GITHUB_ORG: "active"}))
    assert signed.cookie, signed.location
    me = await who(target, signed.cookie)
    assert me["identifier"] == "github:admin", me
    assert (me.get("metadata") or {}).get("role") == "user", me


@in_loop
@pytest.mark.parametrize(
    "person",
    [
        GitHubPerson("stranger"),
        GitHubPerson("invited", orgs={GITHUB_ORG: "pending"}),
        GitHubPerson("elsewhere", orgs={"other-org": "active"}),
        GitHubPerson("unverified", emails=[(f"unverified@{ALLOWED_DOMAIN}", False)]),
        GitHubPerson("lookalike", emails=[(f"lookalike@{ALLOWED_DOMAIN}.evil.example", True)]),
        GitHubPerson("subdomain", emails=[(f"subdomain@mail.{ALLOWED_DOMAIN}", True)]),
    ],
    ids=lambda person: person.login,
)
async def test_github_sign_in_is_refused_to_anyone_not_allowed(
    target: AppServer, fake_github: FakeGitHub, person: GitHubPerson
) -> None:
    signed = await github_sign_in(target, fake_github, person)
    assert refused(signed), (person.login, signed)


@in_loop
@pytest.mark.parametrize(
    "person",
    [
        GitHubPerson("member", orgs={GITHUB_ORG.upper(): "active"}),
        GitHubPerson("employee", emails=[("me@home.example", True), (f"employee@{ALLOWED_DOMAIN}", True)]),
        GitHubPerson(ALLOWED_GITHUB_USER.removeprefix("github:")),
    ],
    ids=lambda person: person.login,
)
async def test_allowed_github_users_sign_in_under_their_provider_name(
    target: AppServer, fake_github: FakeGitHub, person: GitHubPerson
) -> None:
    signed = await github_sign_in(target, fake_github, person)
    assert signed.cookie, (person.login, signed.location)
    assert (await who(target, signed.cookie))["identifier"] == f"github:{person.login.lower()}"


@in_loop
async def test_only_an_administrators_link_makes_a_github_user_a_local_account(
    target: AppServer, fake_github: FakeGitHub
) -> None:
    data_dir = Path(target.env["DATA_DIR"])
    person = GitHubPerson("alice-at-github")  # on no allowlist: the link alone lets her in
    assert refused(await github_sign_in(target, fake_github, person))
    accounts(data_dir, "link", "alice", "github:Alice-at-GitHub")
    linked = await github_sign_in(target, fake_github, person)
    assert linked.cookie, linked.location
    assert (await who(target, linked.cookie))["identifier"] == "alice"
    assert "github:alice-at-github" in accounts(data_dir, "links").stdout
    accounts(data_dir, "unlink", "github:alice-at-github")
    assert refused(await github_sign_in(target, fake_github, person))


@in_loop
async def test_organisation_membership_is_asked_with_the_scope_it_needs(
    target: AppServer, fake_github: FakeGitHub
) -> None:
    signed = await github_sign_in(target, fake_github, GitHubPerson("scoped", orgs={GITHUB_ORG: "active"}))
    assert "read%3Aorg" in signed.authorize_url, signed.authorize_url
    assert f"/user/memberships/orgs/{GITHUB_ORG}" in fake_github.requests
