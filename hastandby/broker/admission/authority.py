"""Who a connection is and what it may do: the node's one place for authorization decisions.

Every accepted connection authenticated (``security/sasl.py``) as a
``Principal`` before its first AMQP frame; the driver keeps it on the
connection (``principal_of``).  ``Authority`` answers, for a principal, an
action and an object, from the users' groups and the ACL (``security/acl.py``,
or the policy without a file).  A denial raises ``NotAllowed``
(``amqp:unauthorized-access``) naming user, action and object, and is logged.

Two roles are not actions on objects but facts about the peer: an HA backup
and a DR replica must be in the ``cluster`` group, and the HA admin
connection (which may inspect a backup) must be in the ``admin`` group.  A
connection property claiming either grants nothing by itself.  With
``--allow-anonymous`` an anonymous connection has every right (qpidd's
``--auth no``) unless an ACL file says otherwise.

Users and rules are cluster state: ``listeners`` hear of every change made
here (a user added, a password set, the ACL reloaded), which is how HA
replicates them without the core knowing of HA, and ``adopt`` takes a
primary's whole set on a backup.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import structlog

from hastandby.security.acl import Acl, Policy
from hastandby.security.credentials import ADMIN, CLUSTER, Credentials
from hastandby.security.sasl import ANONYMOUS, Principal

from hastandby.broker.errors import NotAllowed

log = structlog.get_logger("hastandby.authority")


def principal_of(connection: Any) -> Principal:
    """Who ``connection`` authenticated as (anonymous where no SASL layer ran: unit tests only)."""
    return getattr(connection, "hs_principal", None) or ANONYMOUS


class Authority:
    """The users, the ACL, and the decisions made from them."""

    def __init__(self, users: Credentials, policy: Policy | None = None, allow_anonymous: bool = False) -> None:
        self.users = users
        self.policy = policy or Policy()
        self.allow_anonymous = allow_anonymous
        self.listeners: list[Callable[[], None]] = []  # told after every change to users or rules

    def groups(self, principal: Principal) -> frozenset[str]:
        return frozenset() if principal.anonymous else self.users.groups(principal.user)

    def allowed(self, principal: Principal, action: str, obj: str) -> bool:
        return self.policy.decide(principal.user, self.groups(principal), principal.anonymous, action, obj).allowed

    def check(self, principal: Principal, action: str, obj: str) -> None:
        """Raise NotAllowed (and log it) unless ``principal`` may do ``action`` on ``obj``."""
        verdict = self.policy.decide(principal.user, self.groups(principal), principal.anonymous, action, obj)
        if not verdict.allowed:
            log.warning("denied", user=principal.user, action=action, object=obj, reason=verdict.reason)
            raise NotAllowed(f"user {principal.user!r} may not {action} {obj!r}: {verdict.reason}")

    def in_role(self, principal: Principal, group: str) -> bool:
        """May ``principal`` act as the ``admin`` or ``cluster`` role?"""
        return (principal.anonymous and self.allow_anonymous) or group in self.groups(principal)

    def is_admin(self, principal: Principal) -> bool:
        return self.in_role(principal, ADMIN)

    def is_cluster(self, principal: Principal) -> bool:
        return self.in_role(principal, CLUSTER)

    def reload_acl(self, path: Path) -> str:
        """Read the ACL file again; on a mistake keep the current rules (AclError says why)."""
        self.policy = Acl.load(path)
        log.info("ACL loaded", file=str(path), rules=len(self.policy.rules))
        self.changed()
        return self.policy.source

    def adopt(self, users: Credentials, policy: Policy) -> None:
        """Take another node's users and rules as this node's (a backup following its primary)."""
        self.users.replace(users)
        self.policy = policy
        self.changed()

    def changed(self) -> None:
        """Users or rules changed: tell the listeners."""
        for listener in list(self.listeners):
            listener()
