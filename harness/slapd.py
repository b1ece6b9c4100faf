"""A throwaway OpenLDAP directory from Debian's `slapd` package, on a free loopback port.

A private slapd.conf (started with `-f`, so the system's cn=config is never read), an mdb database
in a fresh folder, the stats log (connections, binds, searches) in `slapd.log` beside it. It holds
people (inetOrgPerson under ou=people, with SSHA passwords), an admins group that is a groupOfNames
(`member` DNs) and a readers service account for search-then-bind. Stop and start it again to make
the directory disappear and come back under a running app; `remove()` leaves nothing behind.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ldap3 import MODIFY_ADD, MODIFY_DELETE, Connection, Server

from harness.server import free_port

SUFFIX = "dc=example,dc=org"
ROOT_DN = f"cn=admin,{SUFFIX}"
PEOPLE = f"ou=people,{SUFFIX}"
GROUPS = f"ou=groups,{SUFFIX}"
ADMINS_GROUP = f"cn=admins,{GROUPS}"
READER_DN = f"cn=reader,{SUFFIX}"
SCHEMAS = ("core", "cosine", "nis", "inetorgperson")
SLAPD = "/usr/sbin/slapd"

CONFIG = """\
{includes}
pidfile {root}/slapd.pid
argsfile {root}/slapd.args
modulepath /usr/lib/ldap
moduleload back_mdb
loglevel stats
database mdb
maxsize 16777216
suffix "{suffix}"
rootdn "{root_dn}"
rootpw {root_password}
directory {root}/data
access to attrs=userPassword by self write by anonymous auth by * none
access to * by users read by * none
"""


def ssha(password: str) -> str:
    """An {SSHA} userPassword value (what slappasswd makes)."""
    salt = secrets.token_bytes(8)
    digest = hashlib.sha1(password.encode() + salt).digest()
    return "{SSHA}" + base64.b64encode(digest + salt).decode()


def user_dn(uid: str) -> str:
    return f"uid={uid},{PEOPLE}"


class Slapd:
    """One directory: `start()`, `add_person`, `add_to_admins`, `remove_from_admins`, `delete_person`,
    `stop()`, `remove()`; `url` is ldap://127.0.0.1:<port>, `log_path` its stats log."""

    def __init__(self, reader_password: str) -> None:
        if not Path(SLAPD).exists():
            raise RuntimeError("slapd is not installed: run scripts/setup.sh --test")
        self.root = Path(tempfile.mkdtemp(prefix="chat-slapd-"))
        (self.root / "data").mkdir()
        self.root_password = secrets.token_urlsafe(16)
        self.reader_password = reader_password
        self.port = free_port()
        self.url = f"ldap://127.0.0.1:{self.port}"
        self.log_path = self.root / "slapd.log"
        self.config_path = self.root / "slapd.conf"
        includes = "\n".join(f"include /etc/ldap/schema/{name}.schema" for name in SCHEMAS)
        config = CONFIG.format(
            includes=includes,
            root=self.root,
            suffix=SUFFIX,
            root_dn=ROOT_DN,
            root_password=self.root_password,
        )
        self.config_path.write_text(config)
        self.process: subprocess.Popen | None = None
        self._log = None

    def start(self, timeout: float = 30) -> Slapd:
        """Run slapd in the foreground (`-d stats`: it does not fork, so this process owns it, and it
        logs connections, binds and searches to the log file)."""
        self._log = self.log_path.open("ab")
        command = [SLAPD, "-f", str(self.config_path), "-h", f"ldap://127.0.0.1:{self.port}/", "-d", "stats"]
        self.process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"slapd exited at start:\n{self.log_path.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"slapd did not listen on {self.port} within {timeout} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def _admin(self) -> Connection:
        connection = Connection(
            Server(self.url, connect_timeout=5),
            ROOT_DN,
            self.root_password,
            receive_timeout=10,
            raise_exceptions=True,
        )
        connection.bind()
        return connection

    def load(self, people: dict[str, str], admins: list[str]) -> None:
        """The tree, the reader account, `people` (uid: password) and the admins group."""
        with self._admin() as ldap:
            ldap.add(SUFFIX, ["dcObject", "organization"], {"o": "Example", "dc": "example"})
            for unit in (PEOPLE, GROUPS):
                ldap.add(unit, ["organizationalUnit"], {"ou": unit.split(",")[0].split("=")[1]})
            ldap.add(
                READER_DN,
                ["simpleSecurityObject", "organizationalRole"],
                {"cn": "reader", "userPassword": ssha(self.reader_password)},
            )
        for uid, password in people.items():
            self.add_person(uid, password)
        with self._admin() as ldap:
            members = [user_dn(uid) for uid in admins] or [READER_DN]  # groupOfNames needs a member
            ldap.add(ADMINS_GROUP, ["groupOfNames"], {"cn": "admins", "member": members})

    def add_person(self, uid: str, password: str) -> None:
        with self._admin() as ldap:
            ldap.add(
                user_dn(uid),
                ["inetOrgPerson"],
                {"uid": uid, "cn": uid, "sn": uid, "userPassword": ssha(password)},
            )

    def add_group(self, dn: str, object_class: str, attribute: str, values: list[str]) -> None:
        """Another group (a posixGroup with memberUid names, say)."""
        extra = {"gidNumber": 5000} if object_class == "posixGroup" else {}
        with self._admin() as ldap:
            ldap.add(dn, [object_class], {"cn": dn.split(",")[0].split("=")[1], attribute: values, **extra})

    def add_to_admins(self, uid: str) -> None:
        with self._admin() as ldap:
            ldap.modify(ADMINS_GROUP, {"member": [(MODIFY_ADD, [user_dn(uid)])]})

    def remove_from_admins(self, uid: str) -> None:
        with self._admin() as ldap:
            ldap.modify(ADMINS_GROUP, {"member": [(MODIFY_DELETE, [user_dn(uid)])]})

    def delete_person(self, uid: str) -> None:
        with self._admin() as ldap:
            ldap.delete(user_dn(uid))


def binds_of(log: str, dn: str) -> int:
    """How many simple binds the stats log shows for `dn` (slapd logs `BIND dn="..." method=128`)."""
    return log.lower().count(f'bind dn="{dn.lower()}" method=128')


if __name__ == "__main__":  # a quick look by hand: start, load, show the log, remove
    directory = Slapd("reader-password").start()
    try:
        directory.load({"alice": "alice-password"}, ["alice"])
        print(directory.url, os.listdir(directory.root))
    finally:
        directory.remove()
