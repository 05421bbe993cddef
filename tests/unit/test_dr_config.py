"""DR replication's pure parts: configuration validation and storage, backlog limits, lag age."""

from __future__ import annotations

import json

import click
import pytest

from hastandby.broker.errors import InvalidArgument
from hastandby.cli import _parse_backlog
from hastandby.dr.config import FileStore, MemoryStore, ReplicationConfig
from hastandby.dr.protocol import tap_name
from hastandby.dr.source import Arrivals


def test_config_defaults_and_round_trip():
    config = ReplicationConfig(queue="q", source="a:1,b:2", mode="enqueue", max_backlog_count=10)
    assert config.addresses() == ["a:1", "b:2"]
    assert len(config.key) == 12 and "." not in config.key
    assert ReplicationConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("fields, words", [
    ({"queue": "", "source": "a:1"}, "queue name"),
    ({"queue": "q", "source": " , "}, "source node"),
    ({"queue": "q", "source": "a:1", "mode": "mirror"}, "invalid replication mode"),
    ({"queue": "q", "source": "a:1", "mode": "enqueue", "max_backlog_count": 0}, "positive"),
    ({"queue": "q", "source": "a:1", "max_backlog_bytes": 100}, "enqueue mode only"),
    ({"queue": "q", "source": "a:1,b:2;I."}, "invalid source address 'b:2;I.'"),  # fuzz: crashed _start later
    ({"queue": "q", "source": "a:99999"}, "invalid source address"),
])
def test_config_refuses_bad_values(fields, words):
    with pytest.raises(InvalidArgument, match=words):
        ReplicationConfig(**fields)


def test_config_from_json_ignores_unknown_fields_and_refuses_non_objects():
    text = json.dumps({"queue": "q", "source": "a:1", "future_field": 1})
    assert ReplicationConfig.from_json(text).queue == "q"
    with pytest.raises(ValueError):
        ReplicationConfig.from_json("[1]")


def test_file_store_survives_a_reload(tmp_path):
    store = FileStore(tmp_path)
    store.save(ReplicationConfig(queue="q1", source="a:1"))
    store.save(ReplicationConfig(queue="q2", source="a:1", mode="enqueue", base=7, epoch="e"))
    store.remove("q1")
    reloaded = FileStore(tmp_path).load()
    assert [(c.queue, c.mode, c.base, c.epoch) for c in reloaded] == [("q2", "enqueue", 7, "e")]


def test_file_store_refuses_a_corrupt_file(tmp_path):
    (tmp_path / "replication.json").write_text("{not json")
    with pytest.raises(SystemExit, match="replication.json"):
        FileStore(tmp_path)


def test_memory_store():
    store = MemoryStore()
    store.save(ReplicationConfig(queue="q", source="a:1"))
    store.remove("missing")
    assert [c.queue for c in store.load()] == ["q"]


@pytest.mark.parametrize("values, limits", [
    (("10000",), {"max-backlog-count": 10000}),
    (("64MB",), {"max-backlog-bytes": 64 << 20}),
    (("5000", "2kb"), {"max-backlog-count": 5000, "max-backlog-bytes": 2048}),
    (("100B",), {"max-backlog-bytes": 100}),
])
def test_parse_backlog(values, limits):
    assert _parse_backlog(values) == limits


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1.5MB", "MB"])
def test_parse_backlog_refuses(value):
    with pytest.raises(click.BadParameter):
        _parse_backlog((value,))


def test_tap_name_is_reserved():
    assert tap_name("orders", "abc123") == "$dr.abc123.orders"


def test_arrivals_age_counts_from_the_oldest_not_done():
    arrivals = Arrivals(resolution=0.0)
    assert arrivals.age(lambda i: True) == 0.0
    for msg_id in (1, 2, 3):
        arrivals.add(msg_id)
    assert arrivals.oldest(lambda i: i < 2)[0] == 2
    assert arrivals.oldest(lambda i: True) is None


def test_arrivals_sample_once_per_resolution():
    arrivals = Arrivals(resolution=60.0)
    for msg_id in range(1, 1001):
        arrivals.add(msg_id)
    assert arrivals.oldest(lambda i: False)[0] == 1
    assert arrivals.oldest(lambda i: i == 1) is None  # only the first of the burst was sampled
