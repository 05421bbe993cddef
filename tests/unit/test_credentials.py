"""The users file: salted secrets only, groups, atomic writes, errors that name the user."""

from __future__ import annotations

import json

import pytest

from hastandby.security.credentials import Credentials, CredentialsError


def test_users_round_trip_without_a_password_in_clear(tmp_path):
    path = tmp_path / "users.json"
    store = Credentials(path)
    store.add("alice", "wonder land", ["admin"])
    store.add("backup-1.example.com", None, ["cluster"])
    store.save()
    text = path.read_text()
    assert "wonder" not in text and "scram-sha-256" in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    again = Credentials.load(path)
    assert again.secret("alice").check("wonder land")
    assert again.groups("alice") == frozenset({"admin"})
    assert again.secret("backup-1.example.com") is None and "backup-1.example.com" in again
    assert again.describe()[0] == {"user": "alice", "groups": ["admin"], "password": True}


def test_changes_and_their_errors(tmp_path):
    store = Credentials(tmp_path / "u.json")
    store.add("bob", "one", [])
    with pytest.raises(CredentialsError, match="exists"):
        store.add("bob", "two", [])
    store.set_password("bob", "two")
    assert store.secret("bob").check("two")
    store.delete("bob")
    with pytest.raises(CredentialsError, match="no such user"):
        store.delete("bob")
    with pytest.raises(CredentialsError, match="invalid name"):
        store.add("has space", "x", [])
    with pytest.raises(CredentialsError, match="password"):
        store.add("carol", "", [])


def test_a_missing_file_is_an_empty_store(tmp_path):
    assert Credentials.load(tmp_path / "absent.json").describe() == []


@pytest.mark.parametrize("content, message", [
    ("nope", "not JSON"),
    ('{"users": []}', "expected an object with 'users'"),
    ('{"users": {"eve": {"groups": "admin"}}}', "user 'eve': groups"),
    ('{"users": {"eve": {"scram-sha-256": {"salt": "x"}}}}', "user 'eve'"),
])
def test_a_bad_file_is_refused_naming_the_problem(tmp_path, content, message):
    path = tmp_path / "users.json"
    path.write_text(content)
    with pytest.raises(CredentialsError, match=message):
        Credentials.load(path)


def test_save_needs_a_path():
    with pytest.raises(CredentialsError, match="no users file"):
        Credentials().save()
    assert json.dumps(Credentials().describe()) == "[]"
