"""The supervisor's pure parts: what the node says of its leases, and the restart back-off."""

from hastandby.lifecycle import supervisor as s


def test_the_last_lease_the_node_named_is_the_one_to_revoke():
    assert s.parse_leases(b"") is None
    assert s.parse_leases(b"lease 17\nlease 4242\n") == 4242
    assert s.parse_leases(b"lease 17\nlease 42") == 42  # the last line may come without its newline
    assert s.parse_leases(b"lease 17\nlease x\nnoise\n") == 17  # what is not a lease line is ignored


def test_the_back_off_doubles_while_the_node_dies_early_and_starts_over_after_a_stable_run():
    assert s.next_delay(s.FIRST_DELAY, ran_for=1.0) == 2 * s.FIRST_DELAY
    assert s.next_delay(20.0, ran_for=1.0) == s.MAX_DELAY
    assert s.next_delay(s.MAX_DELAY, ran_for=s.STABLE_AFTER) == s.FIRST_DELAY
