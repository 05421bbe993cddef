"""``Coordinator`` (``coordinator.py``) on etcd v3.

The lease.  One lease per node carries its member key and, when it leads, the
leader key.  A keepalive thread refreshes it about every TTL/3 and records the
monotonic time at which each *confirmed* refresh was sent.  etcd restarts the
TTL when it receives the refresh, which is later, so ``confirmed + TTL`` is a
lower bound for the server-side expiry.  ``lease_confirmed_within(age)`` tells
whether that bound is still at least ``TTL - age`` ahead; a primary uses
``safe_lease_age`` (TTL minus ``lease_margin``) and steps down as soon as it is
false, before any other node can win the key.  Each keepalive call gets a
deadline, so a hung etcd cannot delay that moment; when it passes, ``notify``
gets ``LEASE_UNCONFIRMED``.  If etcd answers that the lease is gone, ``notify``
gets ``LEASE_LOST`` and the next ``publish_status`` takes a fresh lease.
``revoke_lease`` on graceful stop frees both keys at once, so a successor does
not wait a TTL.

etcd itself is reached through ``EtcdClient`` (``etcd_client.py``): several
endpoints, TLS, a user's token, a deadline on every call.  When the current
endpoint is unavailable the client moves to the next one, within the same
call's time.  The lease survives such a switch: leases and keys live in the
etcd cluster, not in a member, and a refresh counts as confirmed only when an
endpoint answered it, from the moment *that* request was sent.  A switch
also moves the watch stream to the new endpoint (a hung member would
otherwise keep an open stream that never delivers anything).

Why some calls bypass etcd3 0.12 altogether: it applies one timeout to every
call, its watcher thread cannot be stopped, it talks to one endpoint and
never renews its token; only its generated gRPC code is used.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from hastandby.broker.admission.fence import Fence
from hastandby.election.cluster import (
    ClusterKeys,
    ClusterSnapshot,
    Leader,
    Member,
    Store,
    SyncSet,
    decode_handover,
    decode_leader,
    decode_member,
    decode_sync,
    encode_handover,
    encode_leader,
    encode_member,
    encode_sync,
)
from hastandby.election.etcd_client import (
    EtcdClient,
    EtcdError,
    EtcdSettings,
    EtcdUnavailable,
    describe,
    etcdrpc,
    increment_last_byte,
    txn,
)
from hastandby import settings
from hastandby.election.coordinator import (
    CoordinatorError,
    CoordinatorEvent,
    CoordinatorUnavailable,
    LeasedCoordinator,
    Notify,
)
from hastandby.lifecycle.states import NodeStatus

log = structlog.get_logger(__name__)


@dataclass
class _Lease:
    """The current lease; fields change under ``EtcdCoordinator._lock``."""

    id: int
    ttl: int  # as granted: etcd may raise a short TTL
    confirmed_at: float  # monotonic send time of the last confirmed grant/refresh
    refresh_due: float
    unconfirmed_reported: bool = False
    refresh_failing: bool = False  # log a failing etcd once, not every retry


def _is_not_found(error: BaseException | None) -> bool:
    return isinstance(error, EtcdError) and error.code is grpc.StatusCode.NOT_FOUND


@contextmanager
def _etcd() -> Iterator[None]:
    """etcd client errors as the coordinator's (the client's message names the call and the endpoint)."""
    try:
        yield
    except EtcdUnavailable as error:
        raise CoordinatorUnavailable(str(error)) from error
    except EtcdError as error:
        raise CoordinatorError(str(error)) from error


class EtcdCoordinator(LeasedCoordinator):
    """``Coordinator`` on etcd v3 (``EtcdClient``).

    ``etcd``: ``EtcdSettings`` (endpoints, TLS, user), or plain endpoints
    (``http://host:port[,http://host:port...]``).  ``lease_ttl``:
    requested lease TTL in whole seconds (etcd may grant more).
    ``lease_margin``: how long before the earliest possible server-side
    expiry a primary must already have stepped down (``LeasedCoordinator``,
    which holds the lease queries and the defaults).
    ``on_lease``: told the id of every lease granted, from the thread that
    took it (``supervisor.py``: the parent of ``serve --supervise``).
    """

    def __init__(
        self,
        etcd: EtcdSettings | str,
        cluster: str,
        node_id: str,
        url: str,
        notify: Notify,
        *,
        lease_ttl: int = settings.LEASE_TTL.default,
        lease_margin: float = settings.LEASE_MARGIN.default,
        request_timeout: float = 1.0,
        fence: Fence | None = None,
        on_lease: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(lease_ttl, lease_margin)
        if request_timeout <= 0:
            raise ValueError("request_timeout must be positive")
        self.node_id = node_id
        self.url = url
        self._keys = ClusterKeys(cluster)
        self._keys.member(node_id)  # validates the id
        self._notify = notify
        self._timeout = request_timeout
        self._retry_interval = min(0.5, lease_ttl / 6)
        self._client = EtcdClient(etcd, request_timeout)
        self._client.on_switch.append(self._endpoint_switched)
        self._lock = threading.Lock()
        self._lease: _Lease | None = None
        # Closed until a lease is granted, moved on by every confirmation, closed when the lease goes.
        self.fence = fence if fence is not None else Fence()
        self.fence.close()
        self._stop = threading.Event()
        self._lease_changed = threading.Event()
        self._keepalive_thread: threading.Thread | None = None
        self._watch_thread: threading.Thread | None = None
        self._watch_call: Any = None
        self._watch_endpoint = -1  # index of the endpoint the watch stream is on
        self._watch_established = threading.Event()
        self._log = log.bind(cluster=cluster, node=node_id)
        self._on_lease = on_lease  # told each lease granted (the supervisor revokes it if this process dies)

    # -- lease ---------------------------------------------------------------

    # safe_lease_age, lease_confirmed_within, last_lease_confirmation: LeasedCoordinator's, from these three.

    def _lease_ttl(self) -> float:
        with self._lock:
            return self._lease.ttl if self._lease else self._requested_ttl

    def _confirmed_at(self) -> float | None:
        with self._lock:
            return self._lease.confirmed_at if self._lease else None

    def _now(self) -> float:
        return time.monotonic()

    def revoke_lease(self) -> None:
        with self._lock:
            lease, self._lease = self._lease, None
            self.fence.close()
        if lease is None:
            return
        try:
            with _etcd():
                self._client.revoke(lease.id)
        except CoordinatorError as error:
            if not _is_not_found(error.__cause__):
                raise
        self._log.info("lease revoked", lease=lease.id)

    def _current_lease(self) -> _Lease:
        with self._lock:
            if self._lease is None:
                raise CoordinatorError("no lease: publish_status() first")
            return self._lease

    def _ensure_lease(self) -> _Lease:
        with self._lock:
            if self._lease is not None:
                return self._lease
        with _etcd():
            lease_id, ttl, sent = self._client.grant(self._requested_ttl)
        lease = _Lease(lease_id, ttl, sent, sent + ttl / 3)
        with self._lock:
            self._lease = lease
            self.fence.until = self._unconfirmed_at(sent, lease.ttl)
        self._log.info("lease granted", lease=lease.id, ttl=lease.ttl)
        if self._on_lease is not None:
            self._on_lease(lease.id)
        self._start_thread("_keepalive_thread", self._keepalive_loop, "keepalive")
        self._lease_changed.set()
        return lease

    def _keepalive_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                lease = self._lease
            if lease is None:
                self._lease_changed.wait()
                self._lease_changed.clear()
                continue
            now = time.monotonic()
            with self._lock:
                unconfirmed_at = self._unconfirmed_at(lease.confirmed_at, lease.ttl)
                report = now >= unconfirmed_at and not lease.unconfirmed_reported
                lease.unconfirmed_reported |= report
                refresh_due = lease.refresh_due
                wake_at = refresh_due if lease.unconfirmed_reported else min(refresh_due, unconfirmed_at)
            if report:
                self._log.warning("lease not confirmed within safe age", lease=lease.id)
                self._tell(CoordinatorEvent.LEASE_UNCONFIRMED)
            if now >= refresh_due:
                self._refresh(lease, unconfirmed_at - now)
            elif now < wake_at:
                self._lease_changed.wait(wake_at - now)
                self._lease_changed.clear()

    def _refresh(self, lease: _Lease, until_unconfirmed: float) -> None:
        # Never wait past the moment the lease would count as unconfirmed.  With several
        # endpoints the client splits this budget between them, so a hung one leaves time
        # for the next; ``sent`` is when the request etcd answered was sent, whichever
        # endpoint that was.
        budget = self._timeout if until_unconfirmed <= 0 else min(self._timeout, until_unconfirmed)
        started = time.monotonic()
        try:
            sent, ttl = self._client.keepalive(lease.id, max(budget, 0.05))
        except EtcdError as error:
            with self._lock:
                lease.refresh_due = started + self._retry_interval
                first_failure, lease.refresh_failing = not lease.refresh_failing, True
            report = self._log.warning if first_failure else self._log.debug
            report("lease refresh failing", lease=lease.id, error=str(error))
            return
        if ttl <= 0:
            with self._lock:
                current = self._lease is lease
                if current:
                    self._lease = None
                    self.fence.close()
            if current:  # not merely revoked by revoke_lease() meanwhile
                self._log.warning("lease expired", lease=lease.id)
                self._tell(CoordinatorEvent.LEASE_LOST)
            return
        with self._lock:
            recovered = lease.refresh_failing
            lease.confirmed_at = sent
            if self._lease is lease:
                self.fence.until = self._unconfirmed_at(sent, lease.ttl)
            lease.refresh_due = sent + lease.ttl / 3
            lease.unconfirmed_reported = lease.refresh_failing = False
        if recovered:
            self._log.info("lease confirmed again", lease=lease.id)

    # -- membership, election, handover -------------------------------------

    def publish_status(self, status: NodeStatus, store: Store = Store()) -> None:
        value = encode_member(self.url, status, store)
        lease = self._ensure_lease()
        try:
            with _etcd():
                self._client.put(self._keys.member(self.node_id), value, lease.id, what="publish status")
        except CoordinatorError as error:
            if not _is_not_found(error.__cause__):
                raise
            with self._lock:  # the lease expired under us: take a new one, once
                if self._lease is lease:
                    self._lease = None
                    self.fence.close()
            lease = self._ensure_lease()
            with _etcd():
                self._client.put(self._keys.member(self.node_id), value, lease.id, what="publish status")
        self._log.debug("status published", status=str(status))

    def read_snapshot(self) -> ClusterSnapshot:
        with _etcd():
            response = self._client.range_prefix(self._keys.prefix, what="read snapshot")
        leader: Leader | None = None
        members: list[Member] = []
        handover: str | None = None
        sync: SyncSet | None = None
        for kv in response.kvs:
            key = kv.key.decode()
            try:
                if key == self._keys.leader:
                    leader = decode_leader(kv.value, kv.create_revision)
                elif key == self._keys.handover:
                    handover = decode_handover(kv.value)
                elif key == self._keys.sync:
                    sync = decode_sync(kv.value, kv.mod_revision)
                elif key.startswith(self._keys.members):
                    members.append(decode_member(key[len(self._keys.members):], kv.value))
            except ValueError as error:
                if not key.startswith(self._keys.members):
                    # Election and handover cannot be decided around a bad control key.
                    raise CoordinatorError(str(error)) from error
                self._log.warning("ignoring unreadable member key", key=key, error=str(error))
        members.sort(key=lambda member: member.node_id)
        return ClusterSnapshot(response.header.revision, leader, tuple(members), handover, sync)

    def campaign(self, sync: frozenset[str], sync_revision: int) -> int | None:
        lease = self._current_lease()
        leader_key, handover_key, sync_key = self._keys.leader, self._keys.handover, self._keys.sync
        leader_value = encode_leader(self.node_id, self.url)
        claim = [txn.Put(leader_key, leader_value, lease.id), txn.Get(leader_key),
                 txn.Put(sync_key, encode_sync(sync, self.node_id))]
        unchanged_sync = txn.Mod(sync_key) == sync_revision
        with _etcd():
            won, responses = self._client.transaction(
                compare=[txn.Create(leader_key) == 0, txn.Version(handover_key) == 0, unchanged_sync],
                success=claim,
                failure=[txn.Get(leader_key), txn.Get(handover_key)],
                what="campaign",
            )
            if not won:
                current_leader, handover = responses
                # Lost to another leader, or the sync set changed since it was read: decide again.
                if current_leader or not handover or not self._handover_names_me(handover[0][0]):
                    return None
                # The handover names this node: claim only if it still does.
                handover_revision = handover[0][1].mod_revision
                won, responses = self._client.transaction(
                    compare=[txn.Create(leader_key) == 0, txn.Mod(handover_key) == handover_revision,
                             unchanged_sync],
                    success=claim,
                    failure=[],
                    what="campaign",
                )
                if not won:
                    return None
        term = int(responses[1][0][1].create_revision)
        self._log.info("won election", term=term, sync=sorted(sync))
        return term

    def update_sync(self, term: int, members: frozenset[str]) -> bool:
        with _etcd():
            written, _ = self._client.transaction(
                compare=[txn.Create(self._keys.leader) == term],
                success=[txn.Put(self._keys.sync, encode_sync(members, self.node_id))],
                failure=[],
                what="update sync set",
            )
        self._log.info("sync set written" if written else "sync set not written: not the leader",
                       term=term, sync=sorted(members))
        return bool(written)

    def force_sync(self) -> bool:
        with _etcd():
            written, _ = self._client.transaction(
                compare=[txn.Create(self._keys.leader) == 0],
                success=[txn.Put(self._keys.sync, encode_sync(frozenset({self.node_id}), self.node_id))],
                failure=[],
                what="force sync set",
            )
        if written:
            self._log.warning("sync set forced to this node alone by the operator")
        return bool(written)

    def _handover_names_me(self, value: bytes) -> bool:
        try:
            return decode_handover(value) == self.node_id
        except ValueError as error:
            raise CoordinatorError(str(error)) from error

    def resign(self, term: int) -> bool:
        with _etcd():
            deleted, _ = self._client.transaction(
                compare=[txn.Create(self._keys.leader) == term],
                success=[txn.Delete(self._keys.leader)],
                failure=[],
                what="resign",
            )
        self._log.info("resigned" if deleted else "nothing to resign", term=term)
        return bool(deleted)

    def set_handover(self, target: str, ttl: int) -> None:
        self._keys.member(target)  # validates the id
        with _etcd():
            lease_id, granted, _ = self._client.grant(ttl, what="set handover")
            self._client.put(self._keys.handover, encode_handover(target), lease_id, what="set handover")
        self._log.info("handover set", target=target, ttl=granted)

    def clear_handover(self) -> None:
        with _etcd():
            self._client.delete(self._keys.handover, what="clear handover")
        self._log.info("handover cleared")

    # -- watch ---------------------------------------------------------------

    def watch(self) -> bool:
        self._start_thread("_watch_thread", self._watch_loop, "watch")
        return self._watch_established.wait(self._timeout)

    def _watch_loop(self) -> None:
        prefix = self._keys.prefix.encode()
        create = etcdrpc.WatchRequest(
            create_request=etcdrpc.WatchCreateRequest(key=prefix, range_end=increment_last_byte(prefix))
        )
        while not self._stop.is_set():
            ended = threading.Event()
            try:
                call, endpoint, token = self._client.watch(self._watch_requests(create, ended))
            except EtcdError as error:  # authentication failed, or no endpoint answered it
                ended.set()
                self._log.debug("watch not established", error=str(error))
                self._stop.wait(self._retry_interval)
                continue
            with self._lock:
                self._watch_call, self._watch_endpoint = call, endpoint
                # close() or a switch to another endpoint may have missed this call
                if self._stop.is_set() or endpoint != self._client.current_index:
                    call.cancel()
            moved = False
            try:
                for response in call:
                    if response.canceled:
                        # etcd refused the watch; an expired or unknown token shows up only here
                        # (a watch created and cancelled at once, "invalid auth token").
                        if "auth token" in response.cancel_reason:
                            self._log.info("watch refused the token; authenticating again")
                            self._client.forget_token(token)
                        else:
                            self._log.warning("watch refused", reason=response.cancel_reason)
                        break
                    if response.created:
                        self._client.answered(endpoint)
                        self._watch_established.set()
                        self._log.info("watch established", endpoint=self._client.settings.endpoints[endpoint])
                    if response.created or response.events:
                        # A new watch may have missed changes; tell the node either way.
                        self._tell(CoordinatorEvent.CLUSTER_CHANGED)
            except grpc.RpcError as error:
                moved = error.code() is grpc.StatusCode.CANCELLED and endpoint != self._client.current_index
                if not self._stop.is_set() and not moved:
                    report = self._log.warning if self._watch_established.is_set() else self._log.debug
                    report("watch broken", error=describe(error))
                    if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                        self._client.failed(endpoint, error)
            finally:
                ended.set()
                self._watch_established.clear()
                with self._lock:
                    self._watch_call = None
            if not moved:  # a stream moved to another endpoint is re-established at once
                self._stop.wait(self._retry_interval)

    def _endpoint_switched(self, index: int) -> None:
        """The client moved to endpoint ``index``: a watch on another endpoint moves too."""
        with self._lock:
            call = self._watch_call if self._watch_endpoint != index else None
        if call is not None:
            self._log.info("moving the watch", to=self._client.settings.endpoints[index])
            call.cancel()

    def _watch_requests(
        self, create: etcdrpc.WatchRequest, ended: threading.Event
    ) -> Iterator[etcdrpc.WatchRequest]:
        # etcd ends a watch stream when the client half-closes it, so keep the
        # request side open until this stream is over.
        yield create
        ended.wait()

    # -- plumbing ------------------------------------------------------------

    @property
    def etcd_endpoint(self) -> str:
        """The etcd endpoint calls go to now."""
        return self._client.endpoint

    def _start_thread(self, attribute: str, target: Callable[[], None], role: str) -> None:
        with self._lock:
            if getattr(self, attribute) is not None or self._stop.is_set():
                return
            thread = threading.Thread(target=target, name=f"etcd-{role}-{self.node_id}", daemon=True)
            setattr(self, attribute, thread)
        thread.start()

    def _tell(self, event: CoordinatorEvent) -> None:
        try:
            self._notify(event)
        except Exception:  # noqa: BLE001 - a broken callback must not kill this thread
            self._log.exception("notify callback failed", event=str(event))

    def close(self) -> None:
        self._stop.set()
        self._lease_changed.set()
        with self._lock:
            call = self._watch_call
        if call is not None:
            call.cancel()
        for thread in (self._keepalive_thread, self._watch_thread):
            if thread is not None:
                thread.join(self._timeout + 1)
        self._client.close()
        self._log.debug("coordinator closed")
