"""The driver's safety net for event handlers must itself never raise (docs/fuzz.md, "Crashes")."""

from types import SimpleNamespace

from hastandby.broker.transport.driver import Driver


def test_containing_a_handler_error_logs_and_returns():
    event = SimpleNamespace(type=SimpleNamespace(method="on_link_remote_close"), link=None, connection=None)
    Driver._contain(event, AttributeError("'int' object has no attribute 'get'"))  # raised TypeError before
