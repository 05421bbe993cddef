"""Queues that do more than FIFO: priorities, a delivery limit, a single active consumer, duplicate
detection, last values, message groups (docs/queues.md).

A plain queue (``queue.Queue``) pays nothing for these: each feature is a
class that overrides the few ``Queue`` methods it changes, and the registry
picks the class once, when the queue is declared (``queue_class``), from its
validated settings.  Features combine by composing the classes (a priority
queue with a single active consumer is both); nothing on the plain path asks
whether a queue has one.

Every feature depends only on what every node holds alike, so a backup's
replica (declared from the same arguments by wiring replication) and a node
restarted on its journal behave as the primary did:

- **Priorities** (``qpid.priorities``, 1-10 levels): the order is a pure
  function of (level, replication id): the highest level first, and within a
  level the replication id, which is arrival order.  A replica holds the same
  ids and reads the same header bytes, so it orders its messages exactly as
  its primary; after a promotion they go out in that order.  The level comes
  from the header's ``priority`` (0-255, 4 when absent), mapped as Qpid's
  ``PriorityQueue::getPriorityLevel`` did (the AMQP 0-10 rule): with N
  levels, priorities up to ``5 - min(5, ceil(N / 2))`` share level 0 and each
  one above it takes the next level, up to N - 1.  With 10 levels priority p
  is level min(p, 9); with 2, priorities 0-4 are low and 5-9 high.
- **Delivery limit** (``x-delivery-limit``): a failed delivery (``modified``
  with delivery-failed, or a lost link or connection while the message was
  unsettled) counts; when a message's count reaches the limit it leaves the
  queue for the alternate exchange (``Registry.dead_letter``) instead of
  going back.  Counts are replicated and journaled (``Queue.delivery_counted``).
- **Single active consumer** (``x-single-active-consumer``): only the first
  of the queue's consumers (in attach order) is given messages; when it goes,
  the next one is the first.  Nothing to replicate: consumers attach to the
  primary only, and after a failover the first to attach to the new primary
  is the active one.
- **Duplicate detection** (``x-dedup-window``): a message whose message-id
  the queue enqueued within the window is accepted and not enqueued again.
  The remembered ids are replicated (a replica remembers what it is given,
  and its primary sends each id with its time: a ``u`` control) and
  journaled with durable messages, so a producer that re-sends after a
  failover or a restart makes no duplicate.
- **Last-value queues** (``qpid.last_value_queue_key``): a message whose
  application property KEY has the value of an older message's replaces it
  (the older one is dequeued, reason ``replaced``).  Which one is the last is
  a pure function of (value, replication id): the higher id.  The primary's
  dequeue reaches its backups as any other; a replica (declared alike) also
  drops an older message the moment it holds a newer one of the same value,
  so no replaced message survives a failover, and a batch that arrives late
  is dropped if something newer is there already.
- **Message groups** (``qpid.group_header_key``, ``qpid.shared_msg_group``):
  the messages with the same value of application property HEADER (those
  without it: the group ``qpid.no-group``) go to one consumer at a time, the
  group's *owner*, from the delivery that gave it the group until it has
  settled (or released, or lost with its link) every message of the group it
  holds; then the group is free for whichever consumer is next.  Ownership is
  state of the primary only, like consumers themselves: a backup holds the
  same messages, nobody owns anything there, and after a failover groups start
  free, owned again as consumers attach to the new primary.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Any, Callable, Iterable, Sequence

from hastandby.broker.message import sections
from hastandby.broker.queues.completion import Completion
from hastandby.broker.queues.queue import Consumer, Queue, QueueSettings

DeadLetter = Callable[[Queue, bytes, str], None]

INDEX_COMPACT_MIN = 1024
"""A priority index drops the entries of removed messages once there are more
of them than this, and more than the messages on the queue: on a backup,
whose replica nobody consumes, every replicated dequeue leaves one."""


def priority_levels(levels: int) -> bytes:
    """For each header priority 0-255, its level on a queue of ``levels`` levels (Qpid's mapping)."""
    first = 5 - min(5, math.ceil(levels / 2))
    return bytes(0 if p <= first else min(p - first, levels - 1) for p in range(256))


class PriorityIndex:
    """The ids of a priority queue's messages by level, each level in id order; a queue observer.

    A level's list may still hold ids that are gone (removed, or acquired
    below its head): they are skipped where read, and dropped by
    ``compact``.  Below a level's head every id is acquired or gone; a
    release or an enqueue below it moves the head back.
    """

    follows_acquisitions = False  # QueueObserver: told of enqueues and removals only

    def __init__(self, queue: Queue, levels: int) -> None:
        self.queue = queue
        self.table = priority_levels(levels)
        self.levels: list[list[int]] = [[] for _ in range(levels)]
        self.heads = [0] * levels
        self.removed = 0  # removals since the last compaction

    def level(self, data: bytes) -> int:
        return self.table[sections.header_priority(data)]

    def add(self, msg_id: int, level: int) -> None:
        """``msg_id`` is (again) on the queue at ``level``."""
        ids = self.levels[level]
        if not ids or msg_id > ids[-1]:
            ids.append(msg_id)
            return
        at = bisect_left(ids, msg_id)
        if at == len(ids) or ids[at] != msg_id:
            ids.insert(at, msg_id)
        if at < self.heads[level]:
            self.heads[level] = at

    def compact(self) -> None:
        """Keep only the entries of messages still on the queue, from each head on."""
        present = set(self.queue.ids())
        for level, ids in enumerate(self.levels):
            self.levels[level] = [msg_id for msg_id in ids[self.heads[level]:] if msg_id in present]
            self.heads[level] = 0
        self.removed = 0

    def ordered(self) -> list[int]:
        """The ids of the messages on the queue (acquired ones too) in queue order (management, tests)."""
        return [msg_id for _, msg_id in sorted((-self.level(data), msg_id) for msg_id, data in self.queue.messages())]

    # -- QueueObserver ----------------------------------------------------------------------

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Completion | None) -> None:
        level = self.table[sections.header_priority(data)]
        ids = self.levels[level]
        if ids and msg_id <= ids[-1]:
            self.add(msg_id, level)
        else:  # the usual case, inlined: a new message is the last of its level
            ids.append(msg_id)

    def acquired(self, queue: Queue, msg_id: int) -> None:
        pass

    def released(self, queue: Queue, msg_id: int) -> None:
        pass

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        self.removed += 1
        if not queue._dispatching and self.removed > INDEX_COMPACT_MIN and self.removed > queue.depth:
            self.compact()


class PriorityQueue(Queue):
    """Highest level first, FIFO (replication id order) within a level; browsers see that order too.

    Replicating browsers (``sees_acquired``) still read in id order: what a
    backup must receive is every message under its id, and it orders them
    itself.
    """

    def __init__(self, name: str, settings: QueueSettings, object_uuid: str | None = None) -> None:
        super().__init__(name, settings, object_uuid)
        self.priority_index = PriorityIndex(self, settings.priorities)
        self._cursors: dict[int, list[int]] = {}  # id(browser) -> the last id it saw on each level
        self.add_observer(self.priority_index)

    def restore(self, ids: list[int], payloads: list[bytes], ttls: dict[int, int] | None = None,
                counts: dict[int, int] | None = None) -> None:
        super().restore(ids, payloads, ttls, counts)
        index = self.priority_index
        for msg_id, payload in zip(ids, payloads):
            index.add(msg_id, index.level(payload))
        self.dispatch()

    def _dispatch_consumers(self, consumers: list[Consumer]) -> None:
        index = self.priority_index
        if index.removed > INDEX_COMPACT_MIN and index.removed > self.depth:
            index.compact()
        levels, heads, acquired = index.levels, index.heads, self._acquired
        for level in range(len(levels) - 1, -1, -1):
            ids = levels[level]
            at = heads[level]
            while at < len(ids):
                msg_id = ids[at]
                held = self._ids  # ``_index`` inlined: the message still here, not acquired?
                where = bisect_left(held, msg_id)
                if where == len(held) or held[where] != msg_id or self._data[where] is None or msg_id in acquired:
                    at += 1
                    continue
                consumer = self._next_consumer(consumers)
                if consumer is None:
                    heads[level] = at
                    return
                at += 1
                heads[level] = at
                self._hand_over(consumer, msg_id, where)
            heads[level] = at
            if at > INDEX_COMPACT_MIN and at * 2 > len(ids):  # consumed in order: cut the prefix
                levels[level] = ids[at:]
                heads[level] = 0

    def _dispatch_browser(self, browser: Consumer) -> None:
        if browser.sees_acquired:  # a replicating browser: every message, in id order
            super()._dispatch_browser(browser)
            return
        levels = self.priority_index.levels
        cursor = self._cursors.get(id(browser))
        if cursor is None:
            cursor = self._cursors[id(browser)] = [0] * len(levels)
        acquired, counts = self._acquired, self._delivery_counts
        for level in range(len(levels) - 1, -1, -1):
            ids = levels[level]
            at = bisect_right(ids, cursor[level])
            while at < len(ids):
                if browser.credit <= 0:
                    return
                msg_id = ids[at]
                at += 1
                cursor[level] = msg_id
                where = self._index(msg_id)
                if where is None or msg_id in acquired:
                    continue
                payload = self._data[where]
                assert payload is not None  # _index finds only messages still here
                browser.deliver(self, msg_id, payload, counts.get(msg_id, 0) if counts else 0)
                if levels[level] is not ids:  # changed while delivering: read it again next time
                    break

    def remove_consumer(self, consumer: Consumer) -> None:
        super().remove_consumer(consumer)
        self._cursors.pop(id(consumer), None)

    def release(self, msg_id: int, delivery_failed: bool) -> None:
        if msg_id in self._acquired:
            data = self.get(msg_id)
            if data is not None:
                index = self.priority_index
                index.add(msg_id, index.level(data))
        super().release(msg_id, delivery_failed)

    def ordered_ids(self) -> list[int]:
        """The ids of the messages on the queue in the order consumers get them."""
        return self.priority_index.ordered()

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["priorities"] = self.settings.priorities
        return described


class DeliveryLimitQueue(Queue):
    """A message whose delivery failed ``x-delivery-limit`` times leaves for the alternate exchange."""

    dead_letter: DeadLetter | None = None  # set by the registry: routes it (or drops it, with a log line)

    def release(self, msg_id: int, delivery_failed: bool) -> None:
        if (delivery_failed and msg_id in self._acquired
                and self._delivery_counts.get(msg_id, 0) + 1 >= self.settings.delivery_limit):
            del self._acquired[msg_id]
            data = self.dequeue(msg_id, "delivery-limit")
            if data is not None:
                self.stats["dead_lettered"] += 1
                if self.dead_letter is not None:
                    self.dead_letter(self, data, "delivery-limit")
            return
        super().release(msg_id, delivery_failed)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["delivery_limit"] = self.settings.delivery_limit
        return described


class SingleActiveConsumerQueue(Queue):
    """Only the first consumer (in attach order) gets messages; the others wait their turn."""

    def _dispatch_consumers(self, consumers: list[Consumer]) -> None:
        super()._dispatch_consumers(consumers[:1])

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["single_active_consumer"] = True
        described["waiting_consumers"] = max(0, len(self.consumers) - 1)
        return described


class DedupQueue(Queue):
    """A message whose ``message-id`` the queue took within ``x-dedup-window`` seconds is accepted, not enqueued.

    The queue remembers each id it enqueued (``sections.message_id_key``: the
    id's type and value, read from the bytes) with the wall-clock time it did,
    in milliseconds since the epoch, oldest first; ids older than the window
    are forgotten as new ones come.  A replica (a message given with its
    replication id: a backup, a DR replica) never drops one: its primary
    decided; it remembers the id, and its primary's time for it when the
    primary's ``u`` control says (``remember``).  Observers with
    ``id_remembered`` (replication, the journal) hear of each id.
    """

    def __init__(self, name: str, settings: QueueSettings, object_uuid: str | None = None) -> None:
        self.remembered: OrderedDict[bytes, tuple[int, bool]] = OrderedDict()  # key -> (ms, durable), oldest first
        self._id_observers: list[Any] = []
        self._window_ms = settings.dedup_window * 1000
        super().__init__(name, settings, object_uuid)

    def _sort_observers(self) -> None:
        super()._sort_observers()
        self._id_observers = [o for o in self.observers if hasattr(o, "id_remembered")]

    def enqueue(self, data: bytes, completion: Completion | None = None, ttl_ms: int | None = None,
                msg_id: int | None = None) -> int:
        key = sections.message_id_key(data)
        if key is None:
            return super().enqueue(data, completion, ttl_ms, msg_id)
        now = int(time.time() * 1000)
        if msg_id is None:
            seen = self.remembered.get(key)
            if seen is not None and now - seen[0] < self._window_ms:
                self.stats["deduplicated"] += 1
                return 0  # accepted (the completion is not held), not enqueued
        stored = super().enqueue(data, completion, ttl_ms, msg_id)
        self._remember(key, now, sections.header_durable(data))
        return stored

    def enqueue_run(self, payloads: list[bytes]) -> None:
        """A DR tap's run: its source decided; the ids are remembered."""
        super().enqueue_run(payloads)
        now = int(time.time() * 1000)
        for payload in payloads:
            key = sections.message_id_key(payload)
            if key is not None:
                self._remember(key, now, sections.header_durable(payload))

    def _remember(self, key: bytes, ms: int, durable: bool) -> None:
        remembered = self.remembered
        if key in remembered:
            del remembered[key]
        remembered[key] = (ms, durable)
        for observer in self._id_observers:
            observer.id_remembered(self, key, ms, durable)
        self.forget_old(ms)

    def forget_old(self, now_ms: int | None = None) -> None:
        """Forget the ids remembered longer ago than the window."""
        remembered = self.remembered
        cutoff = (int(time.time() * 1000) if now_ms is None else now_ms) - self._window_ms
        while remembered:
            key, (ms, _) = next(iter(remembered.items()))
            if ms > cutoff:
                return
            del remembered[key]

    def remember(self, entries: Iterable[tuple[bytes, int, bool]]) -> None:
        """Ids (key, ms since the epoch, durable) a primary remembered, or the journal kept: remembered with
        their time (the later one, if already here), oldest first; those past the window are not."""
        remembered = self.remembered
        now = int(time.time() * 1000)
        for key, ms, durable in sorted(entries, key=lambda entry: entry[1]):
            if now - ms >= self._window_ms:
                continue
            old = remembered.get(key)
            if old is None or old[0] < ms:
                self._remember(key, ms, durable)

    def remembered_entries(self, durable_only: bool = False) -> list[tuple[bytes, int, bool]]:
        """The ids remembered now, oldest first (a backup subscribing, a journal compacting)."""
        self.forget_old()
        return [(key, ms, durable) for key, (ms, durable) in self.remembered.items() if durable or not durable_only]

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        self.forget_old()
        described["dedup_window"] = self.settings.dedup_window
        described["dedup_ids"] = len(self.remembered)
        return described


class LastValueIndex:
    """A last-value queue's keys: each message's value of the key property, and the newest id for each value.

    A queue observer told of removals only: a message that leaves (consumed,
    expired, replaced, a replicated dequeue) is forgotten.
    """

    follows_acquisitions = False

    def __init__(self) -> None:
        self.keys: dict[int, bytes] = {}  # msg_id -> value key (messages on the queue that have one)
        self.latest: dict[bytes, int] = {}  # value key -> the newest id with it

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Completion | None) -> None:
        pass

    def acquired(self, queue: Queue, msg_id: int) -> None:
        pass

    def released(self, queue: Queue, msg_id: int) -> None:
        pass

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        key = self.keys.pop(msg_id, None)
        if key is not None and self.latest.get(key) == msg_id:
            del self.latest[key]


class LastValueQueue(Queue):
    """A new message replaces the available message with the same value of application property
    ``qpid.last_value_queue_key``.

    The value is read from the message's bytes (``sections.application_property_key``);
    a message without the property is an ordinary message.  An older message a
    consumer holds is not taken from it: it stays until settled, and if it is
    released, it is dropped then (a newer value is on the queue).
    """

    def __init__(self, name: str, settings: QueueSettings, object_uuid: str | None = None) -> None:
        super().__init__(name, settings, object_uuid)
        assert settings.lvq_key is not None  # queue_class picks this class only with one
        self._lvq_name = settings.lvq_key.encode("utf-8", "surrogatepass")
        self.last_values = LastValueIndex()
        self.add_observer(self.last_values)

    def enqueue(self, data: bytes, completion: Completion | None = None, ttl_ms: int | None = None,
                msg_id: int | None = None) -> int:
        stored = super().enqueue(data, completion, ttl_ms, msg_id)
        if stored:
            self._keep_last(stored, data)
        return stored

    def enqueue_run(self, payloads: list[bytes]) -> None:
        """A DR tap's run (its source decided which messages to keep): one by one, each replacing."""
        for payload in payloads:
            self._keep_last(Queue.enqueue(self, payload), payload)

    def restore(self, ids: list[int], payloads: list[bytes], ttls: dict[int, int] | None = None,
                counts: dict[int, int] | None = None) -> None:
        super().restore(ids, payloads, ttls, counts)
        for msg_id, payload in zip(ids, payloads):  # a crash between an enqueue and its replacement's dequeue
            self._keep_last(msg_id, payload)

    def _keep_last(self, msg_id: int, data: bytes) -> None:
        key = sections.application_property_key(data, self._lvq_name)
        if key is None:
            return
        index = self.last_values
        old = index.latest.get(key)
        if old is not None and old > msg_id:  # arrived late (a replica catching up): already replaced
            if msg_id not in self._acquired:
                self._replace(msg_id)
            return
        if self._index(msg_id) is not None:  # (a pre-settled consumer may have taken it already)
            index.keys[msg_id] = key
            index.latest[key] = msg_id
        if old is not None and old != msg_id and old not in self._acquired:
            self._replace(old)

    def _replace(self, msg_id: int) -> None:
        if self.dequeue(msg_id, "replaced") is not None:
            self.stats["replaced"] += 1

    def release(self, msg_id: int, delivery_failed: bool) -> None:
        index = self.last_values
        key = index.keys.get(msg_id)
        if key is not None and index.latest.get(key) != msg_id and msg_id in self._acquired:
            del self._acquired[msg_id]  # replaced while a consumer held it: not back on the queue
            self._replace(msg_id)
            return
        super().release(msg_id, delivery_failed)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["lvq_key"] = self.settings.lvq_key
        described["lvq_values"] = len(self.last_values.latest)
        return described


NO_GROUP = "qpid.no-group"
"""The group of a message without the group header (qpidd's name; a header with this string value is the same group)."""
_NO_GROUP_KEY = b"\xa1" + NO_GROUP.encode()  # sections.application_property_key of that string


def group_name(key: bytes) -> str:
    """A group's value, for people (``query``): the text of a string or symbol, the number of an integer."""
    if key[:1] in (b"\xa1", b"\xa3"):
        return key[1:].decode("utf-8", "replace")
    if key[:1] == b"I":
        return key[1:].decode("ascii", "replace")
    if key[:1] == b"B":
        return "true" if key == b"B1" else "false"
    return "0x" + key.hex()


def consumer_name(consumer: Consumer) -> str:
    """Who a consumer is, for people: its connection's container id and its link's name, where it has them."""
    link = getattr(consumer, "link", None)
    try:
        return f"{link.connection.remote_container or '?'}/{link.name}"  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not a proton link (a test's consumer): its repr
        return repr(consumer)


class MessageGroupQueue(Queue):
    """A group's messages go to one consumer at a time: the group's owner until it holds none of them.

    ``owners`` maps a group (its value's key, ``sections.application_property_key``)
    to [owner, how many of the group's messages the owner holds]; ``held``
    maps each acquired message to its group.  A consumer takes the group of
    the first free-group message it is given; a dispatch skips a message whose
    group another consumer owns, or whose owner has no credit (or has
    detached: its messages come back before the group is free).  Within a
    group, messages go out in queue (id) order.
    """

    def __init__(self, name: str, settings: QueueSettings, object_uuid: str | None = None) -> None:
        super().__init__(name, settings, object_uuid)
        assert settings.group_header is not None  # queue_class picks this class only with one
        self._group_header = settings.group_header.encode("utf-8", "surrogatepass")
        self.owners: dict[bytes, list[Any]] = {}  # group key -> [owner consumer, messages of it the owner holds]
        self.held: dict[int, bytes] = {}  # acquired msg_id -> its group key
        self._freed = False  # a group became free: consumers waiting for it may get messages

    def group_of(self, data: bytes) -> bytes:
        key = sections.application_property_key(data, self._group_header)
        return _NO_GROUP_KEY if key is None else key

    def _dispatch_consumers(self, consumers: list[Consumer]) -> None:
        owners, held, acquired = self.owners, self.held, self._acquired
        ids, data = self._ids, self._data
        index = self._head
        skipped: int | None = None  # the id of the first available message passed over
        ready = [c for c in consumers if c.credit > 0]
        while ready and index < len(ids):
            payload = data[index]
            msg_id = ids[index]
            if payload is None or msg_id in acquired:
                index += 1
                continue
            key = self.group_of(payload)
            owner = owners.get(key)
            if owner is not None:
                consumer = owner[0]
                if consumer.credit <= 0 or consumer not in consumers:
                    if skipped is None:
                        skipped = msg_id
                    index += 1
                    continue
            else:
                found = self._next_consumer(consumers)
                assert found is not None  # ``ready`` holds one with credit
                consumer = found
            if self._expires and self._expired(msg_id):
                self._remove(index, "expired")
                self.stats["expired"] += 1
            else:
                if owner is None:
                    owner = owners[key] = [consumer, 0]
                owner[1] += 1
                held[msg_id] = key
                acquired[msg_id] = consumer
                for observer in self._acquisition_observers:
                    observer.acquired(self, msg_id)
                consumer.deliver(self, msg_id, payload, self._delivery_counts.get(msg_id, 0))
                if consumer.credit <= 0:
                    ready = [c for c in consumers if c.credit > 0]
            if self._ids is not ids:  # compacted (an expiry, a pre-settled consumer's ack): find our place again
                ids, data = self._ids, self._data
                index = bisect_right(ids, msg_id)
            else:
                index += 1
        self._head = index if skipped is None else min(index, bisect_left(self._ids, skipped))

    def _unhold(self, msg_id: int) -> None:
        key = self.held.pop(msg_id, None)
        if key is None:
            return
        owner = self.owners.get(key)
        if owner is not None:
            owner[1] -= 1
            if owner[1] <= 0:
                del self.owners[key]
                self._freed = True

    def _remove(self, index: int, reason: str) -> bytes:
        msg_id = self._ids[index]
        payload = super()._remove(index, reason)
        if self.held:
            self._unhold(msg_id)
        return payload

    def _dispatch_freed(self) -> None:
        if self._freed:
            self._freed = False
            if self.consumers:
                self.dispatch()

    def acknowledge(self, msg_id: int) -> None:
        super().acknowledge(msg_id)
        self._dispatch_freed()

    def acknowledge_many(self, ids: Sequence[int]) -> None:
        for msg_id in ids:
            self._unhold(msg_id)
        super().acknowledge_many(ids)
        self._dispatch_freed()

    def release(self, msg_id: int, delivery_failed: bool) -> None:
        if msg_id in self._acquired:
            self._unhold(msg_id)  # before the message is back: a group now free goes to whoever is next
        super().release(msg_id, delivery_failed)
        self._dispatch_freed()

    def groups(self) -> list[dict[str, Any]]:
        """The groups owned now: each group's value, its owner and how many of its messages the owner holds."""
        return [{"group": group_name(key), "consumer": consumer_name(owner), "acquired": count}
                for key, (owner, count) in self.owners.items()]

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described["group_header"] = self.settings.group_header
        described["shared_groups"] = self.settings.shared_groups
        described["groups"] = self.groups()
        return described


_CLASSES: dict[tuple[bool, ...], type[Queue]] = {}


def queue_class(settings: QueueSettings) -> type[Queue]:
    """The class a queue with ``settings`` is made of: ``Queue`` itself unless it has a feature."""
    key = (settings.group_header is not None, settings.dedup_window > 0, settings.lvq_key is not None,
           settings.single_active_consumer, settings.delivery_limit > 0, settings.priorities > 0)
    if not any(key):
        return Queue
    found = _CLASSES.get(key)
    if found is None:
        kinds = (MessageGroupQueue, DedupQueue, LastValueQueue, SingleActiveConsumerQueue, DeliveryLimitQueue, PriorityQueue)
        bases = tuple(cls for cls, wanted in zip(kinds, key) if wanted)
        found = bases[0] if len(bases) == 1 else type("".join(c.__name__[:-5] for c in bases) + "Queue", bases, {})
        _CLASSES[key] = found
    return found
