"""The role-change hook runner and the virtual IP's worker, with real small shell scripts as the commands.

Nothing here needs root: the hook is a script that records its arguments and
environment, and the virtual IP is given scripts in place of ``ip`` and
``arping`` that record each call (the real commands run in
``tests/integration/test_virtual_ip.py``).
"""

from __future__ import annotations

import ipaddress
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from hastandby.host import role_hooks
from hastandby.host.role_hooks import OrderedWorker, RoleCommand, RoleCommandError, parse_command, role_name
from hastandby.lifecycle.states import Detail, NodeStatus, State
from hastandby.host.virtual_ip import (
    CAP_NET_ADMIN,
    CAP_NET_RAW,
    Capabilities,
    VirtualIp,
    VirtualIpError,
    check_setup,
    garp_frame,
    parse_address,
)


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def wait_lines(path: Path, count: int, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        if len(lines) >= count:
            return lines
        time.sleep(0.02)
    raise AssertionError(f"{path}: {len(lines)} lines, not {count}, after {timeout} s: {lines}")


# -- roles --------------------------------------------------------------------------------------------


def test_role_names_say_the_state_and_a_primarys_detail():
    assert role_name(NodeStatus(State.CONNECTING)) == "connecting"
    assert role_name(NodeStatus(State.CATCHUP, term=3)) == "catchup"
    assert role_name(NodeStatus(State.BACKUP, term=3)) == "backup"
    assert role_name(NodeStatus(State.PRIMARY, Detail.RECOVERING, 4)) == "primary-recovering"
    assert role_name(NodeStatus(State.PRIMARY, Detail.ACTIVE, 4)) == "primary-active"
    assert role_name(NodeStatus(State.STOPPED)) == "stopped"
    assert role_hooks.is_primary_role("primary-recovering") and role_hooks.is_primary_role("primary-active")
    assert not any(role_hooks.is_primary_role(r) for r in ("connecting", "backup", "stopped", "halted"))


# -- the hook -----------------------------------------------------------------------------------------


def test_the_hook_gets_role_cluster_and_term_as_arguments_and_in_its_environment(tmp_path):
    out = tmp_path / "calls"
    hook = script(tmp_path / "hook", f'echo "$# $1 $2 $3|$HASTANDBY_ROLE $HASTANDBY_CLUSTER $HASTANDBY_TERM '
                                     f'$HASTANDBY_NODE_ID $HASTANDBY_PREVIOUS_ROLE|$HOOK_EXTRA" >> {out}\n')
    os.environ["HOOK_EXTRA"] = "inherited"
    try:
        command = RoleCommand(f"{hook}", "orders", "n1", timeout=5)
        command.role_changed("connecting", 0)
        command.role_changed("primary-recovering", 7)
        assert command.close(10)
    finally:
        del os.environ["HOOK_EXTRA"]
    assert out.read_text().splitlines() == [
        "3 connecting orders 0|connecting orders 0 n1 |inherited",
        "3 primary-recovering orders 7|primary-recovering orders 7 n1 connecting|inherited",
    ]


def test_a_command_with_arguments_is_split_like_shell_words_and_keeps_them_first(tmp_path):
    out = tmp_path / "calls"
    hook = script(tmp_path / "hook", f'echo "$@" >> {out}\n')
    command = RoleCommand(f"{hook} --zone 'eu west'", "c", "n1", timeout=5)
    command.role_changed("backup", 2)
    assert command.close(10)
    assert out.read_text().splitlines() == ["--zone eu west backup c 2"]


def test_calls_run_in_order_one_at_a_time_off_the_callers_thread(tmp_path):
    out = tmp_path / "calls"
    # Each call notes its start and end: overlapping calls would interleave them.
    hook = script(tmp_path / "hook", f'echo "start $1" >> {out}; sleep 0.1; echo "end $1" >> {out}\n')
    command = RoleCommand(str(hook), "c", "n1", timeout=5)
    roles = ["connecting", "catchup", "backup", "primary-recovering", "primary-active", "stopped"]
    started = time.monotonic()
    for role in roles:
        command.role_changed(role, 5)
    queued_in = time.monotonic() - started
    assert queued_in < 0.05, f"role_changed blocked its caller for {queued_in:.3f} s"
    assert command.close(20)
    assert out.read_text().splitlines() == [f"{edge} {role}" for role in roles for edge in ("start", "end")]


def test_a_hook_past_its_timeout_is_killed_with_its_children_logged_and_the_next_call_runs(tmp_path):
    out = tmp_path / "calls"
    child_pid = tmp_path / "child.pid"
    # The script leaves a child behind that holds stdout open: killing the script alone would not do.
    hook = script(tmp_path / "hook", f'if [ "$1" = backup ]; then sleep 30 & echo $! > {child_pid}; sleep 30; fi\n'
                                     f'echo "$1" >> {out}\n')
    command = RoleCommand(str(hook), "c", "n1", timeout=0.5)
    with capture_logs() as logs:
        started = time.monotonic()
        command.role_changed("backup", 1)
        command.role_changed("primary-recovering", 2)
        assert command.close(10)
        took = time.monotonic() - started
    assert took < 3, f"the timed-out hook held the worker {took:.1f} s"
    assert out.read_text().splitlines() == ["primary-recovering"]
    timed_out = [e for e in logs if e["event"] == "role-change hook timed out; killed"]
    assert len(timed_out) == 1 and timed_out[0]["role"] == "backup" and timed_out[0]["log_level"] == "error"
    pid = int(child_pid.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid):
        time.sleep(0.02)
    assert not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid), "the hook's child outlived the kill"


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def test_a_failing_hook_is_logged_with_its_status_and_output_and_the_node_goes_on(tmp_path):
    hook = script(tmp_path / "hook", 'echo "cannot move the address for $1" >&2; exit 3\n')
    command = RoleCommand(str(hook), "c", "n1", timeout=5)
    with capture_logs() as logs:
        command.role_changed("primary-active", 9)
        command.role_changed("connecting", 9)
        assert command.close(10)
    failed = [e for e in logs if e["event"] == "role-change hook failed"]
    assert [e["role"] for e in failed] == ["primary-active", "connecting"]
    assert failed[0]["returncode"] == 3 and failed[0]["term"] == 9
    assert failed[0]["output"] == "cannot move the address for primary-active"


def test_a_hook_that_cannot_start_is_logged(tmp_path):
    hook = script(tmp_path / "hook", "exit 0\n")
    command = RoleCommand(str(hook), "c", "n1", timeout=5)
    hook.unlink()  # gone after the start-up check
    with capture_logs() as logs:
        command.role_changed("backup", 1)
        assert command.close(10)
    assert [e["event"] for e in logs] == ["role-change hook could not start"]


def test_the_command_is_checked_at_start(tmp_path):
    with pytest.raises(RoleCommandError, match="empty"):
        parse_command("  ")
    with pytest.raises(RoleCommandError, match="not an executable file"):
        parse_command(f"{tmp_path / 'missing'} arg")
    with pytest.raises(RoleCommandError, match="not on PATH"):
        parse_command("no-such-hook-command-here")
    with pytest.raises(RoleCommandError, match="cannot split"):
        parse_command("hook 'unclosed")
    assert parse_command("true 'a b'") == ["true", "a b"]


def test_a_worker_job_that_raises_is_logged_and_the_next_one_runs():
    worker = OrderedWorker("test-worker")
    ran: list[int] = []

    def bad() -> None:
        raise RuntimeError("boom")

    with capture_logs() as logs:
        worker.submit(bad)
        worker.submit(lambda: ran.append(1))
        assert worker.close(5)
    assert ran == [1]
    assert [e["event"] for e in logs] == ["worker job failed"]


def test_close_is_bounded_when_a_job_hangs():
    worker = OrderedWorker("test-worker")
    release = threading.Event()
    worker.submit(lambda: release.wait(10))
    started = time.monotonic()
    assert not worker.close(0.2)
    assert time.monotonic() - started < 1
    release.set()


# -- the virtual IP's worker, with a script for ip and a recorder for the announcements -----------------


@pytest.fixture
def fake_ip(tmp_path):
    """An ``ip`` stand-in that records each call; ``ip address add`` of a held address fails as ip does."""
    calls = tmp_path / "calls"
    held = tmp_path / "held"
    ip = script(tmp_path / "ip", f"""echo "ip $*" >> {calls}
case "$2" in
  add) if [ -e {held} ]; then echo "Error: ipv4: Address already assigned." >&2; exit 2; fi; touch {held} ;;
  del) if [ ! -e {held} ]; then echo "Error: ipv4: Address not found." >&2; exit 2; fi; rm {held} ;;
esac
""")
    return ip, calls, held


def make_vip(fake_ip, interval: float = 0.05, count: int = 3) -> VirtualIp:
    ip, calls, _ = fake_ip

    def announce(interface: str, address: ipaddress.IPv4Address) -> None:
        with open(calls, "a") as out:
            out.write(f"garp {interface} {address}\n")

    return VirtualIp(ipaddress.IPv4Interface("10.78.0.100/24"), "eth9", ip_command=(str(ip),), announce=announce,
                     command_timeout=5, announce_interval=interval, announcements=count)


GARP = "garp eth9 10.78.0.100"


def test_the_address_is_removed_at_start_added_and_announced_when_serving_and_removed_after(fake_ip):
    _, calls, held = fake_ip
    vip = make_vip(fake_ip)
    with capture_logs() as logs:
        vip.start()
        wait_lines(calls, 1)  # (a request queued before this removal ran would overtake it)
        vip.serving(True)
        assert vip.close(10)
    assert calls.read_text().splitlines() == [
        "ip address del 10.78.0.100/24 dev eth9",
        "ip address add 10.78.0.100/24 dev eth9",
        GARP, GARP, GARP,
    ]
    assert held.exists()
    assert [e["event"] for e in logs] == ["virtual IP not held", "virtual IP added", "virtual IP announced"]
    vip = make_vip(fake_ip)
    with capture_logs() as logs:
        vip.serving(True)  # already held: not an error
        wait_lines(calls, 6)
        vip.serving(False)
        assert vip.close(10)
    assert not held.exists()
    assert [e.get("already") for e in logs if e["event"] == "virtual IP added"] == [True]


def test_a_request_overtaken_by_a_later_one_is_skipped_and_the_last_one_wins(fake_ip):
    _, calls, held = fake_ip
    vip = make_vip(fake_ip)
    gate = threading.Event()
    assert vip._worker is None
    vip.start()
    assert vip._worker is not None
    vip._worker.submit(lambda: gate.wait(5))  # hold the worker while three requests queue up
    vip.serving(True)
    vip.serving(False)
    vip.serving(True)
    gate.set()
    assert vip.close(10)
    # The removal at start and the first two requests were overtaken: only the last one ran.
    assert calls.read_text().splitlines() == ["ip address add 10.78.0.100/24 dev eth9", GARP, GARP, GARP]
    assert held.exists()


def test_a_removal_stops_the_announcements_at_once(fake_ip):
    _, calls, held = fake_ip
    vip = make_vip(fake_ip, interval=20)
    vip.serving(True)
    wait_lines(calls, 2)  # added, and the first announcement sent; the next is 20 s away
    started = time.monotonic()
    with capture_logs() as logs:
        vip.serving(False)
        assert vip.close(10)
    assert time.monotonic() - started < 2, "the removal waited for the announcements"
    assert calls.read_text().splitlines() == ["ip address add 10.78.0.100/24 dev eth9", GARP,
                                              "ip address del 10.78.0.100/24 dev eth9"]
    assert not held.exists()
    assert "virtual IP announcements stopped by a removal" in [e["event"] for e in logs]


def test_a_failing_ip_command_or_announcement_is_logged(tmp_path):
    ip = script(tmp_path / "ip", 'echo "RTNETLINK answers: Operation not permitted" >&2; exit 2\n')
    vip = VirtualIp(ipaddress.IPv4Interface("10.78.0.100/24"), "eth9", ip_command=(str(ip),))
    with capture_logs() as logs:
        vip.serving(True)
        vip.serving(False)
        assert vip.close(10)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert [e["event"] for e in errors] == ["virtual IP not removed"]  # the add was overtaken by the removal
    assert "Operation not permitted" in errors[0]["output"]

    def down(interface: str, address: ipaddress.IPv4Address) -> None:
        raise OSError(100, "Network is down")

    vip = VirtualIp(ipaddress.IPv4Interface("10.78.0.100/24"), "eth9", ip_command=("true",), announce=down)
    with capture_logs() as logs:
        vip.serving(True)
        assert vip.close(10)
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["virtual IP announcement failed"]


def test_the_gratuitous_arp_is_what_arping_u_sends():
    mac = bytes.fromhex("02fc00000001")
    frame = garp_frame(mac, ipaddress.IPv4Address("10.78.0.100"))
    assert len(frame) == 60
    assert frame[:6] == b"\xff" * 6 and frame[6:12] == mac and frame[12:14] == b"\x08\x06"
    # hardware Ethernet, protocol IPv4, sizes 6 and 4, a request; sender = target = the address, target MAC 0
    assert frame[14:22] == bytes.fromhex("0001080006040001")
    assert frame[22:28] == mac and frame[28:32] == bytes([10, 78, 0, 100])
    assert frame[32:38] == bytes(6) and frame[38:42] == bytes([10, 78, 0, 100])
    assert frame[42:] == bytes(18)


# -- checks at start -------------------------------------------------------------------------------------


def test_the_address_needs_a_prefix_and_ipv4():
    assert parse_address("10.0.0.100/24") == ipaddress.IPv4Interface("10.0.0.100/24")
    with pytest.raises(VirtualIpError, match="prefix"):
        parse_address("10.0.0.100")
    with pytest.raises(VirtualIpError, match="IPv4"):
        parse_address("fd00::1/64")
    with pytest.raises(VirtualIpError, match="not an address"):
        parse_address("10.0.0.300/24")


def caps(euid: int, effective: int = 0, bounding: int = 0, ambient: int = 0) -> Capabilities:
    status = (f"Name:\thastandby\nCapInh:\t0\nCapPrm:\t{effective:016x}\nCapEff:\t{effective:016x}\n"
              f"CapBnd:\t{bounding:016x}\nCapAmb:\t{ambient:016x}\n")
    return Capabilities.parse(status, euid)


NET = 1 << CAP_NET_ADMIN | 1 << CAP_NET_RAW


def test_privileges_root_needs_them_in_its_bounding_set_others_as_ambient_capabilities():
    assert caps(0, NET, NET).children_have(CAP_NET_ADMIN)
    assert not caps(0, NET, 1 << CAP_NET_RAW).children_have(CAP_NET_ADMIN)
    assert not caps(1000, NET, NET).children_have(CAP_NET_ADMIN)  # effective only: ip would not get it
    assert caps(1000, NET, NET, NET).children_have(CAP_NET_ADMIN)


def test_a_missing_privilege_is_named_at_start():
    address = ipaddress.IPv4Interface("10.78.0.100/24")
    with pytest.raises(VirtualIpError, match="CAP_NET_ADMIN.*uid 1000.*AmbientCapabilities"):
        check_setup(address, "lo", capabilities=caps(1000, NET, NET), arp_socket=False)
    with pytest.raises(VirtualIpError, match="CAP_NET_ADMIN.*root, but without them in its capability bounding"):
        check_setup(address, "lo", capabilities=caps(0, 1 << CAP_NET_RAW, 1 << CAP_NET_RAW), arp_socket=False)
    with pytest.raises(VirtualIpError, match="privilege CAP_NET_RAW"):
        check_setup(address, "lo", capabilities=caps(1000, 1 << CAP_NET_ADMIN, NET, 1 << CAP_NET_ADMIN),
                    arp_socket=False)
    with pytest.raises(VirtualIpError, match="on PATH"):
        check_setup(address, "lo", ip="no-such-ip-here", capabilities=caps(0, NET, NET), arp_socket=False)
    with pytest.raises(VirtualIpError, match="no-such-if0: no such interface"):
        check_setup(address, "no-such-if0", capabilities=caps(0, NET, NET), arp_socket=False)
    check_setup(address, "lo", capabilities=caps(0, NET, NET), arp_socket=False)  # root with both: nothing missing
