"""The node's users: a JSON file of salted SCRAM secrets and groups, never a password in clear.

```json
{"version": 1,
 "users": {"alice": {"scram-sha-256": {"salt": "...", "iterations": 4096,
                                       "stored_key": "...", "server_key": "..."},
                     "groups": ["admin"]},
           "backup-1.example.com": {"groups": ["cluster"]}}}
```

A user without a secret can only authenticate with a TLS client certificate
(EXTERNAL) whose subject is the user name.  Two groups mean something to the
node itself: ``admin`` (promote, replicate, user management, and everything
else when there is no ACL file) and ``cluster`` (may act as an HA backup or
a DR replica); an ACL file may name any group.

``hastandby user add|passwd|del|list`` edits the file, offline with
``--users-file`` or on a running node with ``-b`` (the node writes it).
Writes are atomic: a temporary file, fsync, rename, fsync of the directory.

In a cluster the users are cluster state: the primary's set is replicated to
every backup (``ha/access_replica.py``), which ``replace``s its own with it and
writes its file, so the file on every machine is that node's copy of the
cluster's users.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hastandby.files import write_atomically
from hastandby.security.scram import Secret

ADMIN = "admin"
CLUSTER = "cluster"
_NAME = re.compile(r"^[^\s\x00]{1,255}$")


class CredentialsError(ValueError):
    """The users file or a change to it is wrong; the message names the user or field."""


class Credentials:
    """Users, their SCRAM secrets and their groups (in memory; ``save`` writes the file)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._secrets: dict[str, Secret] = {}
        self._groups: dict[str, frozenset[str]] = {}
        # Bumped by every change (add, set_password, delete, replace): what was decided about a
        # login before it (a cached PLAIN login, a check still running) no longer holds.
        self.generation = 0

    # -- reading ---------------------------------------------------------------------

    @classmethod
    def load(cls, path: Path) -> "Credentials":
        """Read ``path``; a missing file is an empty store that ``save`` will create."""
        store = cls(path)
        try:
            text = path.read_text()
        except FileNotFoundError:
            return store
        try:
            raw = json.loads(text)
        except ValueError as error:
            raise CredentialsError(f"{path}: not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise CredentialsError(f"{path}: expected an object with 'users'")
        store._load_users(str(path), raw.get("users"))
        return store

    @classmethod
    def from_users(cls, users: Any, source: str) -> "Credentials":
        """A store from the ``users`` object of the file's format (``to_users``); CredentialsError names
        ``source`` and the user when it is wrong."""
        store = cls()
        store._load_users(source, users)
        return store

    def _load_users(self, source: str, users: Any) -> None:
        if not isinstance(users, dict):
            raise CredentialsError(f"{source}: expected an object with 'users'")
        for user, entry in users.items():
            self._load_user(source, user, entry)

    def _load_user(self, source: str, user: Any, entry: Any) -> None:
        if not isinstance(entry, dict):
            raise CredentialsError(f"{source}: user {user!r}: expected an object")
        check_name(user)
        if "scram-sha-256" in entry:
            try:
                self._secrets[user] = Secret.from_dict(entry["scram-sha-256"])
            except ValueError as error:
                raise CredentialsError(f"{source}: user {user!r}: {error}") from None
        groups = entry.get("groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) and g for g in groups):
            raise CredentialsError(f"{source}: user {user!r}: groups must be a list of names")
        self._groups[user] = frozenset(groups)

    def secret(self, user: str) -> Secret | None:
        return self._secrets.get(user)

    def groups(self, user: str) -> frozenset[str]:
        return self._groups.get(user, frozenset())

    def __contains__(self, user: object) -> bool:
        return user in self._groups

    def describe(self) -> list[dict[str, Any]]:
        """Users and groups, for ``user list`` (no secrets)."""
        return [{"user": user, "groups": sorted(self._groups[user]), "password": user in self._secrets}
                for user in sorted(self._groups)]

    # -- changing ------------------------------------------------------------------

    def add(self, user: str, password: str | None, groups: list[str]) -> None:
        check_name(user)
        if user in self._groups:
            raise CredentialsError(f"user {user!r} exists already")
        for group in groups:
            check_name(group)
        if password is not None:
            self._secrets[user] = Secret.derive(check_password(password))
        self._groups[user] = frozenset(groups)
        self.generation += 1

    def set_password(self, user: str, password: str) -> None:
        if user not in self._groups:
            raise CredentialsError(f"no such user: {user!r}")
        self._secrets[user] = Secret.derive(check_password(password))
        self.generation += 1

    def delete(self, user: str) -> None:
        if user not in self._groups:
            raise CredentialsError(f"no such user: {user!r}")
        del self._groups[user]
        self._secrets.pop(user, None)
        self.generation += 1

    def replace(self, other: "Credentials") -> None:
        """Take ``other``'s users, secrets and groups as this store's (a backup adopting the primary's)."""
        self._secrets = dict(other._secrets)
        self._groups = dict(other._groups)
        self.generation += 1

    def to_users(self) -> dict[str, Any]:
        """The ``users`` object of the file's format: what is saved, and what a primary replicates."""
        users: dict[str, Any] = {}
        for user in sorted(self._groups):
            entry: dict[str, Any] = {"groups": sorted(self._groups[user])}
            if user in self._secrets:
                entry["scram-sha-256"] = self._secrets[user].to_dict()
            users[user] = entry
        return users

    def save(self) -> None:
        if self.path is None:
            raise CredentialsError("this node has no users file (--users-file or --data-dir)")
        write_atomically(self.path, json.dumps({"version": 1, "users": self.to_users()}, indent=2) + "\n",
                         mode=0o600)


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise CredentialsError(f"invalid name {name!r}: 1 to 255 characters, no spaces or NUL")
    return name


def check_password(password: str) -> str:
    if not isinstance(password, str) or not password or "\0" in password:
        raise CredentialsError("a password must be a non-empty string without NUL")
    return password
