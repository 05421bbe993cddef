"""``FakeCoordinator`` passes the coordinator conformance checks (``hastandby/testing/coordinator_conformance.py``).

``tests/integration/test_etcd_coordinator.py`` runs the same checks on ``EtcdCoordinator`` and a real etcd:
what one passes and the other fails is a bug in the fake.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hastandby.testing import COORDINATOR_CHECKS, fake_world


@pytest.mark.parametrize("check", COORDINATOR_CHECKS, ids=lambda check: check.__name__)
def test_the_fake_coordinator_conforms(check: Callable[..., None]) -> None:
    check(fake_world)
