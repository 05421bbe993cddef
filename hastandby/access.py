"""Management operations for the node's users and ACL (all of them ``admin``, see management.py).

``USER-LIST``; ``USER-ADD`` ``{"user", "password", "groups"}`` (no password:
a certificate-only user); ``USER-PASSWD`` ``{"user", "password"}``;
``USER-DEL`` ``{"user"}``; ``ACL-RELOAD`` reads the ACL file again, keeping
the current rules if it has a mistake (the reply says which line).  User
changes are written to the node's users file at once (atomically); they
apply to connections that authenticate from then on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hastandby.broker.admission.authority import Authority
from hastandby.broker.errors import InvalidArgument, NotFound
from hastandby.broker.management import Management, Request
from hastandby.security.acl import AclError
from hastandby.security.credentials import CredentialsError


def register_access_operations(management: Management, authority: Authority, acl_file: Path | None) -> None:
    users = authority.users

    def text(request: Request, field: str, required: bool = True) -> str | None:
        value = request.body.get(field)
        if value is None and not required:
            return None
        if not isinstance(value, str) or not value:
            raise InvalidArgument(f"{request.operation} needs '{field}' (a non-empty string)")
        return value

    def changed(request: Request, change: Any) -> tuple[int, Any]:
        try:
            change()
            users.save()
        except CredentialsError as error:
            raise (NotFound if "no such user" in str(error) else InvalidArgument)(str(error)) from None
        authority.changed()
        return 200, {"users": users.describe()}

    def add(request: Request) -> tuple[int, Any]:
        groups = request.body.get("groups") or []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise InvalidArgument("'groups' must be a list of names")
        return changed(request, lambda: users.add(str(text(request, "user")), text(request, "password", False),
                                                  [str(g) for g in groups]))

    def passwd(request: Request) -> tuple[int, Any]:
        return changed(request, lambda: users.set_password(str(text(request, "user")), str(text(request, "password"))))

    def delete(request: Request) -> tuple[int, Any]:
        return changed(request, lambda: users.delete(str(text(request, "user"))))

    def reload(request: Request) -> tuple[int, Any]:
        if acl_file is None or not acl_file.exists():
            raise InvalidArgument("this node has no ACL file (--acl-file)")
        try:
            return 200, {"acl": authority.reload_acl(acl_file)}
        except AclError as error:
            raise InvalidArgument(f"ACL not reloaded, the rules stay as they were: {error}") from None

    management.register("USER-LIST", lambda request: (200, {"users": users.describe()}))
    management.register("USER-ADD", add)
    management.register("USER-PASSWD", passwd)
    management.register("USER-DEL", delete)
    management.register("ACL-RELOAD", reload)
