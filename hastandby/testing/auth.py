"""The users of one test or benchmark run: every node the harness starts requires authentication.

Three users, in one users file that every node of the run reads, made on
first use in a temporary directory removed at exit (importing this module
writes nothing):

- ``admin`` (group admin): management, the CLI, inspecting backups; a test
  run exports it as ``HASTANDBY_USER``/``HASTANDBY_PASSWORD``
  (``export_admin``), so ``ManagementClient`` and ``hastandby`` subprocesses
  use it by default; benchmarks pass ``users().login()`` instead;
- ``peer`` (group cluster): what HA backups and DR replicas authenticate as;
- ``app`` (no group): what producers and consumers connect as.

``serve_arguments()`` is what a node needs to use them, ``url(address)`` an
``amqp://app:...@host:port`` URL for python-qpid-proton clients (which then
use PLAIN: the wheel has no SCRAM, and allows PLAIN on a plain port by
default), ``connect_options()`` the same as ``connect`` arguments (so URLs
recorded in results and traces carry no password), ``client_environment()``
what C example clients, rhea and the numbered client processes read, and
``password_file(user)`` a file holding a user's password (for options such as
``--peer-password-file`` and the init scripts' ``*_PASSWORD_FILE``).

The module-level names (``PASSWORDS``, ``USERS_FILE``, ``url`` ...) are the
run's one ``Users`` (``users()``); ``Users(directory)`` makes another set.
Authentication happens once per connection; a node moves the bytes of a
plain connection the bare way after it, so measured paths are those of an
anonymous connection.  The proton C example broker (the benchmarks'
reference) stays as it is, without authentication.
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
    """A users file with ``admin``, ``peer`` and ``app`` and their generated passwords, in ``directory``."""

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
        """The file holding ``user``'s password (one line), as ``--peer-password-file`` reads it."""
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
        """``amqp://USER:PASSWORD@HOST:PORT`` (``address`` may carry a scheme, and end in ``/queue``)."""
        host_port = address.split("://", 1)[-1]
        return f"amqp://{user}:{self.passwords[user]}@{host_port}"

    def client_environment(self, user: str = APP) -> dict[str, str]:
        """Environment for clients that read their credentials from it (the C examples, rhea, the CLI)."""
        return {"HASTANDBY_USER": user, "HASTANDBY_PASSWORD": self.passwords[user]}


_users: Users | None = None


def users() -> Users:
    """This process's users (made on first use, in a temporary directory removed at exit)."""
    global _users
    if _users is None:
        directory = Path(tempfile.mkdtemp(prefix="hastandby-users-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        _users = Users(directory)
    return _users


def __getattr__(name: str) -> Any:
    """``PASSWORDS``, ``USERS_FILE`` and ``PEER_PASSWORD_FILE``: this process's users, made on first use."""
    if name == "PASSWORDS":
        return users().passwords
    if name == "USERS_FILE":
        return users().users_file
    if name == "PEER_PASSWORD_FILE":
        return users().password_file(PEER)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def password_file(user: str) -> Path:
    """The file holding ``user``'s password (one line), as ``--peer-password-file`` reads it."""
    return users().password_file(user)


def serve_arguments() -> list[str]:
    """``hastandby serve`` options: authentication required, these users, peers as ``peer``."""
    return users().serve_arguments()


def url(address: str, user: str = APP) -> str:
    """``amqp://USER:PASSWORD@HOST:PORT`` for python-qpid-proton (which then uses PLAIN)."""
    return users().url(address, user)


def client_environment(user: str = APP) -> dict[str, str]:
    """Environment for clients that read their credentials from it (the C examples, rhea, the CLI)."""
    return users().client_environment(user)


def export_admin() -> None:
    """Make ``admin`` the default of this process's management clients and CLI subprocesses."""
    os.environ.update(client_environment(ADMIN))
