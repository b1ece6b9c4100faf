"""The admin page's accounts and API keys: the same changes as `python -m services.accounts`
(services/accounts/actions.py), each recorded in the audit log with the administrator as actor and
ending the account's sign-ins where the command does."""

from __future__ import annotations

from services.accounts.actions import AccountActions
from services.accounts.names import AccountError
from services.accounts.passwords import generated_password
from services.accounts.store import ROLES
from services.admin.html import Html, choice, field, get_form, hidden, join, post_form, table, tag
from services.admin.sections import ADMIN_LIST_MAX_ROWS, ActionError, Section, Visit

SIGN_IN_KINDS = ("password", "generate", "none")  # typed, generated and shown once, header/OAuth only


def _changes(visit: Visit) -> AccountActions:
    if visit.changes is None:
        raise ActionError("Accounts need the database, and this service runs without one.")
    return visit.changes


def _not_self(visit: Visit, username: str, what: str) -> None:
    if username.strip().lower() == visit.admin.identifier:
        raise ActionError(f"You can't {what} yourself here: ask another administrator.")


def _account_forms(name: str, role: str, token: str) -> Html:
    """The forms of one account's row: change role, reset password, remove."""
    user = hidden("username", name)
    new_password = field("", "password", "password", placeholder="new password", autocomplete="new-password")
    return join(
        [
            post_form(
                "/admin/accounts/set-role", token, [user, choice("", "role", ROLES, role)], "Change role"
            ),
            post_form(
                "/admin/accounts/reset-password",
                token,
                [user, new_password, field("generate", "generate", "checkbox", "yes")],
                "Reset password",
            ),
            post_form(
                "/admin/accounts/remove",
                token,
                [user, field("sure", "confirm", "checkbox", "yes")],
                "Remove",
                danger=True,
            ),
        ]
    )


def _add_form(token: str) -> Html:
    return post_form(
        "/admin/accounts/add",
        token,
        [
            field("Username", "username", autocomplete="off", required="required", maxlength="64"),
            choice("Role", "role", ROLES, "user"),
            choice("Sign-in", "sign_in", SIGN_IN_KINDS, "password"),
            field("Password", "password", "password", autocomplete="new-password"),
        ],
        "Add account",
    )


async def accounts_page(visit: Visit) -> Html:
    limit = ADMIN_LIST_MAX_ROWS
    listed = await _changes(visit).store.list()
    rows = [
        [
            account.identifier,
            account.role,
            "password" if account.has_password else "header or OAuth",
            count,
            _account_forms(account.identifier, account.role, visit.admin.csrf_token),
        ]
        for account, count in listed[:limit]
    ]
    more = f"The first {limit} of {len(listed)}: the command line lists all." if len(listed) > limit else None
    listing = table(["Username", "Role", "Sign-in", "Conversations", "Change"], rows, "No accounts.")
    adding = _add_form(visit.admin.csrf_token)
    tail = tag("p", more) if more else ""
    return join([tag("h2", "Add an account"), adding, tag("h2", "Accounts"), listing, tail])


def _required(form: dict[str, str], name: str) -> str:
    value = form.get(name, "").strip() if name != "password" else form.get(name, "")
    if not value:
        raise ActionError(f"Give a {name.replace('_', ' ')}.")
    return value


def _role(form: dict[str, str]) -> str:
    role = form.get("role", "")
    if role not in ROLES:
        raise ActionError(f"The role must be one of {', '.join(ROLES)}.")
    return role


async def add_account(visit: Visit, form: dict[str, str]) -> str:
    username = _required(form, "username")
    role = _role(form)
    kind = form.get("sign_in", "")
    if kind not in SIGN_IN_KINDS:
        raise ActionError(f"Sign-in must be one of {', '.join(SIGN_IN_KINDS)}.")
    password = None if kind == "none" else generated_password() if kind == "generate" else None
    password = _required(form, "password") if kind == "password" else password
    try:
        account = await _changes(visit).add(username, password, role, generated=kind == "generate")
    except AccountError as error:
        raise ActionError(str(error)) from None
    shown = f" Its password, shown only now: {password}" if kind == "generate" else ""
    return f"Added {account.identifier} ({account.role}).{shown}"


async def remove_account(visit: Visit, form: dict[str, str]) -> str:
    username = _required(form, "username")
    _not_self(visit, username, "remove")
    if form.get("confirm") != "yes":
        raise ActionError(f"Tick 'sure' to remove {username}: its conversations are deleted too.")
    try:
        deleted = await _changes(visit).remove(username)
    except AccountError as error:
        raise ActionError(str(error)) from None
    return f"Removed {username} and deleted {deleted} conversation(s); its sign-ins and API keys stopped."


async def reset_password(visit: Visit, form: dict[str, str]) -> str:
    username = _required(form, "username")
    generate = form.get("generate") == "yes"
    password = generated_password() if generate else _required(form, "password")
    try:
        await _changes(visit).reset_password(username, password, generated=generate)
    except AccountError as error:
        raise ActionError(str(error)) from None
    shown = f" The new password, shown only now: {password}" if generate else ""
    return f"New password set for {username}; its sign-ins ended.{shown}"


async def set_role(visit: Visit, form: dict[str, str]) -> str:
    username = _required(form, "username")
    role = _role(form)
    if role != "admin":
        _not_self(visit, username, "demote")
    try:
        await _changes(visit).set_role(username, role)
    except AccountError as error:
        raise ActionError(str(error)) from None
    return f"{username} is now {role}; its sign-ins ended."


async def keys_page(visit: Visit) -> Html:
    changes = _changes(visit)
    limit = ADMIN_LIST_MAX_ROWS
    person = visit.query.get("user", "").strip()[:64]
    try:
        keys = await changes.keys.list(person or None)
    except AccountError as error:
        raise ActionError(str(error)) from None
    rows = [
        [
            key.prefix + "…",
            key.user,
            key.created_at[:19].replace("T", " "),
            (key.last_used_at or "never")[:19].replace("T", " "),
            post_form(
                "/admin/keys/revoke",
                visit.admin.csrf_token,
                [hidden("username", key.user), hidden("prefix", key.prefix)],
                "Revoke",
                danger=True,
            ),
        ]
        for key in keys[:limit]
    ]
    choose = get_form("/admin/keys", [field("Person", "user", value=person, maxlength="64")], "Show")
    listing = table(["Key", "Person", "Created", "Last used", ""], rows, "No active API keys.")
    more = tag("p", f"The first {limit} of {len(keys)}.") if len(keys) > limit else ""
    return join([choose, listing, more])


async def revoke_key(visit: Visit, form: dict[str, str]) -> str:
    username = _required(form, "username")
    prefix = _required(form, "prefix")
    try:
        revoked = await _changes(visit).revoke_key(username, prefix)
    except AccountError as error:
        raise ActionError(str(error)) from None
    if not revoked:
        raise ActionError(f"{username} has no active key starting with {prefix[:12]}.")
    return f"Revoked {prefix[:12]}… of {username}: it stops working at once."


ACCOUNTS = Section(
    "accounts",
    "Accounts",
    accounts_page,
    {"add": add_account, "remove": remove_account, "reset-password": reset_password, "set-role": set_role},
)
KEYS = Section("keys", "API keys", keys_page, {"revoke": revoke_key})
