"""Users and ACL as cluster state: the primary's set, replicated to every backup like wiring.

A new primary must authenticate and authorize exactly as the old one did, or
the first failover locks applications out.  So the primary sends its whole
access state on each backup's wiring link, right after the hello (before the
wiring snapshot), and again after every change (``user add|passwd|del``,
``acl reload``)::

    {"type": "access", "users": {USER: {"groups": [...], "scram-sha-256": {...}}, ...},
     "acl": {"source": "/etc/hastandby/acl", "text": "allow @admin all ..."} | null}

``users`` is the users file's own ``users`` object (salted SCRAM secrets,
never a password); ``acl`` is the primary's ACL file as it was loaded, or
null when the primary decides without one.  The set is small (users, not
messages) and changes rarely, so it goes whole every time: a backup never has
to merge, and the last message is the state.  It travels on the peer link;
use TLS peer links (``--peer-tls``) where the network is not trusted.

The backup adopts the set (``Authority.adopt``) and writes it to its own
files, so a restarted node starts from the last set it had: the users to its
users file, the rules to its ACL file (``--acl-file``, or ``DATA_DIR/acl``
without one).  A primary without an ACL makes the backup decide without one
too; the backup's own ACL file, if it has one, is left as the operator wrote it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import structlog

from hastandby.broker.admission.authority import Authority
from hastandby.files import write_atomically
from hastandby.security.acl import Acl, AclError, Policy
from hastandby.security.credentials import Credentials, CredentialsError

ACCESS = "access"

log = structlog.get_logger("hastandby.access")


def encode(authority: Authority) -> dict[str, Any]:
    """The access message for ``authority``'s current users and rules."""
    policy = authority.policy
    acl = {"source": policy.source, "text": policy.text} if isinstance(policy, Acl) else None
    return {"type": ACCESS, "users": authority.users.to_users(), "acl": acl}


def decode(message: dict[str, Any]) -> tuple[Credentials, Policy]:
    """Validate an access message completely; ValueError says what is wrong before anything changes."""
    try:
        users = Credentials.from_users(message.get("users"), "access message")
    except CredentialsError as error:
        raise ValueError(str(error)) from None
    acl = message.get("acl")
    if acl is None:
        return users, Policy()
    if not isinstance(acl, dict) or not isinstance(acl.get("text"), str) or not isinstance(acl.get("source"), str):
        raise ValueError("access message: 'acl' must be null or a map with 'source' and 'text' strings")
    try:
        return users, Acl.from_text(acl["text"], acl["source"])
    except AclError as error:
        raise ValueError(f"access message: the primary's ACL: {error}") from None


class AccessPublisher:
    """Sends a primary's access state on one backup's wiring link: now, then after every change."""

    def __init__(self, authority: Authority, send: Callable[[dict[str, Any]], None]) -> None:
        self.authority = authority
        self._send = send
        authority.listeners.append(self.changed)
        self.changed()

    def changed(self) -> None:
        self._send(encode(self.authority))

    def close(self) -> None:
        if self.changed in self.authority.listeners:
            self.authority.listeners.remove(self.changed)


class AccessReplica:
    """Adopts the primary's access state on a backup, and keeps it in the node's files."""

    def __init__(self, authority: Authority, acl_path: Path | None) -> None:
        self.authority = authority
        self.acl_path = acl_path

    def apply(self, message: dict[str, Any]) -> None:
        """Adopt one access message (ValueError if malformed: nothing is changed then)."""
        users, policy = decode(message)
        authority = self.authority
        before = {entry["user"]: entry for entry in authority.users.describe()}
        same_users = authority.users.to_users() == users.to_users()
        same_rules = _rules_text(authority.policy) == _rules_text(policy)
        if same_users and same_rules:
            return
        authority.adopt(users, policy)
        after = {entry["user"]: entry for entry in users.describe()}
        log.info("users and ACL adopted from the primary",
                 users=len(after), added=sorted(after.keys() - before.keys()),
                 removed=sorted(before.keys() - after.keys()), acl=policy.source, rules_changed=not same_rules)
        self._save(same_users, same_rules, policy)

    def _save(self, same_users: bool, same_rules: bool, policy: Policy) -> None:
        users = self.authority.users
        try:
            if not same_users and users.path is not None:
                users.save()
            if not same_rules and isinstance(policy, Acl) and self.acl_path is not None:
                write_atomically(self.acl_path, policy.text, mode=0o600)
        except (OSError, CredentialsError) as error:
            # In force in memory all the same; the next restart starts from the older files until it rejoins.
            log.error("cannot keep the primary's users or ACL in this node's files", error=str(error))
        if not same_rules and not isinstance(policy, Acl) and self.acl_path is not None and self.acl_path.exists():
            log.warning("the primary has no ACL: this node's ACL file is not in force while it follows it",
                        file=str(self.acl_path))


def _rules_text(policy: Policy) -> str | None:
    return policy.text if isinstance(policy, Acl) else None
