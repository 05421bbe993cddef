"""``serve --supervise``: a broker process that dies is replaced before its lease could expire.

The lease TTL here is 20 s, so a backup that wins within a few seconds of
the kill won because the supervisor revoked the dead node's lease, not
because it expired.  A plain client (URL list, ordinary reconnect) checks
that nothing acknowledged is lost, and the supervisor starts the killed
node again, which rejoins as a backup of the new primary.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from hastandby.testing.numbered_client import NumberedSender, drain
from hastandby.testing.etcd_ha import EtcdHa
from hastandby.testing.waiting import wait_for

pytestmark = pytest.mark.etcd

LONG_TTL = 20


def broker_pid(c: EtcdHa, index: int) -> int:
    """The node process under node ``index``'s supervisor."""
    children = psutil.Process(c[index].pid).children()
    assert len(children) == 1, children
    return children[0].pid


def test_a_killed_broker_process_is_replaced_at_once_and_comes_back_as_a_backup(ha):
    c: EtcdHa = ha(3, data=True, ttl=LONG_TTL, extra=("--supervise",))
    old = c.wait_settled(timeout=30)
    c.create_queue(old, "q")
    urls = [c[i].url for i in range(3)]
    sender = NumberedSender(urls, "q", count=3000, time_limit=60, durable=True).start()
    wait_for(lambda: sender.accepted_count >= 500, 30, "a producer under way")

    killed = broker_pid(c, old)
    killed_at = time.monotonic()
    os.kill(killed, signal.SIGKILL)
    others = [i for i in range(3) if i != old]
    new, seen_at = c.wait_new_primary(others, timeout=LONG_TTL / 2)
    print(f"\nbroker process killed: {c.ids[new]} seen primary {seen_at - killed_at:.2f} s later "
          f"(lease TTL {LONG_TTL} s)")
    assert c.events(old, "dead node's lease revoked"), "the supervisor revoked the dead node's lease"

    assert sender.join(60) and sender.done, (sender.accepted_count, sender.errors)
    restarted = c.wait_following(old, new, timeout=30)  # the supervisor started it again: a backup now
    assert restarted["state"] == "backup" and broker_pid(c, old) != killed
    receiver = drain([c[new].url], "q", sender.accepted_set, time_limit=30)
    assert not receiver.missing(sender.accepted_set), receiver.missing(sender.accepted_set)[:20]


def test_sigterm_to_the_supervisor_stops_its_node_gracefully(ha):
    c: EtcdHa = ha(1, ttl=LONG_TTL, extra=("--supervise",))
    c.wait_state(0, "primary", timeout=30)
    child = psutil.Process(broker_pid(c, 0))
    assert c[0].stop() == 0
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    assert c.events(0, "lease revoked"), "the node revoked its own lease on the way out"
    assert c.events(0, "node stopped; supervisor exits")
