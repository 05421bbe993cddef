"""Our clients bound every connect: an address that never answers costs its bound, then the next one is tried.

The address that never answers is a black hole on loopback
(``hastandby/testing/blackhole.py``: a connect there hangs in SYN_SENT, as one to
a node behind a cut link).  Checked: the management client gives up within
its connect timeout; ``hastandby status --all`` reports such a member after
``--connect-timeout`` and goes on; the numbered client (URL list, the
benchmarks' and tests' producer) reaches the node listed after the black hole
within its bound, and, without the bound, does not (what proton does alone).
So does rhea (``tests/rhea/url_list.js``) given the bound docs/lifecycle.md
section 11 describes, while its own idle timeout leaves it on the black
hole.  The times are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from hastandby.testing.numbered_client import NumberedSender
from hastandby.client import ManagementClient, ManagementError
from hastandby.connect_timeout import TIMED_OUT
from hastandby.testing import auth
from hastandby.testing.blackhole import BlackHole
from hastandby.testing.nodes import REPO, free_port
from hastandby.testing.waiting import wait_for

BOUND = 1.0  # seconds: the connect timeout these tests give
SLACK = 1.0  # what the bound may be exceeded by (a reactor's turn, a loaded machine)


def test_the_management_client_gives_up_an_address_that_never_answers_within_its_bound():
    with BlackHole() as hole:
        begun = time.monotonic()
        with pytest.raises(ManagementError) as raised:
            ManagementClient(hole.address, connect_timeout=BOUND)
        took = time.monotonic() - begun
    print(f"\nmanagement client, connect timeout {BOUND:g} s, black hole: error after {took:.2f} s")
    assert "no answer to connect within 1 s" in str(raised.value)
    assert not raised.value.unreachable  # something may be alive behind a cut link: not "nothing listening"
    assert BOUND <= took < BOUND + SLACK


def test_status_all_reports_a_member_that_never_answers_after_the_connect_timeout(node_factory):
    with BlackHole() as hole:
        port = free_port()
        node = node_factory("--ha-cluster", "--brokers-url", f"127.0.0.1:{port},{hole.address}", port=port)

        def hastandby(*args: str) -> tuple[subprocess.CompletedProcess, float]:
            begun = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "hastandby", "--connect-timeout", str(BOUND), *args],
                                  cwd=REPO, capture_output=True, text=True, timeout=60)
            return done, time.monotonic() - begun

        alone, start_up = hastandby("status", "-b", node.address)
        assert alone.returncode == 0, alone.stderr
        every, took = hastandby("status", "--all", "-b", node.address)
    print(f"\nstatus --all with a member that never answers: {took:.2f} s (status of one node: {start_up:.2f} s)")
    assert every.returncode == 0, every.stderr
    assert every.stdout.startswith(f"{node.address} connecting\n"), every.stdout
    assert f"{hole.address} unreachable: {hole.address}: no answer to connect within 1 s" in every.stdout
    assert took - start_up < BOUND + SLACK


def test_a_url_list_moves_past_an_address_that_never_answers_within_the_bound(node):
    with BlackHole() as hole:
        sender = NumberedSender([f"amqp://{hole.address}", node.url], "bounded", count=5, connect_timeout=BOUND,
                                time_limit=20).start()
        try:
            assert sender.join(15) and sender.done, (sender.notes, sender.errors)
        finally:
            sender.stop()
    reached = sender.links[0].t - sender.started
    print(f"\nURL list [black hole, node], connect timeout {BOUND:g} s: attached to the node after {reached:.2f} s")
    assert sender.links[0].url == node.url
    assert any(note.kind == "transport_error" and TIMED_OUT in note.detail for note in sender.notes), sender.notes
    assert reached < BOUND + SLACK


def test_without_the_bound_proton_stays_on_the_address_that_never_answers(node):
    with BlackHole() as hole:
        sender = NumberedSender([f"amqp://{hole.address}", node.url], "unbounded", count=5, connect_timeout=0,
                                time_limit=20).start()
        try:
            with pytest.raises(AssertionError):
                wait_for(lambda: sender.links, 3 * BOUND, "a link")
        finally:
            sender.stop()
            sender.join(5)


def rhea_url_list(urls: list[str], *args: str) -> dict:
    node_binary = shutil.which("node")
    script = REPO / "tests" / "rhea" / "url_list.js"
    assert node_binary, "Node.js is needed for the rhea tests (scripts/setup installs it)"
    assert (script.parent / "node_modules" / "rhea").is_dir(), "rhea is not installed: run scripts/setup"
    environment = {k: v for k, v in os.environ.items() if not k.startswith("HASTANDBY_")}
    environment.update(auth.client_environment())
    done = subprocess.run([node_binary, str(script), "--urls", ",".join(urls), *args], capture_output=True,
                          text=True, timeout=30, env=environment)
    lines = done.stdout.strip().splitlines()
    assert lines, f"rhea (exit {done.returncode}): {done.stderr}"
    return json.loads(lines[-1])


def test_rhea_moves_past_an_address_that_never_answers_only_with_a_bound_of_its_own(node):
    with BlackHole() as hole:
        urls = [f"amqp://{hole.address}", f"amqp://{node.address}"]
        bounded = rhea_url_list(urls, "--connect-timeout", str(int(BOUND * 1000)))
        idle_only = rhea_url_list(urls, "--idle-time-out", str(int(BOUND * 1000)), "--timeout", str(3 * BOUND))
    print(f"\nrhea, URL list [black hole, node]: with a {BOUND:g} s connect bound open after "
          f"{bounded.get('seconds', 0):.2f} s; with only a {BOUND:g} s idle_time_out: {idle_only}")
    assert bounded.get("opened") == urls[1] and bounded["seconds"] < BOUND + SLACK, bounded
    assert "error" in idle_only and idle_only["attempts"] == 1, idle_only
