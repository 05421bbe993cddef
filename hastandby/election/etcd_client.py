"""How the node talks to etcd: several endpoints, TLS, a user's token, every call bounded.

``EtcdSettings`` is what the operator gave (``hastandby serve --etcd
https://a:2379,https://b:2379 --etcd-ca-file ... --etcd-user ...``), built once
and shared by every etcd user of the node (the coordinator, the DR
configuration store).  ``EtcdClient`` is the small etcd v3 client they use.

Why not etcd3 0.12's client: it opens one channel to one endpoint, fetches
its user's token once in its constructor and never again (simple tokens
expire after ``--auth-token-ttl`` of idleness and vanish when a member
restarts), sends it only through calls it makes itself, and has one timeout
for every call.  Here only its generated gRPC code and its transaction
comparisons are used.

Endpoints.  Calls go to the current endpoint.  When it fails with an
*unavailable* error (unreachable, TLS handshake refused, no answer within the
call's share of its time, or etcd's own "no leader"/"request timed out",
which are gRPC UNAVAILABLE), the client moves to the next endpoint, tells its
``on_switch`` listeners, and tries the call there.  One call tries each
endpoint at most once, and all its attempts together stay within its budget
(``timeout``, or what the caller gives): each attempt gets an equal share of
what is left, so a hung first endpoint leaves time for the next one.  A
retried write is one etcd may already have applied; every write the node
makes is safe to repeat (see ``etcd_coordinator.py``).

Authentication.  With a user, the client authenticates on first use and
sends the token as ``token`` metadata on every call, its keepalive and watch
streams included.  When etcd says the token is invalid or stale, the client
authenticates again and repeats the call once.  Authentication counts
against the call's budget.
"""

from __future__ import annotations

import os

# etcd3 0.12 ships protobuf 3 generated code, which the C++/upb runtimes of
# newer protobuf releases reject; the pure-Python runtime always loads it.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")

import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlsplit

import grpc
import structlog

with warnings.catch_warnings():
    # etcd3 0.12's generated code calls protobuf descriptor functions that
    # protobuf deprecates: import-time noise in every test run, nothing to fix here.
    warnings.filterwarnings("ignore", "Call to deprecated create function", DeprecationWarning)
    import etcd3.transactions as txn
    from etcd3 import etcdrpc
    from etcd3.utils import increment_last_byte, to_bytes

__all__ = ["EtcdClient", "EtcdError", "EtcdSettings", "EtcdUnavailable", "describe",
           "etcdrpc", "increment_last_byte", "txn"]  # the last three for the coordinator (loaded after protobuf's setup)

log = structlog.get_logger(__name__)

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...] | None

DEFAULT_PORT = 2379
# gRPC's default reconnect backoff grows to 120 s; after an etcd outage the
# node must see etcd again within about a second.  After a long network cut
# the channel kept its stalled TCP connection, waiting out TCP's
# retransmission back-off (a backup timed out on etcd for 85 s after the
# heal, holding a min-sync primary's acknowledgements meanwhile): keepalive
# pings find such a connection dead and reconnect.  The interval stays above
# etcd's --grpc-keepalive-min-time (5 s), which answers more frequent pings
# with GOAWAY.
GRPC_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 3_000),
]
_UNAVAILABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class EtcdError(Exception):
    """etcd could not do what was asked; ``code`` is the gRPC status, if there was one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered in time (every one tried was unreachable, hung or without a leader)."""


@dataclass(frozen=True)
class EtcdSettings:
    """Where etcd is and how to prove who we are; built once, from the command line.

    ``endpoints``: ``http://host:port`` or ``https://host:port`` (all the same
    scheme).  https needs ``ca_file`` (the CA that signed etcd's server
    certificate); ``cert_file`` and ``key_file`` (together) are this node's
    client certificate for an etcd run with ``--client-cert-auth``.
    ``user``/``password`` (together): etcd authentication.
    """

    endpoints: tuple[str, ...]
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.endpoints, str):
            object.__setattr__(self, "endpoints", tuple(_split(self.endpoints)))
        endpoints = tuple(_normalize(endpoint) for endpoint in self.endpoints)
        object.__setattr__(self, "endpoints", endpoints)
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"etcd endpoints repeat: {', '.join(endpoints)}")
        schemes = {urlsplit(endpoint).scheme for endpoint in endpoints}
        if len(schemes) > 1:
            raise ValueError("etcd endpoints must all be http:// or all https://")
        if self.tls:
            if not self.ca_file:
                raise ValueError("https etcd endpoints need a CA file (--etcd-ca-file)")
        elif self.ca_file or self.cert_file or self.key_file:
            raise ValueError("etcd CA, certificate and key files need https:// endpoints")
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("an etcd client certificate needs its key, and a key its certificate")
        if (self.user is None) != (self.password is None):
            raise ValueError("etcd authentication needs both a user and a password")
        if self.user is not None and not self.user:
            raise ValueError("the etcd user name is empty")

    @classmethod
    def of(cls, value: EtcdSettings | str | Sequence[str]) -> EtcdSettings:
        """Settings as given, or plain endpoints (a comma-separated string or a list) without TLS or a user."""
        if isinstance(value, EtcdSettings):
            return value
        return cls(tuple(_split(value)) if isinstance(value, str) else tuple(value))

    @property
    def tls(self) -> bool:
        return self.endpoints[0].startswith("https://")

    def __str__(self) -> str:
        return ",".join(self.endpoints)


def _split(endpoints: str) -> list[str]:
    return [part.strip() for part in endpoints.split(",") if part.strip()]


def _normalize(endpoint: str) -> str:
    """``scheme://host:port``: ``host:port`` means http, the port defaults to 2379."""
    text = endpoint.strip()
    parts = urlsplit(text if "//" in text else f"http://{text}")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"etcd endpoint {endpoint!r}: bad port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.username:
        raise ValueError(f"etcd endpoint must be http://HOST:PORT or https://HOST:PORT, not {endpoint!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def describe(error: BaseException) -> str:
    """A gRPC error in words, with a hint when TLS is what failed."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        details = error.details() or ""
        text = f"{error.code().name}: {details}"
        if any(mark in details for mark in ("handshake", "Handshake", "TSI_", "SSL")):
            text += (" (TLS failed: is etcd's certificate signed by --etcd-ca-file, and does etcd accept "
                     "--etcd-cert-file?)")
        return text
    return str(error) or type(error).__name__


def _code(error: BaseException) -> grpc.StatusCode | None:
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        return error.code()
    return None


def _stale_token(error: grpc.RpcError) -> bool:
    """etcd refused the token itself (expired, unknown after a restart, or issued before an auth change)."""
    code = _code(error)
    details = error.details() if hasattr(error, "details") else ""
    return code is grpc.StatusCode.UNAUTHENTICATED or (
        code is grpc.StatusCode.INVALID_ARGUMENT and "auth store is old" in (details or ""))


@dataclass
class _Channel:
    index: int
    endpoint: str
    channel: grpc.Channel
    kv: Any
    lease: Any
    watch: Any
    auth: Any


class EtcdClient:
    """etcd v3 over several endpoints with TLS and a token; see the module docstring.

    Thread-safe: the coordinator's node-loop, keepalive and watch threads share one.
    ``timeout`` bounds each call (all its attempts together) unless the call is given its own budget.
    """

    def __init__(self, settings: EtcdSettings | str | Sequence[str], timeout: float) -> None:
        if timeout <= 0:
            raise ValueError("the etcd timeout must be positive")
        self.settings = EtcdSettings.of(settings)
        self.timeout = timeout
        self._credentials = self._channel_credentials()
        self._lock = threading.Lock()
        self._channels: list[_Channel | None] = [None] * len(self.settings.endpoints)
        self._current = 0
        self._healthy = True  # the current endpoint's last call succeeded (log a failure once)
        self._token: str | None = None
        self._auth_disabled_said = False
        self._closed = False
        #: Called with the new endpoint's index after every switch (from the thread that switched).
        self.on_switch: list[Callable[[int], None]] = []
        self._log = log.bind(etcd=str(self.settings))

    def _channel_credentials(self) -> grpc.ChannelCredentials | None:
        settings = self.settings
        if not settings.tls:
            return None

        def read(path: str | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                with open(path, "rb") as file:
                    return file.read()
            except OSError as error:
                raise ValueError(f"cannot read the etcd {what} {path}: {error.strerror}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read(settings.ca_file, "CA file"),
            private_key=read(settings.key_file, "key file"),
            certificate_chain=read(settings.cert_file, "certificate file"),
        )

    # -- endpoints --------------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The endpoint calls go to now."""
        return self.settings.endpoints[self._current]

    @property
    def current_index(self) -> int:
        return self._current

    def _channel(self, index: int) -> _Channel:
        with self._lock:
            if self._closed:
                raise EtcdError("etcd client closed", grpc.StatusCode.CANCELLED)
            channel = self._channels[index]
            if channel is None:
                endpoint = self.settings.endpoints[index]
                target = endpoint.split("://", 1)[1]
                raw = (grpc.secure_channel(target, self._credentials, options=GRPC_OPTIONS)
                       if self._credentials is not None else grpc.insecure_channel(target, options=GRPC_OPTIONS))
                channel = self._channels[index] = _Channel(
                    index, endpoint, raw, etcdrpc.KVStub(raw), etcdrpc.LeaseStub(raw), etcdrpc.WatchStub(raw),
                    etcdrpc.AuthStub(raw))
            return channel

    def failed(self, index: int, error: BaseException) -> None:
        """Endpoint ``index`` failed with an unavailable error: move on, unless someone already did."""
        count = len(self.settings.endpoints)
        with self._lock:
            if self._current != index or self._closed:
                return
            was_healthy, self._healthy = self._healthy, False
            if count == 1:
                switched = None
            else:
                self._current = switched = (index + 1) % count
        endpoints = self.settings.endpoints
        report = self._log.warning if was_healthy else self._log.debug
        if switched is None:
            report("etcd endpoint failing", endpoint=endpoints[index], error=describe(error))
            return
        report("etcd endpoint failing; switching", failed=endpoints[index], to=endpoints[switched],
               error=describe(error))
        for listener in list(self.on_switch):
            try:
                listener(switched)
            except Exception:  # noqa: BLE001 - a broken listener must not break the caller
                self._log.exception("etcd switch listener failed")

    def answered(self, index: int) -> None:
        """Endpoint ``index`` answered (after failures: say so once)."""
        with self._lock:
            if self._current != index or self._healthy:
                return
            self._healthy = True
        self._log.info("etcd endpoint answers", endpoint=self.settings.endpoints[index])

    # -- the token ----------------------------------------------------------------------------

    def _metadata(self, channel: _Channel, timeout: float) -> Metadata:
        """The token metadata for a call, authenticating first if there is no token."""
        settings = self.settings
        if settings.user is None:
            return None
        token = self._token
        if token is None:
            try:
                response = channel.auth.Authenticate(
                    etcdrpc.AuthenticateRequest(name=settings.user, password=settings.password), timeout)
            except grpc.RpcError as error:
                details = error.details() or ""
                if "authentication is not enabled" in details:
                    token = ""
                    if not self._auth_disabled_said:
                        self._auth_disabled_said = True
                        self._log.warning("etcd authentication is not enabled: calls go without a token",
                                          user=settings.user)
                elif _code(error) in _UNAVAILABLE:
                    raise
                else:
                    raise EtcdError(f"cannot authenticate to etcd as {settings.user!r} at {channel.endpoint}: "
                                    f"{describe(error)}", _code(error)) from error
            else:
                token = response.token
                self._log.debug("etcd token obtained", user=settings.user, endpoint=channel.endpoint)
            with self._lock:
                self._token = token
        return (("token", token),) if token else None

    def forget_token(self, metadata: Metadata) -> None:
        """etcd refused the token sent with ``metadata``: the next call authenticates again."""
        if metadata is None:
            return
        with self._lock:
            if self._token == metadata[0][1]:
                self._token = None

    # -- calls --------------------------------------------------------------------------------

    def call(self, what: str, operation: Callable[[_Channel, float, Metadata], T], budget: float | None = None,
             answers: bool = True) -> T:
        """``operation(channel, timeout, metadata)`` on the current endpoint, then on the next ones
        while they are unavailable; at most ``budget`` (default ``timeout``) seconds in all.
        ``answers``: the operation returning means the endpoint answered (not so for opening a stream)."""
        deadline = time.monotonic() + (self.timeout if budget is None else budget)
        count = len(self.settings.endpoints)
        tried = 0
        renewed = False
        while True:
            index = self._current
            channel = self._channel(index)
            share = (deadline - time.monotonic()) / (count - tried)
            attempt_deadline = time.monotonic() + max(share, 0.001)
            metadata: Metadata = None
            try:
                metadata = self._metadata(channel, max(share, 0.001))
                result = operation(channel, max(attempt_deadline - time.monotonic(), 0.001), metadata)
            except grpc.RpcError as error:
                if not renewed and metadata is not None and _stale_token(error):
                    renewed = True
                    self._log.info("etcd token refused; authenticating again", endpoint=channel.endpoint,
                                   error=describe(error))
                    self.forget_token(metadata)
                    continue
                code = _code(error)
                if code in _UNAVAILABLE and not self._closed:
                    tried += 1
                    self.failed(index, error)
                    if tried < count and deadline - time.monotonic() > 0:
                        continue
                    raise EtcdUnavailable(f"etcd {what} failed at {channel.endpoint}"
                                          f"{f' (and {tried - 1} more endpoints)' if tried > 1 else ''}: "
                                          f"{describe(error)}", code) from error
                raise EtcdError(f"etcd {what} failed at {channel.endpoint}: {describe(error)}", code) from error
            if answers:
                self.answered(index)
            return result

    def range_prefix(self, prefix: str, what: str = "read") -> Any:
        """Every key under ``prefix``, at one revision (a RangeResponse)."""
        key = to_bytes(prefix)
        request = etcdrpc.RangeRequest(key=key, range_end=increment_last_byte(key))
        return self.call(what, lambda c, timeout, md: c.kv.Range(request, timeout, metadata=md))

    def put(self, key: str, value: str | bytes, lease: int = 0, what: str = "put") -> Any:
        request = etcdrpc.PutRequest(key=to_bytes(key), value=to_bytes(value), lease=lease)
        return self.call(what, lambda c, timeout, md: c.kv.Put(request, timeout, metadata=md))

    def delete(self, key: str, what: str = "delete") -> Any:
        request = etcdrpc.DeleteRangeRequest(key=to_bytes(key))
        return self.call(what, lambda c, timeout, md: c.kv.DeleteRange(request, timeout, metadata=md))

    def transaction(self, compare: Iterable[Any], success: Iterable[Any], failure: Iterable[Any],
                    what: str = "transaction") -> tuple[bool, list[Any]]:
        """As etcd3's ``transaction``: (succeeded, responses), a Get's response a list of (value, KeyValue)."""
        request = etcdrpc.TxnRequest(compare=[c.build_message() for c in compare],
                                     success=_request_ops(success), failure=_request_ops(failure))
        response = self.call(what, lambda c, timeout, md: c.kv.Txn(request, timeout, metadata=md))
        responses: list[Any] = []
        for item in response.responses:
            if item.WhichOneof("response") == "response_range":
                responses.append([(kv.value, kv) for kv in item.response_range.kvs])
            else:
                responses.append(item)
        return bool(response.succeeded), responses

    def grant(self, ttl: int, what: str = "grant lease") -> tuple[int, int, float]:
        """A new lease: (id, granted TTL, monotonic time the granting request was sent)."""
        request = etcdrpc.LeaseGrantRequest(TTL=ttl)

        def once(c: _Channel, timeout: float, md: Metadata) -> tuple[int, int, float]:
            sent = time.monotonic()
            response = c.lease.LeaseGrant(request, timeout, metadata=md)
            return int(response.ID), int(response.TTL), sent

        return self.call(what, once)

    def revoke(self, lease_id: int, what: str = "revoke lease") -> None:
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        self.call(what, lambda c, timeout, md: c.lease.LeaseRevoke(request, timeout, metadata=md))

    def keepalive(self, lease_id: int, budget: float, what: str = "refresh lease") -> tuple[float, int]:
        """One keepalive round trip within ``budget``: (monotonic send time of the request etcd answered,
        the TTL it reported; 0 if the lease is gone)."""
        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)

        def once(c: _Channel, timeout: float, md: Metadata) -> tuple[float, int]:
            sent = time.monotonic()
            for response in c.lease.LeaseKeepAlive(iter([request]), timeout, metadata=md):
                return sent, int(response.TTL)
            return sent, 0

        return self.call(what, once, budget)

    def watch(self, requests: Iterator[Any], what: str = "watch") -> tuple[Any, int, Metadata]:
        """Open a watch stream on the current endpoint (authenticating first if need be):
        (the streaming call, the endpoint's index, the token metadata it was opened with, for
        ``forget_token`` if etcd refuses the watch).  The stream itself has no deadline."""
        return self.call(what, lambda c, timeout, md: (c.watch.Watch(requests, metadata=md), c.index, md),
                         answers=False)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = self._channels, [None] * len(self._channels)
        for channel in channels:
            if channel is not None:
                channel.channel.close()


def _request_ops(ops: Iterable[Any]) -> list[Any]:
    """etcd3 transaction operations (Put, Get, Delete) as gRPC RequestOps."""
    requests = []
    for op in ops:
        if isinstance(op, txn.Put):
            lease = op.lease if isinstance(op.lease, int) or op.lease is None else op.lease.id
            requests.append(etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(
                key=to_bytes(op.key), value=to_bytes(op.value), lease=lease or 0, prev_kv=op.prev_kv)))
        elif isinstance(op, txn.Get):
            range_end = to_bytes(op.range_end) if op.range_end is not None else b""
            requests.append(etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(
                key=to_bytes(op.key), range_end=range_end)))
        elif isinstance(op, txn.Delete):
            range_end = to_bytes(op.range_end) if op.range_end is not None else b""
            requests.append(etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(
                key=to_bytes(op.key), range_end=range_end, prev_kv=op.prev_kv)))
        else:
            raise TypeError(f"unsupported transaction operation {op!r}")
    return requests
