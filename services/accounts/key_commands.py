"""`/key` in the chat: a signed-in person makes, lists and revokes their own API keys.

/key new               a new key, shown once (the reply is never stored)
/key list              your keys, by prefix
/key revoke <prefix>   stop a key at once
"""

from __future__ import annotations

from services.accounts.keys import PREFIX_CHARS, ApiKeyStore
from services.accounts.store import AccountError
from services.audit import actions
from services.audit.log import AuditLog

HELP = (
    "API keys for the OpenAI-compatible API at `/v1`:\n\n"
    "- `/key new`: a new key, shown once\n- `/key list`: your keys, by prefix\n"
    "- `/key revoke <prefix>`: stop a key at once"
)


async def run_key_command(
    keys: ApiKeyStore | None, user: str | None, text: str, base_url: str, audit: AuditLog | None = None
) -> str:
    """What to answer `text` (a /key command) for signed-in `user`; a message, never an exception.
    New and revoked keys are recorded in `audit` (by prefix)."""
    if keys is None or user is None:
        return "API keys need sign-in and the accounts database; this service runs without them."
    words = text.split()[1:]
    action = words[0].lower() if words else "help"
    try:
        if action in ("new", "create"):
            key = await keys.create(user)
            await _record(audit, user, actions.KEY_CREATED, key[:PREFIX_CHARS], 1)
            return _new_key_text(key, base_url)
        if action == "list":
            return _list_text(await keys.list(user))
        if action == "revoke" and len(words) == 2:
            revoked = await keys.revoke(user, words[1])
            await _record(audit, user, actions.KEY_REVOKED, words[1][:PREFIX_CHARS], revoked)
            if revoked:
                return f"Revoked `{words[1][:12]}`: it stops working at once."
            return f"None of your active keys starts with `{words[1][:12]}` (see `/key list`)."
    except AccountError as error:
        return f"That did not work: {error}."
    return HELP


async def _record(audit: AuditLog | None, user: str, action: str, prefix: str, count: int) -> None:
    if audit is not None:
        revoked = {"revoked": count} if action == actions.KEY_REVOKED else {}
        await audit.record(user, action, user, {"via": "chat", "prefix": prefix, **revoked})


def _new_key_text(key: str, base_url: str) -> str:
    return (
        f"Your new API key (shown only now, and not kept in this conversation: copy it):\n\n`{key}`\n\n"
        f"```bash\ncurl {base_url}/v1/chat/completions -H 'Authorization: Bearer {key}' "
        "-H 'Content-Type: application/json' \\\n"
        '  -d \'{"messages": [{"role": "user", "content": "Hello"}]}\'\n```'
    )


def _list_text(keys: list) -> str:
    if not keys:
        return "You have no API keys. `/key new` makes one."
    rows = ["| Key | Created | Last used |", "|---|---|---|"]
    rows += [f"| `{k.prefix}…` | {k.created_at[:16]} | {(k.last_used_at or 'never')[:16]} |" for k in keys]
    return "\n".join(rows)
