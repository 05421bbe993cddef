"""The cache of PLAIN logins: a hit costs no PBKDF2, a change of users empties it, and it holds no password."""

from __future__ import annotations

import pickle

from hastandby.security.credentials import Credentials
from hastandby.security.login_cache import LoginCache


def test_a_login_remembered_is_known_and_only_that_pair():
    cache = LoginCache()
    cache.remember("alice", "wonder", 0)
    assert cache.knows("alice", "wonder", 0)
    assert not cache.knows("alice", "Wonder", 0)
    assert not cache.knows("alic", "ewonder", 0)  # no pair can pose as another by moving the split
    assert not cache.knows("bob", "wonder", 0)


def test_it_is_emptied_by_every_change_of_the_users(tmp_path):
    users = Credentials(tmp_path / "users.json")
    users.add("alice", "wonder", [])
    users.add("bob", "builder", [])
    cache = LoginCache()
    changes = [lambda: users.set_password("alice", "land"), lambda: users.delete("bob"),
               lambda: users.add("carol", "c", []), lambda: users.replace(Credentials())]
    for change in changes:
        cache.remember("alice", "wonder", users.generation)
        assert cache.knows("alice", "wonder", users.generation)
        change()
        assert not cache.knows("alice", "wonder", users.generation)
        assert len(cache) == 0


def test_a_check_made_before_a_change_is_not_remembered_after_it():
    cache = LoginCache()
    assert not cache.knows("alice", "wonder", 3)  # the cache is at generation 3 now
    cache.remember("alice", "old", 2)
    assert len(cache) == 0


def test_it_is_bounded_least_recently_used_first():
    cache = LoginCache(size=2)
    cache.remember("a", "1", 0)
    cache.remember("b", "2", 0)
    assert cache.knows("a", "1", 0)  # a is now the most recently used
    cache.remember("c", "3", 0)
    assert cache.knows("a", "1", 0) and cache.knows("c", "3", 0) and not cache.knows("b", "2", 0)


def test_the_cache_holds_neither_password_nor_anything_a_key_free_copy_could_test():
    cache = LoginCache()
    cache.remember("alice", "correct horse battery staple", 0)
    state = pickle.dumps(cache._entries)
    assert b"correct horse" not in state and b"alice" not in state
    other = LoginCache()  # another process's key: the same pair gives another digest
    assert other._digest("alice", "correct horse battery staple") not in cache._entries
