"""The audit log's action names: `<what>.<happened>`, lower case. Filter on a whole name or on the
part before the dot followed by a dot (`account.` finds every account action).

Callers record with `AuditLog.record(actor, action, target, details)`; `details.via` says which
door the action came through: "cli" (python -m services.accounts), "admin" (/admin), "chat"
(/key in the chat), "api", "page" (Chainlit's own routes).
"""

from __future__ import annotations

SIGN_IN = "sign_in.succeeded"  # actor = target = the account; address = the client's; details.mode
SIGN_IN_FAILED = "sign_in.failed"  # actor = the name tried (may not exist); address; details.mode
ACCOUNT_ADDED = "account.added"  # target = the account; details.role, details.sign_in
ACCOUNT_REMOVED = "account.removed"  # details.conversations_deleted
ACCOUNT_ROLE_CHANGED = "account.role_changed"  # details.role
PASSWORD_RESET = "account.password_reset"  # details.generated (never the password)
IDENTITY_LINKED = "account.linked"  # details.identity
IDENTITY_UNLINKED = "account.unlinked"  # target = the identity
KEY_CREATED = "api_key.created"  # target = the owner; details.prefix (never the key)
KEY_REVOKED = "api_key.revoked"  # target = the owner when given; details.prefix, details.revoked
CONVERSATION_DELETED = "conversation.deleted"  # actor = its owner; target = the conversation id
SERVICE_STARTED = "service.started"  # actor "system"; details: sign_in mode, each setting not at its default
AUDIT_EXPORTED = "audit.exported"  # an administrator downloaded the audit log (details.filters)
# Export, import and share links (services/transfer/events.py): target = the conversation id.
CONVERSATION_EXPORTED = "conversation.exported"  # details.format (md, json)
CONVERSATIONS_EXPORTED = "conversations.exported"  # the archive of all; details.conversations
CONVERSATIONS_IMPORTED = "conversations.imported"  # details.conversations
IMPORT_REFUSED = "conversations.import_refused"  # details.reason
SHARE_CREATED = "share.created"
SHARE_REVOKED = "share.revoked"  # details.links
SHARE_OPENED = "share.opened"  # actor None: a reader with the link (never the token)

QUOTA_SET = "quota.set"  # target = the person; details.day, details.month (tokens; None = unchanged)
QUOTA_CLEARED = "quota.cleared"  # target = the person: back to the role's budgets
USAGE_EXPORTED = "usage.exported"  # an administrator downloaded usage (target = the person, or all)

SYSTEM = "system"  # the actor of what the service does by itself
CLI = "cli"  # the actor of the accounts command (an operator on the machine)

ALL = (
    SIGN_IN,
    SIGN_IN_FAILED,
    ACCOUNT_ADDED,
    ACCOUNT_REMOVED,
    ACCOUNT_ROLE_CHANGED,
    PASSWORD_RESET,
    IDENTITY_LINKED,
    IDENTITY_UNLINKED,
    KEY_CREATED,
    KEY_REVOKED,
    CONVERSATION_DELETED,
    SERVICE_STARTED,
    AUDIT_EXPORTED,
    CONVERSATION_EXPORTED,
    CONVERSATIONS_EXPORTED,
    CONVERSATIONS_IMPORTED,
    IMPORT_REFUSED,
    SHARE_CREATED,
    SHARE_REVOKED,
    SHARE_OPENED,
    QUOTA_SET,
    QUOTA_CLEARED,
    USAGE_EXPORTED,
)
