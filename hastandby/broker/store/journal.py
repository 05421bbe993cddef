"""The journal: durable messages on disk before anyone is told they are safe.

A message is *durable* when its header says ``durable=true`` and it goes to
a queue declared durable.  The journal (``<data-dir>/journal``, records in
``journal_format.py``) follows every durable queue as an observer:

- an enqueue of a durable message appends a record and *holds* the message's
  completion, so a producer hears ``accepted`` (and an HA backup accepts the
  batch it came in) only once the record is on disk;
- the records of one pass of the event loop go to disk together, one write
  and one fsync on the writer thread (group commit), and the completions are
  released back on the reactor thread; the reactor never waits for the disk;
- dequeues of journaled messages, their delivery-counts when a delivery
  fails (a delivery limit counts on across a restart), the message-ids a
  deduplicating queue remembers of its durable messages, lineage changes
  (``lineage.py``) and the highest term seen are appended in order with
  them, without holding anyone.

``--journal-sync``: ``batch`` (the default) as above; ``always`` writes and
fsyncs each message on its own (an fsync per message: safest for a single
message, slowest); ``off`` writes without fsync and holds nothing (a crash of
the machine may lose what the OS had not written yet; a crash of the process
alone loses nothing).

At start the node reads the journal back (``recover``): the durable queues
(declared again from the durable wiring, under their uuids) get their
messages under their replication ids and their lineage, so a restarted
backup offers what it holds and catches up incrementally.  A torn tail (a
crash in the middle of the last write, nothing of which was acknowledged) is
cut off at the last whole record, with a log line.  **Damage** is not a tail:
a record that is not intact with intact records after it, or below the bytes
the checkpoint (``journal_files.py``) says were on disk.  Nothing intact is
cut: the damaged file is kept aside (quarantined), what it lost is written to
``journal.damaged.json`` and logged as an error, and the node *lacks data*
(``Journal.damage``) until it has caught up from a healthy primary or an
operator accepts the loss: it is not elected meanwhile.  The file is
rewritten with only the live messages (compaction) whenever it has grown
past ``COMPACT_FACTOR`` times the live data (and at least ``COMPACT_MIN``
bytes): at start, before anyone is served, and in the background while the
node runs.  Otherwise a start appends to it, beginning with an ``OPEN``
record and each durable queue's lineage.

A failed write (a full disk, a read-only or failing one) fails the held
messages: their producers get ``amqp:resource-limit-exceeded`` and the
messages leave the queues, since nothing may be acknowledged that is not on
disk; durable messages for durable queues are then refused at once until a
*probe* works: a file of real size (twice the write that failed, at least
``PROBE_MIN``) written and fsynced beside the journal, then a record appended
to it.  A smaller write that happens to fit again does not lift the refusal,
so producers do not get refusals and acceptances by turns.  ``on_writing``
observers hear each change (an HA backup leaves its primary while it cannot
store).
"""

from __future__ import annotations

import errno
import mmap
import os
import queue as queues
import threading
import time
import uuid as uuidlib
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import structlog

from hastandby.broker.store import journal_files as files
from hastandby.broker.store import journal_format as jf
from hastandby.broker.queues import lineage as lineages
from hastandby.broker.message import sections
from hastandby.broker.queues.completion import Completion
from hastandby.broker.errors import ResourceLimitExceeded
from hastandby.broker.queues.exchange import Binding
from hastandby.broker.queues.idset import IdSet
from hastandby.broker.store.journal_replay import QueueReplay
from hastandby.broker.queues.queue import Queue
from hastandby.broker.queues.registry import Node, Registry

log = structlog.get_logger("hastandby.journal")

SYNC_MODES = ("batch", "always", "off")
COMPACT_FACTOR = 3  # the file is rewritten once it holds this many times the live data ...
COMPACT_MIN = 64 << 20  # ... and at least this many bytes
RUN_MESSAGES = 10_000  # most messages in one enqueue-run record
PROBE_INTERVAL = 1.0  # seconds between write attempts while the disk is full
PROBE_MIN = 256 << 10  # the smallest probe of a disk that failed a write: room for a pass of messages
PROBE_MAX = 64 << 20
CHECKPOINT_INTERVAL = 1.0  # seconds: the checkpoint of bytes on disk trails the journal by at most this


@dataclass
class Recovered:
    """What the journal held at start."""

    messages: int = 0
    queues: int = 0
    orphans: int = 0  # messages of queues the durable wiring no longer has
    term: int = 0  # the highest term recorded
    clean: bool = False  # the last run ended with a clean shutdown (the checkpoint says so, or its CLOSE record)
    torn_bytes: int = 0  # cut off the end (a crash in the middle of a write)
    damaged: dict[str, Any] | None = None  # what this start found damaged (journal.damaged.json's new entry)


@dataclass
class _Job:
    data: bytes
    held: list[tuple[Completion, Queue, int]] = field(default_factory=list)
    compact: "Callable[[], tuple[bytes, str]] | None" = None  # builds a whole new file (and its token)
    size: int = 0  # the file's size after this job (set by the writer)
    probe: int = 0  # bytes of room to prove before this job's data (while writes fail)


Snapshot = list[tuple[int, str, str, list[Any], Any, list[Any], IdSet, dict[int, float], dict[int, int],
                      list[tuple[bytes, int]]]]
"""Per journaled queue: number, uuid, name, lineage (wire form), ids and payloads (copies), journaled ids,
expiry deadlines (monotonic seconds, a copy), delivery-counts (a copy), remembered message-ids of durable
messages (key, ms: a deduplicating queue's)."""


def _durable_message_ids(queue: Queue) -> list[tuple[bytes, int]]:
    entries = getattr(queue, "remembered_entries", None)
    return [] if entries is None else [(key, ms) for key, ms, _ in entries(durable_only=True)]


class Journal:
    """The durable-message journal of one node (see the module docstring).

    Reactor thread: the queue and registry observer methods, ``admit``,
    ``term_seen`` and the flushes; they only append to a buffer.  Writer
    thread: ``_write_loop``, which writes, fsyncs and hands each job back
    with ``call_soon_threadsafe``.

    Every message on a durable queue passes ``enqueued`` and ``dequeued``,
    most of them not durable: each answers those in one test (the header's
    first bytes; whether the queue holds any journaled message), and the
    queue does not call ``acquired``/``released`` here at all.
    """

    follows_acquisitions = False  # QueueObserver: what is on disk does not change when a consumer takes it

    def __init__(self, directory: Path, node_id: str, registry: Registry, sync: str,
                 after_events: Callable[[Callable[[], None]], None],
                 call_soon_threadsafe: Callable[[Callable[[], None]], None],
                 schedule: Callable[[float, Callable[[], None]], Any]) -> None:
        if sync not in SYNC_MODES:
            raise ValueError(f"journal sync must be one of {', '.join(SYNC_MODES)}, not {sync!r}")
        self.path = Path(directory) / "journal"
        self.node_id = node_id
        self.registry = registry
        self.sync = sync
        self._after_events = after_events
        self._call_soon_threadsafe = call_soon_threadsafe
        self._schedule = schedule
        self.term = 0
        self.full: str | None = None  # why writing failed; durable messages are refused meanwhile
        self.on_writing: list[Callable[[str | None], None]] = []  # told why writes fail, then None once they work
        self.damage: list[dict[str, Any]] = []  # what damage took that this node has not recovered (empty: none)
        self._probe_bytes = PROBE_MIN
        self._token = ""  # the file's token (its first OPEN record's), named by the checkpoint
        self._checkpointed = (0.0, "", -1)  # (when, token, bytes) of the last checkpoint the writer wrote
        self._closed_on_disk = False  # the writer's last append ended with a CLOSE record
        self._checkpoint_failed = False
        self._synced = 0  # the file's bytes known to be on disk (the writer's last fsync)
        self._numbers: dict[str, int] = {}  # queue uuid -> its number in the file (kept across compactions)
        self._journaled: dict[Queue, IdSet] = {}  # the durable queues followed, and their ids on disk
        self._holding: set[Queue] = set()  # the queues whose ids on disk are not empty
        self._buffer = bytearray()
        self._enqueue_run: tuple[Queue, list[int], list[bytes], list[tuple[int, int]]] | None = None
        """One queue's enqueues, one record: the queue, ids, payloads, and (id, ttl) of those with a ttl."""
        self._dequeue_run: tuple[Queue, int, int] | None = None  # consecutive dequeues become one record
        self._message_ids: dict[Queue, list[tuple[bytes, int]]] = {}  # remembered ids, a record a queue a pass
        self._held: list[tuple[Completion, Queue, int]] = []
        self._flush_pending = False
        self._written = 0  # bytes in the file
        self._compacting = False
        self._jobs: queues.SimpleQueue[_Job | None] = queues.SimpleQueue()
        self._fd: int | None = None
        self._thread: threading.Thread | None = None
        # Counters for status and benchmarks (fsyncs per message); the writer thread bumps its own.
        self.stats = {"messages": 0, "writes": 0, "fsyncs": 0, "bytes_written": 0, "compactions": 0}

    # -- start and stop --------------------------------------------------------------------------

    def recover(self) -> Recovered:
        """Read the journal into the durable queues (declared already), then go on with the file.

        The file is rewritten with only the live messages (compacted) when it
        holds more than ``COMPACT_FACTOR`` times the live data, the rule the
        running node follows too, when it was damaged, and when an earlier
        writer left it without a token for the checkpoint to name; otherwise it
        is cut after its last whole record and appended to.  Rewriting a
        million live messages at every start (a write and an fsync of the whole
        file) was a third of a restarted backup's time to ready
        (benchmarks/catchup.py).

        Runs before the node serves anyone; nothing else touches the queues yet.
        """
        report = Recovered()
        uuids: dict[int, str] = {}
        replays: dict[str, QueueReplay] = {}
        by_number: dict[int, QueueReplay] = {}  # queue number -> its uuid's replay (one lookup a record)
        lineage_of: dict[str, list[Any]] = {}
        result = jf.Read()
        existed = self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        checkpoint = files.read_checkpoint(self.path.parent)
        token: str | None = None  # the file's, from its first record
        last_kind = 0
        seen = 0

        ttls_in_records = False  # the file's current writer puts ttls in EXPIRY records (format 2)

        def replay(number: int) -> QueueReplay:
            found = by_number.get(number)
            if found is None:
                found = by_number[number] = replays.setdefault(uuids.get(number, ""), QueueReplay())
            return found

        if existed:
            with _mapped(self.path) as data, closing(jf.read_records(data, result)) as records:
                for kind, body in records:
                    last_kind = kind
                    seen += 1
                    if kind == jf.ENQUEUE_RUN:
                        held = replay(body[0])
                        held.enqueue(body[1], body[2])
                        if not ttls_in_records:
                            held.expire(_header_ttls(body[1], body[2]))
                    elif kind == jf.EXPIRY:
                        replay(body[0]).expire(body[1])
                    elif kind == jf.COUNTS:
                        replay(body[0]).count(body[1])
                    elif kind == jf.MESSAGE_IDS:
                        replay(body[0]).remember(body[1])
                    elif kind == jf.ENQUEUE:
                        held = replay(body[0])
                        held.enqueue([body[1]], [body[2]])
                        held.expire(_header_ttls([body[1]], [body[2]]))
                    elif kind in (jf.OPEN, jf.TERM):
                        report.term = max(report.term, int(body.get("term", 0)))
                        if kind == jf.OPEN:
                            ttls_in_records = body.get("format", 1) >= 2
                            if seen == 1 and not result.damaged:  # the file's first record names it
                                token = str(body.get("file") or "") or None
                    elif kind == jf.QUEUE:
                        uuids[body[0]] = str(body[1]["uuid"])
                        by_number[body[0]] = replays.setdefault(uuids[body[0]], QueueReplay())
                    elif kind == jf.DEQUEUE:
                        replay(body[0]).dequeue(body[1])
                    elif kind == jf.LINEAGE:
                        lineage_of[uuids.get(body[0], "")] = body[1]
                report.damaged = self._damage_found(data, result, checkpoint if checkpoint is not None
                                                    and token is not None and checkpoint.file == token else None)
            size = self.path.stat().st_size
            matched = checkpoint is not None and token is not None and checkpoint.file == token
            if matched and checkpoint is not None:  # the checkpoint says how the last run ended, damage or not
                report.clean = checkpoint.clean and checkpoint.bytes == size
            else:  # no checkpoint of this file (an earlier writer's, or its own is damaged): its last record
                report.clean = last_kind == jf.CLOSE and not result.torn and report.damaged is None
            if result.torn and report.damaged is None:
                report.torn_bytes = size - result.valid_bytes
                log.warning("journal tail cut off: a crash in the middle of a write (nothing in it was acknowledged)",
                            path=str(self.path), kept_bytes=result.valid_bytes, cut_bytes=report.torn_bytes)
        by_uuid = {q.uuid: q for q in self.registry.queues.values() if q.settings.durable}
        for uuid, wire in lineage_of.items():
            queue = by_uuid.get(uuid)
            if queue is not None:
                queue.lineage = lineages.from_wire(wire)
        for uuid, messages in replays.items():
            ids, payloads, ttls = messages.result()
            queue = by_uuid.get(uuid)
            if queue is None:
                report.orphans += len(ids)
                continue
            queue.restore(ids, payloads, ttls, messages.counts(ids))
            remember = getattr(queue, "remember", None)
            if remember is not None and messages.message_ids:  # a deduplicating queue: its ids within the window
                remember([(key, ms, True) for key, ms in messages.message_ids.items()])
            self._journaled[queue] = IdSet.from_increasing(ids)
            if ids:
                self._holding.add(queue)
            report.messages += len(ids)
            report.queues += 1 if ids else 0
        for queue in by_uuid.values():
            self._journaled.setdefault(queue, IdSet())  # its restart epoch goes on disk with the others'
        self.term = report.term
        if report.damaged is not None:
            self._keep_damaged(report.damaged)
        self.damage = files.read_damage(self.path.parent)
        self._begin_restart_epochs(by_uuid.values())
        if checkpoint is not None and checkpoint.clean:  # from here on the file changes: no longer a clean stop
            self._write_checkpoint(files.Checkpoint(checkpoint.file, min(checkpoint.bytes, result.valid_bytes)))
        self._token = token or ""
        compact = (not existed or token is None or report.damaged is not None
                   or result.valid_bytes > max(COMPACT_MIN, COMPACT_FACTOR * self._live_bytes()))
        if not compact:
            self._numbers = {uuid: number for number, uuid in uuids.items()}
            self._continue_file(result.valid_bytes)
        else:
            try:
                self._replace_file(*self._encode(self._snapshot()))
            except OSError as error:
                self._keep_uncompacted(result.valid_bytes, error, cut=report.damaged is None)
        self._buffer.clear()
        self._written = self.path.stat().st_size
        if self.full is None and self.sync != "off":
            self._write_checkpoint(files.Checkpoint(self._token, self._written))
        log.info("journal recovered", path=str(self.path), messages=report.messages, queues=report.queues,
                 term=report.term, clean_shutdown=report.clean, orphans=report.orphans,
                 file_bytes=self._written, compacted=compact, damaged=bool(report.damaged),
                 lacks_data=bool(self.damage))
        return report

    def _damage_found(self, data: jf.Buffer, result: jf.Read,
                      checkpoint: files.Checkpoint | None) -> dict[str, Any] | None:
        """What the read found damaged, as ``journal.damaged.json`` keeps it (None: nothing).

        Damage is a stretch skipped between intact records, and, with a checkpoint of this file, a record
        that is not intact below the bytes it says were on disk (the last records damaged, not torn) or a
        file shorter than those bytes.
        """
        size = len(data)
        ranges = [(start, stop, jf.describe(data, start, stop)) for start, stop in result.damaged]
        synced = checkpoint.bytes if checkpoint is not None else 0
        if result.torn and result.valid_bytes < min(synced, size):
            ranges.append((result.valid_bytes, size, jf.describe(data, result.valid_bytes, size)
                           + ", at the end of the file, below the bytes known to be on disk"))
        if size < synced:
            ranges.append((size, synced, f"the file ends {synced - size} bytes short of what was on disk"))
        if not ranges:
            return None
        return {"found": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "journal_bytes": size,
                "lost_bytes": sum(stop - start for start, stop, _ in ranges),
                "ranges": [{"offset": start, "bytes": stop - start, "what": what} for start, stop, what in ranges]}

    def _keep_damaged(self, incident: dict[str, Any]) -> None:
        """Keep the damaged file aside, record what it lost, and say so: the node lacks data from now on."""
        incident["file"] = str(files.quarantine(self.path))
        files.write_damage(self.path.parent, [*files.read_damage(self.path.parent), incident])
        log.error("journal damaged: records that were on disk are lost on this node; the file is kept aside. "
                  "The node lacks data until it has caught up from a healthy primary, and is not elected meanwhile",
                  path=str(self.path), quarantined=incident["file"], lost_bytes=incident["lost_bytes"],
                  ranges=incident["ranges"], record=str(self.path.parent / files.DAMAGE))

    def damage_summary(self) -> str | None:
        """One line for the operator: what this node lacks, and where the damaged files are (None: nothing)."""
        if not self.damage:
            return None
        lost = sum(int(entry.get("lost_bytes", 0)) for entry in self.damage)
        kept = ", ".join(str(entry.get("file")) for entry in self.damage)
        return f"{lost} bytes of journal records lost to damage, the damaged file kept as {kept}"

    def repaired(self, how: str) -> None:
        """This node holds everything again (``how``: caught up from a primary, or an operator accepted the
        loss): it no longer lacks data.  The quarantined files stay for the operator."""
        if not self.damage:
            return
        files.clear_damage(self.path.parent)
        log.warning("journal damage no longer counts: this node holds everything again", how=how,
                    quarantined=[entry.get("file") for entry in self.damage])
        self.damage = []

    def _write_checkpoint(self, checkpoint: files.Checkpoint) -> None:
        try:
            files.write_checkpoint(self.path.parent, checkpoint)
        except OSError as error:  # the disk fails: the appends say so; a stale checkpoint only claims less
            if not self._checkpoint_failed:
                log.warning("journal checkpoint not written (tried again every second, quietly)",
                            error=os.strerror(error.errno) if error.errno else str(error))
            self._checkpoint_failed = True
            _, token, size = self._checkpointed
            self._checkpointed = (time.monotonic(), token, size)  # the next try in CHECKPOINT_INTERVAL
            return
        if self._checkpoint_failed:
            log.info("journal checkpoint written again")
        self._checkpoint_failed = False
        self._checkpointed = (time.monotonic(), checkpoint.file, checkpoint.bytes)

    def start(self) -> None:
        """Follow the durable queues and start the writer thread (after ``recover``)."""
        self.registry.observers.append(self)
        for queue in list(self.registry.queues.values()):
            self._follow(queue)
        self._thread = threading.Thread(target=self._write_loop, name="hastandby-journal", daemon=True)
        self._thread.start()
        if self.full is not None:
            self._refuse_durable(self.full)

    def close(self) -> None:
        """A clean shutdown: what is buffered, then the CLOSE record, on disk before this returns, and the
        checkpoint saying so (kept apart from the journal, so that damage to the journal cannot erase it)."""
        if self._thread is None:
            return
        self._add(jf.close_record())
        self._flush()
        self._jobs.put(None)
        self._thread.join(30)
        if self._thread.is_alive():
            return  # the writer hangs on a failing disk: no clean stop to record
        self._thread = None
        if self._fd is not None:
            closed = self._closed_on_disk  # the CLOSE record was the last thing the writer appended
            try:
                os.fsync(self._fd)  # (done already unless --journal-sync off)
                size = os.fstat(self._fd).st_size
            except OSError:
                closed = False
            os.close(self._fd)
            self._fd = None
            if closed:
                self._write_checkpoint(files.Checkpoint(self._token, size, clean=True))

    # -- following the queues (reactor thread) ------------------------------------------------

    def _follow(self, queue: Queue) -> None:
        if not queue.settings.durable or self in queue.observers:
            return
        queue.add_observer(self)
        queue.lineage_listeners.append(self._lineage_changed)
        self._journaled.setdefault(queue, IdSet())

    def _number(self, queue: Queue) -> int:
        number = self._numbers.get(queue.uuid)
        if number is None:
            number = self._numbers[queue.uuid] = max(self._numbers.values(), default=0) + 1
            # Straight into the buffer, not after the pending runs: one of them may be what asks for the number,
            # and every record that names the queue by it must come after this one.
            self._buffer += jf.queue_record(number, queue.uuid, queue.name)
        return number

    def _add(self, record: bytes) -> None:
        """Append a record after the run pending before it: records keep their order."""
        self._end_runs()
        self._buffer += record

    def _end_runs(self) -> None:
        """Write out the pending run of enqueues or of dequeues (starting one ends the other)."""
        enqueues, self._enqueue_run = self._enqueue_run, None
        if enqueues is not None:
            number = self._number(enqueues[0])  # a queue new to the file gets its QUEUE record first
            self._buffer += jf.enqueue_run_record(number, enqueues[1], enqueues[2])
            if enqueues[3]:
                self._buffer += jf.expiry_record(number, enqueues[3])
        if self._message_ids:
            remembered, self._message_ids = self._message_ids, {}
            for queue, entries in remembered.items():
                self._buffer += jf.message_ids_record(self._number(queue), entries)
        dequeues, self._dequeue_run = self._dequeue_run, None
        if dequeues is not None:
            number = self._number(dequeues[0])
            self._buffer += jf.dequeue_record(number, [(dequeues[1], dequeues[2])])

    def _refuse_durable(self, reason: str) -> None:
        """Writes fail: refuse durable messages before routing (``admit``) and probe until a write works.

        ``admit`` is a registry admission check only meanwhile, so a journal that writes costs messages
        nothing before routing."""
        if self.admit not in self.registry.admission_checks:
            self.registry.admission_checks.append(self.admit)
            self._schedule(PROBE_INTERVAL, self._probe)
        changed, self.full = self.full != reason, reason
        if changed:
            self._tell_writing(reason)

    def _writes_again(self) -> None:
        log.info("journal writes again: durable messages are taken again", proved_bytes=self._probe_bytes)
        self.full = None
        self._probe_bytes = PROBE_MIN
        self.registry.admission_checks.remove(self.admit)
        self._tell_writing(None)

    def _tell_writing(self, reason: str | None) -> None:
        for fn in self.on_writing:
            try:
                fn(reason)
            except Exception:  # an observer's bug must not stop the journal's own refusal
                log.exception("journal writing observer failed")

    def admit(self, targets: list[Queue], data: bytes) -> None:
        """Before routing, while writes fail: a durable message for a durable queue is refused at once."""
        if self.full is not None and any(q.settings.durable for q in targets) and sections.header_durable(data):
            raise ResourceLimitExceeded(f"the journal cannot write ({self.full}): durable messages are refused")

    def enqueued(self, queue: Queue, msg_id: int, data: bytes, completion: Completion | None) -> None:
        if not sections.header_durable(data):
            return
        ttl = sections.header_ttl(data)
        run = self._enqueue_run
        if run is None or run[0] is not queue or len(run[1]) >= RUN_MESSAGES:
            self._end_runs()
            run = self._enqueue_run = (queue, [], [], [])
        run[1].append(msg_id)
        run[2].append(data)
        if ttl:
            run[3].append((msg_id, ttl))
        self._journaled[queue].add(msg_id)
        self._holding.add(queue)
        self.stats["messages"] += 1
        if completion is not None and self.sync != "off" and not completion.done:
            completion.hold()
            self._held.append((completion, queue, msg_id))
        if self.sync == "always":
            self._flush()
        else:
            self._flush_soon()

    def acquired(self, queue: Queue, msg_id: int) -> None:
        pass

    def released(self, queue: Queue, msg_id: int) -> None:
        pass

    def id_remembered(self, queue: Queue, key: bytes, ms: int, durable: bool) -> None:
        """A deduplicating queue took a message-id: a durable message's goes on disk with it (same flush), so
        a producer re-sending after a restart makes no duplicate; a non-durable one's does not (the message
        does not survive a restart, so its re-sending must be taken)."""
        if durable:
            self._message_ids.setdefault(queue, []).append((key, ms))
            self._flush_soon()

    def delivery_counted(self, queue: Queue, msg_id: int, count: int) -> None:
        """A delivery of a message failed (rare): a journaled one's count goes on disk after its enqueue."""
        if queue in self._holding and msg_id in self._journaled[queue]:
            self._add(jf.counts_record(self._number(queue), [(msg_id, count)]))
            self._flush_soon()

    def dequeued(self, queue: Queue, msg_id: int, reason: str) -> None:
        if queue not in self._holding:  # no journaled message on this queue: the usual case, one test
            return
        journaled = self._journaled[queue]
        if msg_id not in journaled:
            return
        journaled.discard(msg_id)
        if not journaled:
            self._holding.discard(queue)
        run = self._dequeue_run
        if run is not None and run[0] is queue and run[2] + 1 == msg_id:
            self._dequeue_run = (queue, run[1], msg_id)
        else:
            self._end_runs()
            self._dequeue_run = (queue, msg_id, msg_id)
        self._flush_soon()

    def _lineage_changed(self, queue: Queue) -> None:
        self._add(jf.lineage_record(self._number(queue), lineages.to_wire(queue.lineage)))
        self._flush_soon()

    def term_seen(self, term: int) -> None:
        """The node saw a newer term (it won it, or follows its primary)."""
        if term > self.term:
            self.term = term
            self._add(jf.term_record(term))
            self._flush_soon()

    # -- RegistryObserver: durable queues come and go ------------------------------------------

    def created(self, obj: Node) -> None:
        if isinstance(obj, Queue):
            self._follow(obj)

    def deleted(self, obj: Node) -> None:
        if isinstance(obj, Queue):
            self._journaled.pop(obj, None)  # its records are ignored at recovery: the wiring no longer has it
            self._holding.discard(obj)

    def bound(self, binding: Binding) -> None:
        pass

    def unbound(self, binding: Binding) -> None:
        pass

    # -- writing ------------------------------------------------------------------------------------

    def _flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._after_events(self._flush)

    def _flush(self, probe: int = 0) -> None:
        """One pass of events' records to the writer thread, with the completions waiting on them (``probe``:
        bytes of room the writer proves first, while writes fail)."""
        self._flush_pending = False
        self._end_runs()
        if not self._buffer:
            return
        self._jobs.put(_Job(bytes(self._buffer), self._held, probe=probe))
        self._buffer = bytearray()
        self._held = []
        if not self._compacting and self._written > max(COMPACT_MIN, COMPACT_FACTOR * self._live_bytes()):
            self._compact()

    @property
    def file_bytes(self) -> int:
        """The journal file's size after the last write the reactor heard of."""
        return self._written

    def _live_bytes(self) -> int:
        return sum(q.bytes for q in self._journaled)

    def _write_loop(self) -> None:
        """Take jobs in order; appends queued while the previous fsync ran go together (one write, one fsync).
        The checkpoint follows what is on disk at most ``CHECKPOINT_INTERVAL`` behind."""
        jobs = self._jobs
        carried: list[_Job | None] = []  # a stop or a compaction met while gathering appends: next
        while True:
            if carried:
                job = carried.pop()
            else:
                due = self._checkpoint_due()
                if due == 0.0:  # due now, even while appends keep coming
                    self._checkpoint_now()
                    due = None
                try:
                    job = jobs.get(timeout=due)
                except queues.Empty:
                    self._checkpoint_now()
                    continue
            if job is None:
                return
            group = [job]
            while job.compact is None:
                try:
                    following = jobs.get_nowait()
                except queues.Empty:
                    break
                if following is None or following.compact is not None:
                    carried.append(following)
                    break
                group.append(following)
            error: OSError | None = None
            try:
                if job.compact is not None:
                    self._replace_file(*job.compact())
                else:
                    probe = max(each.probe for each in group)
                    if probe:
                        self._prove_room(probe)
                    data = b"".join(each.data for each in group) if len(group) > 1 else job.data
                    self._closed_on_disk = False
                    self._append(data)
                    self._closed_on_disk = data.endswith(_CLOSE)
                size = os.fstat(self._fd).st_size if self._fd is not None else 0
                for each in group:
                    each.size = size
            except OSError as failure:
                error = failure
            for each in group:
                self._call_soon_threadsafe(lambda job=each, error=error: self._done(job, error))
            if error is None and job.compact is not None:
                self._checkpoint_now()  # the new file, at once: the old checkpoint names the old one

    def _checkpoint_due(self) -> float | None:
        """Seconds until the checkpoint should follow the file (None: it does already, or nothing is fsynced)."""
        when, token, size = self._checkpointed
        if self.sync == "off" or self._fd is None or (token, size) == (self._token, self._synced):
            return None
        return max(0.0, when + CHECKPOINT_INTERVAL - time.monotonic())

    def _checkpoint_now(self) -> None:
        if self.sync != "off" and self._fd is not None:
            self._write_checkpoint(files.Checkpoint(self._token, self._synced))

    def _prove_room(self, size: int) -> None:
        """Writes failed: the disk must take ``size`` bytes (written and fsynced beside the journal, then
        removed) before they are tried again, not only the next small record."""
        path = self.path.with_name("journal.probe")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            block = bytes(min(size, 1 << 20))
            written = 0
            while written < size:
                written += os.write(fd, block[:size - written])
            os.fsync(fd)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)

    def _append(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        fd = self._fd
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self.sync != "off":
                os.fsync(fd)
        except OSError:
            # A record cut by a full disk would hide every later one from recovery: cut it off (no space needed).
            os.ftruncate(fd, start)
            raise
        if self.sync != "off":
            self._synced = start + len(data)
        stats = self.stats
        stats["writes"] += 1
        stats["bytes_written"] += len(data)
        if self.sync != "off":
            stats["fsyncs"] += 1

    def _done(self, job: _Job, error: OSError | None) -> None:
        """Back on the reactor: release (or fail) what waited for this write."""
        if job.compact is not None:
            self._compacting = False
            if error is None:
                log.info("journal compacted", file_bytes=job.size)
        if error is None:
            self._written = job.size
            if self.full is not None and job.probe:
                self._writes_again()
            for completion, _, _ in job.held:
                completion.release()
            return
        reason = os.strerror(error.errno) if error.errno else str(error)
        if self.full is None:
            log.error("journal write failed: durable messages are refused until it works again",
                      error=reason, disk_full=error.errno == errno.ENOSPC)
        self._probe_bytes = min(PROBE_MAX, max(self._probe_bytes, PROBE_MIN, 2 * len(job.data)))
        self._refuse_durable(reason)
        failure = ResourceLimitExceeded(f"the journal cannot write ({reason}): message not taken")
        for completion, queue, msg_id in job.held:
            queue.dequeue(msg_id, "journal-failed")  # not on disk: not taken
            completion.fail(failure)

    def _probe(self) -> None:
        """While writes fail, try one now and then: the first that works lifts the refusal."""
        if self.full is None or self._thread is None:
            return
        self._add(jf.term_record(self.term))
        self._flush(probe=self._probe_bytes)
        self._schedule(PROBE_INTERVAL, self._probe)

    # -- compaction -----------------------------------------------------------------------------------

    def _compact(self) -> None:
        """Rewrite the file with only the live messages, on the writer thread.

        The reactor takes copies of the queues' id and payload lists (C-level
        copies) and of the journaled id sets; the writer encodes them.  Records
        appended after this point go, in order, into the new file, under the
        same queue numbers.
        """
        self._compacting = True
        self.stats["compactions"] += 1
        snapshot = self._snapshot()
        self._jobs.put(_Job(b"", compact=lambda: self._encode(snapshot)))
        log.info("journal compaction started", file_bytes=self._written)

    def _snapshot(self) -> Snapshot:
        return [(self._number(q), q.uuid, q.name, lineages.to_wire(q.lineage), q._ids[:], q._data[:], ids.copy(),
                 q.deadlines(), q.delivery_counts(), _durable_message_ids(q)) for q, ids in self._journaled.items()]

    def _encode(self, snapshot: Snapshot) -> tuple[bytes, str]:
        """A whole new file of ``snapshot``, and the token its first record gives it."""
        token = uuidlib.uuid4().hex
        parts = [jf.open_record(self.node_id, self.term, file=token)]
        now = time.monotonic()
        for number, uuid, name, wire, ids, payloads, journaled, deadlines, counts, message_ids in snapshot:
            parts.append(jf.queue_record(number, uuid, name))
            parts.append(jf.lineage_record(number, wire))
            kept = [(msg_id, payload) for msg_id, payload in zip(ids, payloads)
                    if payload is not None and msg_id in journaled]
            for at in range(0, len(kept), RUN_MESSAGES):
                run = kept[at:at + RUN_MESSAGES]
                parts.append(jf.enqueue_run_record(number, [m for m, _ in run], [p for _, p in run]))
                ttls = [(m, max(1, int((deadlines[m] - now) * 1000))) for m, _ in run if m in deadlines]
                if ttls:  # what is left of each ttl
                    parts.append(jf.expiry_record(number, ttls))
                failed = [(m, counts[m]) for m, _ in run if m in counts] if counts else None
                if failed:
                    parts.append(jf.counts_record(number, failed))
            for at in range(0, len(message_ids), RUN_MESSAGES):
                parts.append(jf.message_ids_record(number, message_ids[at:at + RUN_MESSAGES]))
        return b"".join(parts), token

    def _begin_restart_epochs(self, queues: Any) -> None:
        """Ids given out from now on belong to an epoch of this run (``lineage.py``).

        Only durable messages came back: the ids of the lost non-durable ones
        are free again, and the next message would take one of them.  A
        backup or DR replica holding such an id under the old lineage would
        then keep a stale message as if it were the new one.  A restart epoch
        starting at each queue's next id (unique: this run's token in the node
        field) makes every copy drop what it holds from there on, while the
        ids below, what the journal gave back, still match and are skipped.
        """
        restart = f"{self.node_id}/restart-{uuidlib.uuid4().hex[:8]}"
        for queue in queues:
            queue.lineage = lineages.extended(queue.lineage, lineages.Epoch(self.term, restart, queue.next_id))

    def _continue_file(self, valid_bytes: int) -> None:
        """Append to the file as it is, cut after its last whole record: first this run's OPEN record and
        every durable queue's lineage (with its restart epoch)."""
        self._buffer.clear()
        self._buffer += jf.open_record(self.node_id, self.term)
        for queue in self._journaled:
            number = self._number(queue)  # a queue new to the file gets its QUEUE record first
            self._buffer += jf.lineage_record(number, lineages.to_wire(queue.lineage))
        os.truncate(self.path, valid_bytes)  # needs no space
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o600)
        try:
            self._append(bytes(self._buffer))
        except OSError as error:
            os.close(self._fd)
            self._fd = None
            self._keep_uncompacted(valid_bytes, error)

    def _keep_uncompacted(self, valid_bytes: int, error: OSError, cut: bool = True) -> None:
        """Recovery could not rewrite the file (a full disk): keep it as it is, without its torn tail (not
        ``cut`` when damaged: the quarantined copy is the same file), and refuse durable messages until a
        write works; a node that cannot compact must still start."""
        self.path.with_name("journal.compacting").unlink(missing_ok=True)
        if self.path.exists() and cut:
            os.truncate(self.path, valid_bytes)  # needs no space
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.full = os.strerror(error.errno) if error.errno else str(error)
        log.error("journal not compacted at start: durable messages are refused until a write works",
                  error=self.full, disk_full=error.errno == errno.ENOSPC)

    def _replace_file(self, data: bytes, token: str) -> None:
        temporary = self.path.with_name("journal.compacting")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        if self._fd is not None:
            os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o600)
        self._token, self._synced = token, len(data)



_CLOSE = jf.close_record()


def _header_ttls(ids: list[int], payloads: list[bytes]) -> list[tuple[int, int]]:
    """(id, ttl) of the messages whose header has a ttl: for runs written before EXPIRY records."""
    found = [(msg_id, sections.header_ttl(payload)) for msg_id, payload in zip(ids, payloads)]
    return [(msg_id, ttl) for msg_id, ttl in found if ttl]


@contextmanager
def _mapped(path: Path) -> Iterator[jf.Buffer]:
    """The file's bytes, mapped read-only rather than read: recovery copies out only the payloads."""
    with open(path, "rb") as stream:
        if os.fstat(stream.fileno()).st_size == 0:
            yield b""  # an empty file cannot be mapped
            return
        with mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield data
