"""The users every test node knows, made once per test run (authentication is on in every test).

Three users, in one users file that every node of the run reads:

- ``admin`` (group admin): management, the CLI, inspecting backups; the test
  process exports it as ``HASTANDBY_USER``/``HASTANDBY_PASSWORD``, so
  ``ManagementClient`` and ``hastandby`` subprocesses use it by default;
- ``peer`` (group cluster): what HA backups and DR replicas authenticate as;
- ``app`` (no group): what producers and consumers connect as.

``serve_arguments()`` is what a node needs to use them, ``url(address)`` an
``amqp://app:...@host:port`` URL for python-qpid-proton clients (which then
use PLAIN: the wheel has no SCRAM, and allows PLAIN on a plain port by
default), ``client_environment()`` what C example clients and rhea read, and
``password_file(user)`` a file holding a user's password (for options such as
``--peer-password-file`` and the init scripts' ``*_PASSWORD_FILE``).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from pathlib import Path

from hastandby.security.credentials import Credentials

ADMIN, PEER, APP = "admin", "peer", "app"
_directory = Path(tempfile.mkdtemp(prefix="hastandby-test-users-"))
atexit.register(shutil.rmtree, _directory, ignore_errors=True)
PASSWORDS = {user: secrets.token_urlsafe(12) for user in (ADMIN, PEER, APP)}
USERS_FILE = _directory / "users.json"
GROUPS = {ADMIN: ["admin"], PEER: ["cluster"], APP: []}


def password_file(user: str) -> Path:
    """The file holding ``user``'s password (one line), as ``--peer-password-file`` reads it."""
    return _directory / f"{user}.password"


PEER_PASSWORD_FILE = password_file(PEER)


def _write() -> None:
    store = Credentials(USERS_FILE)
    for user, groups in GROUPS.items():
        store.add(user, PASSWORDS[user], groups)
        password_file(user).write_text(PASSWORDS[user] + "\n")
    store.save()


_write()


def serve_arguments() -> list[str]:
    """``hastandby serve`` options: authentication required, these users, peers as ``peer``."""
    return ["--no-allow-anonymous", "--users-file", str(USERS_FILE),
            "--peer-user", PEER, "--peer-password-file", str(PEER_PASSWORD_FILE)]


def url(address: str, user: str = APP) -> str:
    """``amqp://USER:PASSWORD@HOST:PORT`` for python-qpid-proton (which then uses PLAIN)."""
    host_port = address.split("://", 1)[-1]
    return f"amqp://{user}:{PASSWORDS[user]}@{host_port}"


def client_environment(user: str = APP) -> dict[str, str]:
    """Environment for clients that read their credentials from it (the C examples, rhea, the CLI)."""
    return {"HASTANDBY_USER": user, "HASTANDBY_PASSWORD": PASSWORDS[user]}


def export_admin() -> None:
    """Make ``admin`` the default of this process's management clients and CLI subprocesses."""
    os.environ.update(client_environment(ADMIN))
