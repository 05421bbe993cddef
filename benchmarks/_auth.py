"""The users of one benchmark run: hastandby nodes require authentication, as in production.

Benchmarks must not import ``tests/``, so this is their own small version of
``tests/support/auth.py``: a users file in a fresh temporary directory
(removed at exit) with

- ``admin`` (group admin): the harness's management requests (``login()``);
- ``peer`` (group cluster): what HA backups and DR replicas authenticate as;
- ``app`` (no group): producers and consumers.

``serve_arguments()`` is what a node needs (authentication required, these
users, peers as ``peer``).  Clients authenticate with PLAIN (python-qpid-proton
has no SCRAM; the C examples' proton has no Cyrus): python-qpid-proton clients
with ``connect_options()`` (user and password as arguments, so URLs recorded
in results and traces carry no password), the C examples and the failover
client processes with ``client_environment()`` (``HASTANDBY_USER`` and
``HASTANDBY_PASSWORD``).  Authentication happens once per connection; a node
moves the bytes of a plain connection the bare way after it, so the measured
paths are those of before.  The proton C example broker (the reference) stays
as it is, without authentication.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hastandby.client import Login
from hastandby.security.credentials import Credentials

ADMIN, PEER, APP = "admin", "peer", "app"
GROUPS = {ADMIN: ["admin"], PEER: ["cluster"], APP: []}


class Users:
    """A users file with ``admin``, ``peer`` and ``app`` and their generated passwords."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.users_file = directory / "users.json"
        self.passwords = {user: secrets.token_urlsafe(12) for user in GROUPS}
        store = Credentials(self.users_file)
        for user, groups in GROUPS.items():
            store.add(user, self.passwords[user], groups)
            path = self.password_file(user)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(self.passwords[user] + "\n")
        store.save()

    def password_file(self, user: str) -> Path:
        return self.directory / f"{user}.password"

    def serve_arguments(self) -> list[str]:
        """``hastandby serve`` options: authentication required, these users, peers as ``peer``."""
        return ["--no-allow-anonymous", "--users-file", str(self.users_file),
                "--peer-user", PEER, "--peer-password-file", str(self.password_file(PEER))]

    def login(self, user: str = ADMIN) -> Login:
        """For ``ManagementClient(..., login=...)``."""
        return Login(user, self.passwords[user])

    def connect_options(self, user: str = APP) -> dict[str, Any]:
        """Keyword arguments for python-qpid-proton's ``connect`` / ``BlockingConnection`` (PLAIN)."""
        return {"user": user, "password": self.passwords[user], "allow_insecure_mechs": True}

    def url(self, address: str, user: str = APP) -> str:
        """``amqp://USER:PASSWORD@ADDRESS`` (``ADDRESS`` may end in ``/queue``), for a URL that is never recorded."""
        return f"amqp://{user}:{self.passwords[user]}@{address}"

    def client_environment(self, user: str = APP) -> dict[str, str]:
        """Environment for the C example clients and ``numbered_client`` processes."""
        return {"HASTANDBY_USER": user, "HASTANDBY_PASSWORD": self.passwords[user]}


_users: Users | None = None


def users() -> Users:
    """This process's users (made on first use, in a temporary directory removed at exit)."""
    global _users
    if _users is None:
        directory = Path(tempfile.mkdtemp(prefix="hastandby-bench-users-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        _users = Users(directory)
    return _users

