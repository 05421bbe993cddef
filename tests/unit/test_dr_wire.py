"""DR's wire messages (dr/protocol.py): each round-trips through AMQP, each sender puts on the wire the map it
sent before the messages were typed (same keys, same order, same types, the same bytes), and every bad field is
refused with a ``ProtocolError`` naming it."""

from __future__ import annotations

from typing import Any

import pytest
from proton import Message, symbol

from hastandby.broker.queues.idset import IdSet
from hastandby.broker.queues.lineage import Epoch
from hastandby.broker.message.values import plain
from hastandby.dr.protocol import (
    ACK_PROPERTY,
    EPOCH_PROPERTY,
    KEY_PROPERTY,
    LINEAGE_PROPERTY,
    MAX_BYTES_PROPERTY,
    MAX_COUNT_PROPERTY,
    MODE_PROPERTY,
    REPLICA_PROPERTY,
    SYNC_PROPERTY,
    Ack,
    AttachReply,
    LinkRequest,
    ReplicaIdentity,
    StatusReport,
    decode_ordered_batch,
)
from hastandby.replication.codec import (
    DECODE_ERROR,
    IDS_PROPERTY,
    INVALID_FIELD,
    ProtocolError,
    decode_body,
    decode_control,
    encode_batch,
    encode_control,
)

LINEAGE = (Epoch(3, "n1", 1), Epoch(5, "n2", 40))
LINEAGE_WIRE = [[3, "n1", 1], [5, "n2", 40]]


def amqp(value: Any) -> bytes:
    """``value`` AMQP-encoded (as a message body: the same encoding as link and connection properties)."""
    return bytes(Message(body=value).encode())


def over_the_wire(value: Any) -> Any:
    """``value`` as the peer reads it: encoded, decoded, turned into plain values (string keys)."""
    return plain(decode_body(amqp(value), "test"))


def same_map(new: dict[Any, Any], old: dict[Any, Any]) -> None:
    """Equal, with the same keys in the same order, of the same types, encoding to the same bytes."""
    assert new == old
    assert list(new) == list(old)
    assert [type(k) for k in new] == [type(k) for k in old]
    assert [type(v) for v in new.values()] == [type(v) for v in old.values()]
    assert amqp(new) == amqp(old)


def refused(decode: Any, field: str, condition: str = INVALID_FIELD) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        decode()
    assert caught.value.field == field and caught.value.condition == condition
    assert str(caught.value).startswith(f"{field}: ")
    return caught.value


# -- the replica's connection property -------------------------------------------------------------------------


def test_replica_identity_round_trips_and_is_the_map_it_always_was() -> None:
    me = ReplicaIdentity("dr1", "dr1.example:5672")
    same_map(me.to_wire(), {"node_id": "dr1", "url": "dr1.example:5672"})
    assert ReplicaIdentity.from_wire(over_the_wire(me.to_wire())) == me


def test_replica_identity_is_named_by_url_then_node_id() -> None:
    assert ReplicaIdentity("dr1", "h:1").name == "h:1"
    assert ReplicaIdentity.from_wire({"node_id": "dr1"}).name == "dr1"
    assert ReplicaIdentity.from_wire({"other": 1}) == ReplicaIdentity("", "")  # unknown keys ignored
    assert ReplicaIdentity.from_wire({}).name == "?"


@pytest.mark.parametrize("value, field", [
    ("dr1", "hastandby.dr-replica"),
    ({"node_id": 7, "url": "h:1"}, "hastandby.dr-replica.node_id"),
    ({"node_id": "dr1", "url": ["h", 1]}, "hastandby.dr-replica.url"),
])
def test_a_bad_replica_identity_is_refused_naming_the_field(value: Any, field: str) -> None:
    refused(lambda: ReplicaIdentity.from_wire(value), field)


# -- the replica's link request --------------------------------------------------------------------------------


def test_a_full_link_request_is_the_map_the_replica_always_sent() -> None:
    request = LinkRequest("full", "k1", "e1", LINEAGE, sync=False, ack=True, ids=IdSet.from_ids([1, 2, 3, 7]))
    same_map(request.to_wire(), {MODE_PROPERTY: "full", KEY_PROPERTY: "k1", EPOCH_PROPERTY: "e1",
                                 LINEAGE_PROPERTY: LINEAGE_WIRE, SYNC_PROPERTY: False, ACK_PROPERTY: True,
                                 IDS_PROPERTY: [1, 3, 7, 7]})


def test_an_enqueue_link_request_is_the_map_the_replica_always_sent() -> None:
    request = LinkRequest("enqueue", "k1", "", (), sync=True, ack=True, max_backlog_count=10)
    same_map(request.to_wire(), {MODE_PROPERTY: "enqueue", KEY_PROPERTY: "k1", EPOCH_PROPERTY: "",
                                 LINEAGE_PROPERTY: [], SYNC_PROPERTY: True, ACK_PROPERTY: True,
                                 MAX_COUNT_PROPERTY: 10})
    both = LinkRequest("enqueue", "k1", max_backlog_count=10, max_backlog_bytes=4096)
    assert list(both.to_wire())[-2:] == [MAX_COUNT_PROPERTY, MAX_BYTES_PROPERTY]


@pytest.mark.parametrize("request_", [
    LinkRequest("full"),
    LinkRequest("full", "k1", "e1", LINEAGE, sync=True, ack=True, ids=IdSet.from_ids([1, 2, 9])),
    LinkRequest("enqueue", "k2", "e2", LINEAGE, ack=True),
    LinkRequest("enqueue", "k2", max_backlog_count=5, max_backlog_bytes=2**63 - 1),
])
def test_a_link_request_round_trips(request_: LinkRequest) -> None:
    assert LinkRequest.from_wire(over_the_wire(request_.to_wire())) == request_


def test_a_link_request_reads_absent_fields_as_defaults_and_ignores_others() -> None:
    assert LinkRequest.from_wire({"hastandby.dr-mode": "full", "x-new": [1]}) == LinkRequest("full")
    request = LinkRequest.from_wire({"hastandby.dr-mode": "enqueue", "hastandby.dr-key": "k",
                                     "hastandby.dr-max-backlog-count": 0})
    assert request.max_backlog_count is None  # 0: no bound, as the source always took it


def test_only_an_enqueue_request_needs_a_key() -> None:
    assert LinkRequest.from_wire({"hastandby.dr-mode": "full", "hastandby.dr-key": ""}).key == ""


GOOD = {"hastandby.dr-mode": "enqueue", "hastandby.dr-key": "k1"}


@pytest.mark.parametrize("changes, field", [
    ({"hastandby.dr-mode": None}, "hastandby.dr-mode"),
    ({"hastandby.dr-mode": "mirror"}, "hastandby.dr-mode"),
    ({"hastandby.dr-mode": 1}, "hastandby.dr-mode"),
    ({"hastandby.dr-key": 5}, "hastandby.dr-key"),
    ({"hastandby.dr-key": ""}, "hastandby.dr-key"),
    ({"hastandby.dr-key": "a.b"}, "hastandby.dr-key"),
    ({"hastandby.dr-epoch": 5}, "hastandby.dr-epoch"),
    ({"hastandby.dr-lineage": "n1"}, "hastandby.dr-lineage"),
    ({"hastandby.dr-lineage": [[3, "", 1]]}, "hastandby.dr-lineage"),
    ({"hastandby.dr-lineage": [[3, "n1", 5], [4, "n2", 5]]}, "hastandby.dr-lineage"),
    ({"hastandby.dr-sync": "yes"}, "hastandby.dr-sync"),
    ({"hastandby.dr-ack": 1}, "hastandby.dr-ack"),
    ({"qpid.ha-ids": [3, 1]}, "qpid.ha-ids"),
    ({"qpid.ha-ids": ["1", "2"]}, "qpid.ha-ids"),
    ({"qpid.ha-ids": 5}, "qpid.ha-ids"),
    ({"hastandby.dr-max-backlog-count": -1}, "hastandby.dr-max-backlog-count"),
    ({"hastandby.dr-max-backlog-count": True}, "hastandby.dr-max-backlog-count"),
    ({"hastandby.dr-max-backlog-count": "10"}, "hastandby.dr-max-backlog-count"),
    ({"hastandby.dr-max-backlog-bytes": 2**63}, "hastandby.dr-max-backlog-bytes"),
    ({"hastandby.dr-max-backlog-bytes": 1.5}, "hastandby.dr-max-backlog-bytes"),
])
def test_a_bad_link_request_is_refused_naming_the_property(changes: dict[str, Any], field: str) -> None:
    refused(lambda: LinkRequest.from_wire({**GOOD, **changes}), field)


# -- the source's attach reply ---------------------------------------------------------------------------------


def test_an_attach_reply_round_trips_and_is_the_map_the_source_always_sent() -> None:
    reply = AttachReply("4b0c6d1e-uuid", LINEAGE)
    same_map(reply.to_wire(), {EPOCH_PROPERTY: "4b0c6d1e-uuid", LINEAGE_PROPERTY: LINEAGE_WIRE})
    assert AttachReply.from_wire(over_the_wire(reply.to_wire())) == reply
    assert AttachReply.from_wire(over_the_wire(AttachReply("e").to_wire())) == AttachReply("e", ())


def test_an_attach_reply_without_an_epoch_is_a_refusal() -> None:
    assert AttachReply.from_wire({}) is None
    assert AttachReply.from_wire({"hastandby.dr-epoch": ""}) is None
    assert AttachReply.from_wire({"hastandby.dr-lineage": "not read without an epoch"}) is None


@pytest.mark.parametrize("properties, field", [
    ({"hastandby.dr-epoch": 5}, "hastandby.dr-epoch"),
    ({"hastandby.dr-epoch": ["e"]}, "hastandby.dr-epoch"),
    ({"hastandby.dr-epoch": "e", "hastandby.dr-lineage": {"term": 1}}, "hastandby.dr-lineage"),
    ({"hastandby.dr-epoch": "e", "hastandby.dr-lineage": [[-1, "n1", 1]]}, "hastandby.dr-lineage"),
])
def test_a_bad_attach_reply_is_refused_naming_the_property(properties: dict[str, Any], field: str) -> None:
    refused(lambda: AttachReply.from_wire(properties), field)


# -- the source's status report --------------------------------------------------------------------------------


def test_a_status_report_is_the_map_the_source_always_sent() -> None:
    same_map(StatusReport("live", 3, 0.25, 0).to_wire(),
             {"state": "live", "lag_messages": 3, "lag_seconds": 0.25, "overflow": 0})


@pytest.mark.parametrize("report", [
    StatusReport("catching up", 1200, 1.5, 0),
    StatusReport("overflow", 0, 0, 2**63 - 2),
    StatusReport(),
])
def test_a_status_report_round_trips(report: StatusReport) -> None:
    assert StatusReport.from_wire(decode_body(encode_control(report.to_wire()), "status")) == report


def test_a_status_report_ignores_what_it_does_not_know() -> None:
    body = {"state": "live", "lag_messages": None, "new_field": [1, 2], 7: "a non-string key"}
    assert StatusReport.from_wire(body) == StatusReport("live")


@pytest.mark.parametrize("body, field", [
    (["live"], "status"),
    ("live", "status"),
    ({"state": 5}, "status.state"),
    ({"state": None}, "status.state"),
    ({"lag_messages": True}, "status.lag_messages"),
    ({"lag_messages": -1}, "status.lag_messages"),
    ({"lag_messages": 2**63 - 1}, "status.lag_messages"),
    ({"lag_seconds": "1.5"}, "status.lag_seconds"),
    ({"overflow": 1.5}, "status.overflow"),
])
def test_a_bad_status_report_is_refused_naming_the_field(body: Any, field: str) -> None:
    refused(lambda: StatusReport.from_wire(body), field)


def test_an_empty_status_delivery_is_a_decode_error() -> None:
    refused(lambda: StatusReport.from_wire(decode_body(b"", "status")), "status", DECODE_ERROR)


# -- the replica's cumulative acknowledgement ------------------------------------------------------------------


def test_an_ack_round_trips_and_is_the_map_the_replica_always_sent() -> None:
    same_map(Ack(4711).to_wire(), {"through": 4711})
    assert encode_control(Ack(4711).to_wire()) == encode_control({"through": 4711})
    assert Ack.from_wire(decode_control(encode_control(Ack(4711).to_wire()))) == Ack(4711)
    assert Ack.from_wire({}) == Ack(0)


@pytest.mark.parametrize("through", [-1, 2**63 - 1, "5", True, 1.0, None, [5]])
def test_a_bad_ack_is_refused_naming_the_field(through: Any) -> None:
    refused(lambda: Ack.from_wire({"through": through}), "ack.through")


# -- batches as a replica takes them ---------------------------------------------------------------------------


def test_an_ordered_batch_decodes() -> None:
    ids, payloads = decode_ordered_batch(encode_batch([1, 2, 5], [b"a", b"b", b"c"]), 0)
    assert list(ids) == [1, 2, 5] and payloads == [b"a", b"b", b"c"]


@pytest.mark.parametrize("ids, base, field", [
    ([], 0, "batch ids"),
    ([2, 1], 0, "batch ids"),
    ([3, 3], 0, "batch ids"),
    ([5], 2**63 - 6, "batch ids"),
    ([0], 0, "batch ids"),
])
def test_a_bad_batch_is_refused_naming_its_ids(ids: list[int], base: int, field: str) -> None:
    data = encode_batch(ids, [b"m"] * len(ids))
    refused(lambda: decode_ordered_batch(data, base), field)


def test_batch_bytes_that_are_no_batch_are_a_decode_error() -> None:
    refused(lambda: decode_ordered_batch(encode_batch([1], [b"m"])[:-1], 0), "batch", DECODE_ERROR)


def test_property_keys_are_symbols() -> None:
    """Link properties must have symbol keys (proton would convert strings, but the bytes would differ)."""
    for wire in (LinkRequest("full").to_wire(), AttachReply("e").to_wire()):
        assert all(type(key) is symbol for key in wire)
    assert type(REPLICA_PROPERTY) is symbol
