"""The access message (users and ACL as cluster state): what a primary sends, what a backup adopts and keeps."""

from __future__ import annotations

import json

import pytest

from hastandby.broker.admission.authority import Authority
from hastandby.security.acl import Acl, Policy
from hastandby.security.credentials import Credentials
from hastandby.security.sasl import Principal
from hastandby.ha import access_replica as access

RULES = "allow @admin all\ndeny bob publish orders\nallow all all\n"


def primary_authority() -> Authority:
    users = Credentials()
    users.add("admin", "admin-pw", ["admin"])
    users.add("bob", "bob-pw", [])
    return Authority(users, Acl.from_text(RULES, "/etc/hastandby/acl"))


def test_a_backup_adopts_the_primarys_users_and_rules_and_keeps_them_in_its_files(tmp_path):
    sent: list[dict] = []
    primary = primary_authority()
    publisher = access.AccessPublisher(primary, sent.append)
    backup_users = Credentials(tmp_path / "users.json")
    backup_users.add("stale", "old", [])
    backup = Authority(backup_users)
    replica = access.AccessReplica(backup, tmp_path / "acl")

    replica.apply(sent[-1])

    assert {u["user"] for u in backup.users.describe()} == {"admin", "bob"}
    assert backup.users.secret("bob") == primary.users.secret("bob")
    assert not backup.allowed(Principal("bob", "PLAIN"), "publish", "orders")
    assert json.loads((tmp_path / "users.json").read_text())["users"] == primary.users.to_users()
    assert (tmp_path / "acl").read_text() == RULES
    assert Credentials.load(tmp_path / "users.json").secret("bob") == primary.users.secret("bob")

    # Every change on the primary goes out whole; a backup takes the last one.
    primary.users.delete("bob")
    primary.changed()
    replica.apply(sent[-1])
    assert "bob" not in backup.users
    assert "bob" not in Credentials.load(tmp_path / "users.json")

    publisher.close()
    primary.changed()
    assert len(sent) == 2  # a closed publisher sends nothing more


def test_a_primary_without_an_acl_makes_the_backup_decide_without_one_and_leaves_its_file(tmp_path):
    (tmp_path / "acl").write_text("deny all all\n")
    backup = Authority(Credentials(), Acl.load(tmp_path / "acl"))
    primary = Authority(Credentials())
    access.AccessReplica(backup, tmp_path / "acl").apply(access.encode(primary))
    assert type(backup.policy) is Policy
    assert (tmp_path / "acl").read_text() == "deny all all\n"


def test_applying_the_same_state_again_changes_nothing_and_tells_no_one(tmp_path):
    message = access.encode(primary_authority())
    backup = Authority(Credentials(tmp_path / "users.json"))
    replica = access.AccessReplica(backup, None)
    replica.apply(message)
    heard: list[int] = []
    backup.listeners.append(lambda: heard.append(1))
    replica.apply(message)
    assert heard == []


@pytest.mark.parametrize("message, complaint", [
    ({"type": "access"}, "expected an object with 'users'"),
    ({"type": "access", "users": {"bob": "x"}, "acl": None}, "user 'bob': expected an object"),
    ({"type": "access", "users": {"bad name": {}}, "acl": None}, "invalid name"),
    ({"type": "access", "users": {"bob": {"scram-sha-256": {"salt": "x"}}}, "acl": None}, "SCRAM secret"),
    ({"type": "access", "users": {}, "acl": "allow all all"}, "'acl' must be null or a map"),
    ({"type": "access", "users": {}, "acl": {"source": "f", "text": "permit all all"}}, "f line 1"),
])
def test_a_malformed_access_message_is_refused_whole_and_changes_nothing(tmp_path, message, complaint):
    backup = Authority(Credentials(tmp_path / "users.json"))
    backup.users.add("kept", "pw", [])
    with pytest.raises(ValueError, match=complaint):
        access.AccessReplica(backup, tmp_path / "acl").apply(message)
    assert "kept" in backup.users
    assert not (tmp_path / "acl").exists()
