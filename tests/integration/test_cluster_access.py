"""Users and the ACL are cluster state: a failover must not lock an application out.

Three real nodes elected by a real etcd, each with a users file and an ACL
file of its own, as on three machines (the other tests share one users file
between nodes, which would hide exactly this).  An operator works through
whichever node ``-b`` names, as a user of the CLI would: a change given to a
backup goes to the primary, which replicates it to every node's memory and
files.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proton import ConnectionException, Message
from proton.utils import BlockingConnection

from hastandby.testing import auth
from hastandby.testing.etcd_ha import EtcdHa
from hastandby.testing.nodes import REPO, NodeProcess
from hastandby.testing.waiting import wait_for

pytestmark = pytest.mark.etcd

ALLOW_ALL = "allow @admin all\nallow all all\n"
NO_PUBLISH_FOR_CAROL = "allow @admin all\ndeny carol publish orders\nallow all all\n"


class OwnFiles(EtcdHa):
    """An etcd cluster whose nodes each have their own users file and ACL file (three machines)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.files: dict[int, tuple[Path, Path]] = {}
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _make(self, index: int, *args: str) -> NodeProcess:
        if index not in self.files:
            users = self.log_dir / f"users-{index}.json"
            acl = self.log_dir / f"acl-{index}"
            shutil.copy(auth.USERS_FILE, users)
            acl.write_text(ALLOW_ALL)
            self.files[index] = (users, acl)
        users, acl = self.files[index]
        return super()._make(index, "--users-file", str(users), "--acl-file", str(acl), *args)


@pytest.fixture
def cluster(etcd, tmp_path):
    group = OwnFiles(etcd, tmp_path, 3)
    try:
        yield group.start()
    finally:
        group.stop()
        for node in group.retired + group.nodes:
            print(f"===== {node.log_path.name} =====\n{node.log()}")


def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hastandby", *args], cwd=REPO, capture_output=True, text=True,
                          input=stdin, timeout=30)


def login(address: str, user: str, password: str) -> BlockingConnection:
    return BlockingConnection(f"amqp://{user}:{password}@{address}", timeout=10)


def refused(address: str, user: str, password: str) -> bool:
    try:
        login(address, user, password).close()
    except ConnectionException as error:
        assert "unauthorized-access" in str(error) or "Authentication failed" in str(error), error
        return True
    return False


def users_in_file(path: Path) -> dict[str, dict]:
    return json.loads(path.read_text())["users"]


def send(address: str, user: str, password: str, queue: str, count: int) -> None:
    connection = login(address, user, password)
    try:
        sender = connection.create_sender(queue)
        for i in range(count):
            sender.send(Message(body=f"m{i}"))
    finally:
        connection.close()


def receive(address: str, user: str, password: str, queue: str, count: int) -> list[str]:
    connection = login(address, user, password)
    try:
        receiver = connection.create_receiver(queue, credit=count)
        bodies = []
        for _ in range(count):
            bodies.append(receiver.receive(timeout=5).body)
            receiver.accept()
        return bodies
    finally:
        connection.close()


def test_users_and_rules_follow_the_primary_through_a_failover_and_a_restart(cluster):
    primary = cluster.wait_settled()
    backups = [i for i in range(3) if i != primary]
    address = [node.address for node in cluster.nodes]

    # An operator adds a user through a backup: the backup names the primary, the CLI goes there.
    added = cli("user", "add", "carol", "-b", address[backups[0]], stdin="first-secret\n")
    assert added.returncode == 0, added.stderr
    assert f"sent to the primary, {address[primary]}" in added.stderr
    for index in range(3):  # every node has it, in memory and in its own file, within a second or so
        wait_for(lambda index=index: "carol" in users_in_file(cluster.files[index][0]), timeout=2,
                 what=f"carol in node {index}'s users file")
        listed = {u["user"] for u in cluster.nodes[index].request("USER-LIST")["users"]}
        assert "carol" in listed
    cluster.nodes[primary].request("CREATE", "queue", "orders")
    send(address[primary], "carol", "first-secret", "orders", 10)

    # kill -9 of the primary: carol logs in on the new primary and reads her messages.
    cluster.nodes[primary].kill()
    new, _ = cluster.wait_new_primary(backups, timeout=15)
    survivor = next(i for i in backups if i != new)
    assert sorted(receive(address[new], "carol", "first-secret", "orders", 10)) == sorted(f"m{i}" for i in range(10))

    # passwd through the backup, then the ACL: both reach every live node.
    changed = cli("user", "passwd", "carol", "-b", address[survivor], stdin="second-secret\n")
    assert changed.returncode == 0, changed.stderr
    wait_for(lambda: refused(address[new], "carol", "first-secret"), timeout=1.5, what="the old password refused")
    login(address[new], "carol", "second-secret").close()
    cluster.files[new][1].write_text(NO_PUBLISH_FOR_CAROL)
    reloaded = cli("acl", "reload", "-b", address[survivor])
    assert reloaded.returncode == 0, reloaded.stderr
    wait_for(lambda: cluster.files[survivor][1].read_text() == NO_PUBLISH_FOR_CAROL, timeout=2,
             what="the primary's rules in the backup's ACL file")
    with pytest.raises(Exception, match="unauthorized-access"):
        send(address[new], "carol", "second-secret", "orders", 1)

    # The old primary restarts with its stale files: it takes the cluster's users and rules.
    cluster.restart(primary).wait_ready()
    cluster.wait_following(primary, new)
    wait_for(lambda: cluster.files[primary][1].read_text() == NO_PUBLISH_FOR_CAROL, timeout=5,
             what="the restarted node's ACL file updated")
    old_secret = users_in_file(auth.USERS_FILE).get("carol")
    assert old_secret is None  # the shared test file was never touched
    assert users_in_file(cluster.files[primary][0])["carol"] == users_in_file(cluster.files[new][0])["carol"]

    # The survivor is elected next: the same users, the same rules.
    cluster.nodes[new].signal(signal.SIGTERM)
    newest, _ = cluster.wait_new_primary([primary, survivor], timeout=15)
    login(address[newest], "carol", "second-secret").close()
    assert refused(address[newest], "carol", "first-secret")
    with pytest.raises(Exception, match="unauthorized-access"):
        send(address[newest], "carol", "second-secret", "orders", 1)

    # del through a backup: carol is refused, and her open connection is closed.
    other = next(i for i in (primary, survivor) if i != newest)
    cluster.wait_following(other, newest)
    open_connection = login(address[newest], "carol", "second-secret")
    receiver = open_connection.create_receiver("orders", credit=1)
    deleted = cli("user", "del", "carol", "-b", address[other])
    assert deleted.returncode == 0, deleted.stderr
    started = time.monotonic()
    wait_for(lambda: refused(address[newest], "carol", "second-secret"), timeout=1, what="carol refused")
    with pytest.raises(Exception):
        receiver.receive(timeout=2)
    print(f"carol refused {time.monotonic() - started:.2f} s after the del")
    wait_for(lambda: "carol" not in users_in_file(cluster.files[other][0]), timeout=2,
             what="carol gone from the backup's file")


def test_a_backup_without_a_primary_refuses_user_changes_naming_none(node_factory, tmp_path):
    """A cluster node with no primary yet: user changes are refused with a clear error, nothing is written."""
    users = tmp_path / "users.json"
    shutil.copy(auth.USERS_FILE, users)
    node = node_factory("--ha-cluster", "--brokers-url", "127.0.0.1:1", "--users-file", str(users))
    result = cli("user", "add", "dave", "-b", node.address, stdin="pw\n")
    assert result.returncode != 0
    assert "cluster state" in result.stderr and "none is known now" in result.stderr, result.stderr
    assert "dave" not in users_in_file(users)
