"""Asking an LDAP directory who someone is (ldap3): bind as the person with their password, then read
whether they are in the administrators' group.

Each question opens its own connection and closes it, and nothing here is cached: no password and
no bind result outlives the question (ldap_sign_in.py keeps only a person's last re-check answer,
present or gone and which group, for SIGN_IN_CHECK_SECONDS). A name is checked against a strict pattern
before it is used, and escaped all the same where it goes into a DN (escape_rdn) or a filter
(escape_filter_chars). An empty password is refused before any connection: many servers answer a
simple bind with a DN and no password as an unauthenticated success (RFC 4513 5.1.2).
ldap3 is synchronous: each question runs in one of a few threads of its own, bounded by
LDAP_TIMEOUT_SECONDS (ldap3 takes whole seconds for answers: the setting is rounded up there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import ssl
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ldap3 import BASE, NONE, SIMPLE, SUBTREE, Connection, Server, Tls
from ldap3.utils.conv import escape_filter_chars
from ldap3.utils.dn import escape_rdn

from services.config import Settings
from services.config.ldap import USERNAME_PLACEHOLDER

logger = logging.getLogger(__name__)

# What a directory user name may be (after lower-casing): letters, digits and . _ - @, starting
# with a letter or digit. No `*`, `(`, `)`, `\`, `,`, `=`, `+`, spaces or controls ever reach a DN
# or a filter, however they would be escaped.
LDAP_NAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")
MAX_QUESTIONS_AT_ONCE = 4  # more sign-ins wait their turn (each is bounded by LDAP_TIMEOUT_SECONDS)
INVALID_CREDENTIALS = 49
NO_SUCH_OBJECT = 32


class DirectoryUnavailable(Exception):
    """The directory could not answer (down, unreachable, too slow, TLS failed)."""


@dataclass(frozen=True)
class DirectoryPerson:
    """Someone the directory knows: their name as typed (lower-case), their DN, their group."""

    name: str
    dn: str
    admin: bool


def directory_name(username: str) -> str | None:
    """The name to look up (stripped, lower-case), or None when it is not one a directory name may be."""
    name = username.strip().lower() if isinstance(username, str) else ""
    return name if LDAP_NAME.match(name) else None


def user_dn(template: str, name: str) -> str:
    """The person's DN from LDAP_USER_DN_TEMPLATE, the name escaped as an RDN value."""
    return template.replace(USERNAME_PLACEHOLDER, escape_rdn(name))


def user_filter(template: str, name: str) -> str:
    """LDAP_USER_FILTER with the name escaped as a filter value."""
    return template.replace(USERNAME_PLACEHOLDER, escape_filter_chars(name))


def membership_filter(dn: str, name: str) -> str:
    """Is this person in the group? groupOfNames, groupOfUniqueNames or posixGroup, whichever it is."""
    dn_value = escape_filter_chars(dn)
    name_value = escape_filter_chars(name)
    return f"(|(member={dn_value})(uniqueMember={dn_value})(memberUid={name_value}))"


class LdapDirectory:
    """The directory of LDAP_URL, asked as the settings say (DN template, or search-then-bind)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.timeout = settings.ldap_timeout_seconds
        # Its own few threads: a slow directory holds these, not the loop's default pool.
        self._threads = ThreadPoolExecutor(max_workers=MAX_QUESTIONS_AT_ONCE, thread_name_prefix="ldap")
        self.tls = None
        if settings.ldap_url.lower().startswith("ldaps://") or settings.ldap_start_tls:
            self.tls = Tls(validate=ssl.CERT_REQUIRED, ca_certs_file=settings.ldap_ca_file or None)

    @property
    def can_recheck(self) -> bool:
        """True when a service account can look people up without their password."""
        return bool(self.settings.ldap_bind_dn)

    async def authenticate(self, name: str, password: str) -> DirectoryPerson | None:
        """The person when `password` is theirs; None when the name or password is wrong.
        `name` must come from directory_name. Raises DirectoryUnavailable."""
        if not password:
            return None  # before any connection: an empty password is an unauthenticated bind
        return await self._in_thread(self._authenticate, name, password)

    async def look_up(self, name: str) -> DirectoryPerson | None:
        """The person as the service account (LDAP_BIND_DN, see `can_recheck`) sees them; None when
        they are not in the directory any more. Raises DirectoryUnavailable."""
        return await self._in_thread(self._look_up, name)

    async def _in_thread(self, question, *args):  # type: ignore[no-untyped-def]
        try:
            asked = asyncio.get_running_loop().run_in_executor(self._threads, question, *args)
            return await asyncio.wait_for(asked, self.timeout * 3)
        except DirectoryUnavailable:
            raise
        except Exception as error:  # LDAPException, OSError, a timeout, or ldap3 tripping on an answer
            raise DirectoryUnavailable(f"{type(error).__name__}: {error}") from None

    @contextlib.contextmanager
    def _bound(self, dn: str, password: str) -> Iterator[Connection]:
        """A connection (TLS started when asked) on which a bind as `dn` was tried (see `.bound`);
        closed on the way out. LDAPException when the directory cannot be reached."""
        # A Server per connection: ldap3's Server marks an address it failed to reach as unusable
        # and keeps refusing it after the directory is back.
        server = Server(self.settings.ldap_url, get_info=NONE, connect_timeout=self.timeout, tls=self.tls)
        connection = Connection(
            server,
            user=dn,
            password=password,
            authentication=SIMPLE,
            receive_timeout=math.ceil(self.timeout),
            raise_exceptions=False,
        )
        try:
            connection.open()
            if self.settings.ldap_start_tls and not connection.start_tls():
                raise DirectoryUnavailable(f"StartTLS failed: {connection.result.get('description')}")
            connection.bind()
            yield connection
        finally:
            connection.unbind()

    @contextlib.contextmanager
    def _service(self) -> Iterator[Connection]:
        """Bound as LDAP_BIND_DN; DirectoryUnavailable when it cannot bind (a configuration problem)."""
        with self._bound(self.settings.ldap_bind_dn, self.settings.ldap_bind_password) as connection:
            if not connection.bound:
                description = connection.result.get("description") if connection.result else None
                raise DirectoryUnavailable(f"LDAP_BIND_DN could not bind: {description} (check the account)")
            yield connection

    def _authenticate(self, name: str, password: str) -> DirectoryPerson | None:
        dn = self._find_dn(name)
        if dn is None:
            return None
        with self._bound(dn, password) as connection:
            if not connection.bound:
                code = connection.result.get("result") if connection.result else None
                if code != INVALID_CREDENTIALS:
                    logger.warning("LDAP bind of %s answered %s", dn, connection.result)
                return None
            return DirectoryPerson(name, dn, self._in_admin_group(connection, dn, name))

    def _look_up(self, name: str) -> DirectoryPerson | None:
        with self._service() as connection:
            dn = self._dn_as_service(connection, name)
            return DirectoryPerson(name, dn, self._in_admin_group(connection, dn, name)) if dn else None

    def _find_dn(self, name: str) -> str | None:
        """The DN to bind as: from the template, or found by the service account."""
        if self.settings.ldap_user_dn_template:
            return user_dn(self.settings.ldap_user_dn_template, name)
        with self._service() as connection:
            return self._search_dn(connection, name)

    def _dn_as_service(self, connection: Connection, name: str) -> str | None:
        """The person's DN if their entry exists (the template's DN is read to see that it does)."""
        if not self.settings.ldap_user_dn_template:
            return self._search_dn(connection, name)
        dn = user_dn(self.settings.ldap_user_dn_template, name)
        connection.search(dn, "(objectClass=*)", BASE, attributes=[])
        return dn if connection.entries else None

    def _search_dn(self, connection: Connection, name: str) -> str | None:
        found = user_filter(self.settings.ldap_user_filter, name)
        connection.search(self.settings.ldap_user_search_base, found, SUBTREE, attributes=[], size_limit=2)
        dns = [entry.entry_dn for entry in connection.entries]
        if len(dns) > 1:
            logger.warning("LDAP_USER_FILTER matches more than one entry for %s: refused", name)
        return dns[0] if len(dns) == 1 else None

    def _in_admin_group(self, connection: Connection, dn: str, name: str) -> bool:
        group = self.settings.ldap_admin_group_dn
        if not group:
            return False
        connection.search(group, membership_filter(dn, name), BASE, attributes=[])
        if connection.result and connection.result.get("result") == NO_SUCH_OBJECT:
            logger.warning("LDAP_ADMIN_GROUP_DN %s does not exist (or cannot be read): no admins", group)
        return bool(connection.entries)
