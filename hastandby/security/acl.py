"""Who may do what: the ACL file, and the policy without one.

One rule per line, the first that matches decides, and nothing matching
means deny::

    # permission  who       actions                  objects (globs, default *)
    allow         @admin    all
    allow         alice     publish,consume          orders.*,audit
    deny          all       purge
    allow         all       publish,consume,browse
    deny          all       all

``who`` is a user, ``@group`` or ``all``.  Actions: ``consume``, ``publish``,
``browse``, ``create``, ``delete``, ``purge``, ``bind`` (objects are queue and
exchange names; for ``bind`` both the exchange and the queue must be allowed)
and ``admin`` (promote, replicate, user and ACL management; objects are the
operation's name in lower case, e.g. ``promote``), or ``all``.

Without an ACL file: an authenticated user may do everything except
``admin``, which needs the ``admin`` group; an anonymous connection (only
with ``--allow-anonymous``) may do everything, as qpidd's ``--auth no``.

A file with a mistake is refused whole, naming its line: at start the node
does not start, and a reload keeps the rules it had.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from hastandby.security.credentials import ADMIN

ACTIONS = ("consume", "publish", "browse", "create", "delete", "purge", "bind", "admin")


class AclError(ValueError):
    """The ACL file is wrong; the message names the file and line."""


@dataclass(frozen=True)
class Rule:
    allow: bool
    who: str  # a user, "@group" or "all"
    actions: frozenset[str]
    objects: tuple[str, ...]
    line: int

    def matches(self, user: str, groups: frozenset[str], action: str, obj: str) -> bool:
        if self.who != "all" and self.who != user and not (self.who.startswith("@") and self.who[1:] in groups):
            return False
        return action in self.actions and any(fnmatchcase(obj, pattern) for pattern in self.objects)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str  # the rule or policy that decided, for the log and the error


class Policy:
    """The decision without an ACL file (see the module docstring)."""

    source = "no ACL file"

    def decide(self, user: str, groups: frozenset[str], anonymous: bool, action: str, obj: str) -> Verdict:
        if anonymous:
            return Verdict(True, "anonymous access is allowed (--allow-anonymous)")
        if action == "admin" and ADMIN not in groups:
            return Verdict(False, f"without an ACL file only the {ADMIN!r} group may do admin operations")
        return Verdict(True, "authenticated, no ACL file")


class Acl(Policy):
    """Rules from a file, first match wins, default deny."""

    def __init__(self, rules: list[Rule], source: str, text: str = "") -> None:
        self.rules = rules
        self.source = source
        self.text = text  # the file as read: what a primary replicates (ha/access_replica.py)

    @classmethod
    def load(cls, path: Path) -> "Acl":
        try:
            text = path.read_text()
        except OSError as error:
            raise AclError(f"{path}: cannot read: {error.strerror or error}") from None
        return cls.from_text(text, str(path))

    @classmethod
    def from_text(cls, text: str, source: str) -> "Acl":
        return cls(parse(text, source), source, text)

    def decide(self, user: str, groups: frozenset[str], anonymous: bool, action: str, obj: str) -> Verdict:
        for rule in self.rules:
            if rule.matches(user, groups, action, obj):
                verb = "allowed" if rule.allow else "denied"
                return Verdict(rule.allow, f"{verb} by {self.source} line {rule.line}")
        return Verdict(False, f"no rule of {self.source} allows it")


def parse(text: str, source: str = "ACL") -> list[Rule]:
    rules = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        where = f"{source} line {number}"
        if len(words) not in (3, 4):
            raise AclError(f"{where}: expected 'allow|deny WHO ACTIONS [OBJECTS]', got {raw.strip()!r}")
        permission, who, actions_text = words[:3]
        if permission not in ("allow", "deny"):
            raise AclError(f"{where}: {permission!r} is neither allow nor deny")
        if who.startswith("@") and len(who) == 1:
            raise AclError(f"{where}: '@' needs a group name")
        actions = frozenset(ACTIONS) if actions_text == "all" else frozenset(actions_text.split(","))
        unknown = sorted(actions - set(ACTIONS))
        if unknown:
            raise AclError(f"{where}: unknown action {unknown[0]!r}: expected {', '.join(ACTIONS)} or all")
        objects = tuple(p for p in (words[3] if len(words) == 4 else "*").split(",") if p)
        if not objects:
            raise AclError(f"{where}: an empty object list")
        rules.append(Rule(permission == "allow", who, actions, objects, number))
    return rules
