"""Manage accounts in the app's database (the same DATA_DIR / DATABASE_URL settings as the app).

    python -m services.accounts add alice [--admin] [--generate | --no-password]
    python -m services.accounts list [--all]
    python -m services.accounts remove alice          # deletes her conversations too
    python -m services.accounts reset-password alice [--generate]
    python -m services.accounts set-role alice admin|user
    python -m services.accounts link alice github:alice-gh   # that GitHub user signs in as alice
    python -m services.accounts unlink github:alice-gh
    python -m services.accounts links
    python -m services.accounts key create alice      # prints the new API key once
    python -m services.accounts key list [alice] [--all]
    python -m services.accounts key revoke sk-vc-AbCdEf [--user alice]
    python -m services.accounts audit [--since 7d] [--actor alice] [--action account.] [--csv]

Passwords are asked for on a terminal, read from the first line of stdin otherwise, or generated
(`--generate`, printed once). Safe to run while the app runs. A new password, a new role and removal
sign the account out everywhere, at once in running apps. Every change is
recorded in the audit log with the actor "cli".
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys

from services.accounts.actions import AccountActions
from services.accounts.audit_command import add_audit_command, run_audit_command
from services.accounts.keys import ApiKeyStore
from services.accounts.passwords import generated_password
from services.accounts.store import ROLES, AccountError, AccountStore
from services.audit import actions
from services.audit.filters import FilterError
from services.audit.log import AuditLog
from services.config import Settings, SettingsError
from services.history.database import create_engine
from services.history.migrations import migrate


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m services.accounts", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="create an account")
    add.add_argument("username")
    add.add_argument("--admin", action="store_true", help="give it the admin role")
    add.add_argument("--generate", action="store_true", help="generate the password and print it")
    add.add_argument("--no-password", action="store_true", help="header or OAuth sign-in only")
    listing = commands.add_parser("list", help="list accounts")
    listing.add_argument("--all", action="store_true", help="include removed accounts")
    remove = commands.add_parser("remove", help="remove an account and delete its conversations")
    remove.add_argument("username")
    reset = commands.add_parser("reset-password", help="set a new password")
    reset.add_argument("username")
    reset.add_argument("--generate", action="store_true", help="generate the password and print it")
    role = commands.add_parser("set-role", help="make an account admin or user")
    role.add_argument("username")
    role.add_argument("role", choices=ROLES)
    link = commands.add_parser("link", help="let a provider identity (github:<login>) sign in as an account")
    link.add_argument("username")
    link.add_argument("identity", help="<provider>:<name> as the provider names them, e.g. github:octocat")
    unlink = commands.add_parser("unlink", help="stop a provider identity signing in as its linked account")
    unlink.add_argument("identity")
    commands.add_parser("links", help="list provider identities linked to accounts")
    _key_commands(commands.add_parser("key", help="API keys: create, list, revoke"))
    add_audit_command(commands)
    return parser.parse_args(argv)


def _key_commands(key: argparse.ArgumentParser) -> None:
    actions = key.add_subparsers(dest="key_command", required=True)
    create = actions.add_parser("create", help="make a new API key for an account (printed once)")
    create.add_argument("username")
    listing = actions.add_parser("list", help="list keys by prefix (of one account, or all)")
    listing.add_argument("username", nargs="?")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    revoke = actions.add_parser("revoke", help="revoke a key by its listed prefix")
    revoke.add_argument("prefix")
    revoke.add_argument("--user", help="only a key of this account")


def read_password(generate: bool) -> tuple[str, bool]:
    """(password, was generated)."""
    if generate:
        return generated_password(), True
    if sys.stdin.isatty():
        first = getpass.getpass("Password: ")
        if first != getpass.getpass("Again: "):
            raise AccountError("the two passwords differ")
        return first, False
    return sys.stdin.readline().rstrip("\n"), False


async def run(arguments: argparse.Namespace, settings: Settings) -> str:
    """Do the command; return what to print."""
    engine = create_engine(settings)
    try:
        await migrate(engine)
        audit = AuditLog(engine, settings)
        if arguments.command == "audit":
            return await run_audit_command(arguments, audit, settings)
        store = AccountStore(engine)
        keys = ApiKeyStore(engine, settings.api_keys_per_user)
        changes = AccountActions(store, keys, audit, actor=actions.CLI, via="cli")
        if arguments.command == "key":
            return await _key_command(arguments, keys, changes)
        return await _command(arguments, store, changes)
    finally:
        await engine.dispose()


async def _command(arguments: argparse.Namespace, store: AccountStore, changes: AccountActions) -> str:
    command = arguments.command
    if command == "list":
        rows = await store.list(include_removed=arguments.all)
        lines = [f"{'username':<32} {'role':<6} {'sign-in':<9} conversations"]
        for account, count in rows:
            kind = "removed" if account.disabled else ("password" if account.has_password else "external")
            lines.append(f"{account.identifier:<32} {account.role:<6} {kind:<9} {count}")
        return "\n".join(lines)
    if command == "remove":
        deleted = await changes.remove(arguments.username)
        return (
            f"removed {arguments.username} and deleted {deleted} conversation(s); its sign-ins stop working"
        )
    if command in ("link", "unlink", "links"):
        return await _link_command(arguments, store, changes)
    if command == "set-role":
        await changes.set_role(arguments.username, arguments.role)
        return f"{arguments.username} is now {arguments.role}; its sign-ins end"
    generate = arguments.generate
    if command == "add" and arguments.no_password:
        account = await changes.add(arguments.username, None, "admin" if arguments.admin else "user")
        return f"added {account.identifier} ({account.role}, sign-in by header or OAuth only)"
    password, generated = read_password(generate)
    shown = f"; password: {password}" if generated else ""
    if command == "add":
        role = "admin" if arguments.admin else "user"
        account = await changes.add(arguments.username, password, role, generated)
        return f"added {account.identifier} ({account.role}){shown}"
    await changes.reset_password(arguments.username, password, generated)
    return f"new password set for {arguments.username}; its sign-ins end{shown}"


async def _link_command(arguments: argparse.Namespace, store: AccountStore, changes: AccountActions) -> str:
    if arguments.command == "link":
        identity = await changes.link(arguments.username, arguments.identity)
        return f"{identity} now signs in as {arguments.username}"
    if arguments.command == "unlink":
        return f"{await changes.unlink(arguments.identity)} is no longer linked"
    lines = [f"{'identity':<40} {'account':<32} linked"]
    lines += [f"{identity:<40} {account:<32} {at[:19]}" for identity, account, at in await store.links()]
    return "\n".join(lines)


async def _key_command(arguments: argparse.Namespace, keys: ApiKeyStore, changes: AccountActions) -> str:
    if arguments.key_command == "create":
        key = await changes.create_key(arguments.username)
        return f"{key}\n(API key of {arguments.username}, shown only now: send it as Authorization: Bearer)"
    if arguments.key_command == "revoke":
        if not await changes.revoke_key(arguments.user, arguments.prefix):
            raise AccountError(f"no active key starts with {arguments.prefix!r}")
        return f"revoked {arguments.prefix}: it stops working at once"
    rows = await keys.list(arguments.username, include_revoked=arguments.all)
    lines = [f"{'prefix':<14} {'user':<24} {'created':<21} {'last used':<21} revoked"]
    for key in rows:
        lines.append(
            f"{key.prefix:<14} {key.user:<24} {key.created_at[:19]:<21} "
            f"{(key.last_used_at or '-')[:19]:<21} {(key.revoked_at or '-')[:19]}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    try:
        print(asyncio.run(run(arguments, Settings.from_env())))
    except (AccountError, SettingsError, FilterError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
