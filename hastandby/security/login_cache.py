"""PLAIN logins that succeeded lately, so that an application reconnecting costs the node no PBKDF2.

A PLAIN client sends its password on every connection, and checking it
derives PBKDF2 (milliseconds of CPU, by design).  A login that succeeded is
remembered as an HMAC-SHA-256 of the user and the password under a key made
at random when the process starts and never written anywhere: the cache holds
no password and nothing a password could be tested against offline after the
process is gone, and the same pair next time is known right at once.

Entries belong to one ``generation`` of the users (``Credentials.generation``,
bumped by every add, password change, delete and replacement): the first use
under another generation empties the cache, so a changed password or a
removed user is never let in from it.  Bounded: the least recently used
entry goes when it is full.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os

from hastandby.security.scram import normalize

SIZE = 1024  # remembered logins: applications reconnecting, not every user ever seen


class LoginCache:
    """Recently successful (user, password) pairs, as keyed digests only."""

    def __init__(self, size: int = SIZE) -> None:
        self.size = size
        self._key = os.urandom(32)
        self._entries: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._generation = -1

    def __len__(self) -> int:
        return len(self._entries)

    def _digest(self, user: str, password: str) -> bytes:
        # Both parts are length-prefixed so that no other (user, password) pair gives the same message.
        name, secret = normalize(user), normalize(password)
        message = len(name).to_bytes(4, "big") + name + len(secret).to_bytes(4, "big") + secret
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def _at(self, generation: int) -> None:
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation

    def knows(self, user: str, password: str, generation: int) -> bool:
        """Did this pair log in under these users?"""
        self._at(generation)
        digest = self._digest(user, password)
        if digest not in self._entries:
            return False
        self._entries.move_to_end(digest)
        return True

    def remember(self, user: str, password: str, generation: int) -> None:
        """This pair logged in, checked against the users of ``generation``."""
        if generation < self._generation:
            return  # checked against users that have changed since
        self._at(generation)
        digest = self._digest(user, password)
        self._entries[digest] = None
        self._entries.move_to_end(digest)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
