"""ACL rules: parsing with line numbers, first match wins, default deny; the policy without a file."""

from __future__ import annotations

import pytest

from hastandby.security.acl import Acl, AclError, Policy, parse

RULES = """
# orders belong to alice; everyone may read the rest
allow  @admin  all
allow  alice   publish,consume   orders.*,audit
deny   all     purge
allow  all     consume,browse,publish
deny   all     all
"""


def acl() -> Acl:
    return Acl(parse(RULES, "acl.txt"), "acl.txt")


@pytest.mark.parametrize("user, groups, action, obj, allowed, line", [
    ("root", {"admin"}, "purge", "orders.1", True, 3),
    ("root", {"admin"}, "admin", "promote", True, 3),
    ("alice", set(), "publish", "orders.eu", True, 4),
    ("alice", set(), "purge", "orders.eu", False, 5),
    ("bob", set(), "consume", "orders.eu", True, 6),
    ("bob", set(), "create", "anything", False, 7),
    ("bob", set(), "admin", "promote", False, 7),
])
def test_first_matching_rule_decides(user, groups, action, obj, allowed, line):
    verdict = acl().decide(user, frozenset(groups), False, action, obj)
    assert verdict.allowed is allowed
    assert verdict.reason.endswith(f"acl.txt line {line}")


def test_nothing_matching_is_denied():
    verdict = Acl(parse("allow alice consume q"), "f").decide("bob", frozenset(), False, "consume", "q")
    assert not verdict.allowed and "no rule" in verdict.reason


def test_without_a_file_admin_needs_the_admin_group():
    policy = Policy()
    assert policy.decide("bob", frozenset(), False, "purge", "q").allowed
    assert not policy.decide("bob", frozenset(), False, "admin", "promote").allowed
    assert policy.decide("root", frozenset({"admin"}), False, "admin", "promote").allowed
    assert policy.decide("anonymous", frozenset(), True, "admin", "promote").allowed


@pytest.mark.parametrize("text, message", [
    ("allow alice", "line 1: expected"),
    ("\n\npermit alice consume", "line 3: 'permit'"),
    ("allow alice eat q", "unknown action 'eat'"),
    ("allow @ consume", "needs a group"),
    ("allow a consume , ", "empty object list"),
])
def test_mistakes_name_their_line(text, message):
    with pytest.raises(AclError, match=message):
        parse(text)


def test_load_reports_an_unreadable_file(tmp_path):
    with pytest.raises(AclError, match="cannot read"):
        Acl.load(tmp_path / "absent")
