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
# Reserved for the conversation export and import feature (not recorded by this code yet).
CONVERSATION_EXPORTED = "conversation.exported"  # target = the conversation id (or "all")
CONVERSATION_IMPORTED = "conversation.imported"  # target = the new conversation id
SHARE_LINK_CREATED = "share_link.created"  # target = the conversation id
SHARE_LINK_REVOKED = "share_link.revoked"

SYSTEM = "system"  # the actor of what the service does by itself
CLI = "cli"  # the actor of the accounts command (an operator on the machine)

ALL = (
    SIGN_IN, SIGN_IN_FAILED, ACCOUNT_ADDED, ACCOUNT_REMOVED, ACCOUNT_ROLE_CHANGED, PASSWORD_RESET,
    IDENTITY_LINKED, IDENTITY_UNLINKED, KEY_CREATED, KEY_REVOKED, CONVERSATION_DELETED, SERVICE_STARTED,
    AUDIT_EXPORTED, CONVERSATION_EXPORTED, CONVERSATION_IMPORTED, SHARE_LINK_CREATED, SHARE_LINK_REVOKED,
)  # fmt: skip
