"""A management request's envelope is checked before any field of it is read."""

import pytest
from proton import Message

from hastandby.broker.errors import InvalidArgument
from hastandby.broker.management import Request


def test_a_request_names_its_operation_and_object():
    request = Request(Message(properties={"operation": "query", "type": "queue", "name": "q"}, body={}), None)
    assert (request.operation, request.type, request.name, request.body) == ("QUERY", "queue", "q", {})


@pytest.mark.parametrize("properties, body, words", [
    (True, {}, "application properties must be a map"),  # fuzz (a mutated byte): was an AttributeError
    ({"operation": "CREATE"}, [1, 2], "body must be a map"),
])
def test_a_malformed_request_is_an_invalid_argument(properties, body, words):
    message = Message(body=body)
    message.properties = properties  # as a decoded wire message can hold it
    with pytest.raises(InvalidArgument, match=words):
        Request(message, None)


def test_a_ulong_argument_beyond_a_long_encodes_again_in_a_reply():
    # fuzz (seed 2, case 9540): a queue argument of 2**64 - 1 became a plain int, and QUERY's reply could
    # not be encoded (OverflowError), which closed the requester's link.
    from proton import ulong

    from hastandby.broker.message.values import plain

    arguments = plain({"qpid.max_count": ulong(2**64 - 1), "nested": [ulong(5)]})
    assert arguments == {"qpid.max_count": 2**64 - 1, "nested": [5]}
    Message(body={"arguments": arguments}).encode()
