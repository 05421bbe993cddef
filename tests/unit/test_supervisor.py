"""The supervisor's pure parts: what the node says of its leases, and the restart back-off."""

from hastandby.host import supervisor as s


def test_the_last_lease_the_node_named_is_the_one_to_revoke():
    assert s.parse_leases(b"") is None
    assert s.parse_leases(b"lease 17\nlease 4242\n") == 4242
    assert s.parse_leases(b"lease 17\nlease 42") == 42  # the last line may come without its newline
    assert s.parse_leases(b"lease 17\nlease x\nnoise\n") == 17  # what is not a lease line is ignored


def test_the_back_off_doubles_while_the_node_dies_early_and_starts_over_after_a_stable_run():
    assert s.next_delay(s.FIRST_DELAY, ran_for=1.0) == 2 * s.FIRST_DELAY
    assert s.next_delay(20.0, ran_for=1.0) == s.MAX_DELAY
    assert s.next_delay(s.MAX_DELAY, ran_for=s.STABLE_AFTER) == s.FIRST_DELAY


def test_after_the_node_exits_the_supervisor_cleans_up_then_revokes_its_lease():
    """``after_exit`` (removing a --virtual-ip) runs when the node has exited, before its lease is revoked,
    and a failing one does not keep the lease from being revoked."""
    import signal
    import sys

    calls: list[str] = []

    def cleanup() -> None:
        calls.append("after_exit")
        raise RuntimeError("ip failed")

    node = [sys.executable, "-c", f"import os; os.write(int(os.environ['{s.SUPERVISOR_FD}']), b'lease 42\\n')"]
    supervisor = s.Supervisor(node, None, revoke=lambda lease: calls.append(f"revoke {lease}"), after_exit=cleanup)
    handlers = {signum: signal.getsignal(signum) for signum in s.FORWARDED}  # run() installs its own
    try:
        assert supervisor.run() == 0  # the node exited 0: stopped on purpose, not started again
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert calls == ["after_exit", "revoke 42"]
