"""Build and run the proton C example clients and broker.

Benchmarks and integration tests drive brokers with the proton C examples
(Debian package libqpid-proton11-dev-examples) because they are fast, so the
clients are never the bottleneck, and because the peer brokers in
``peers-measured.md`` were measured with the same programs; that makes our
figures comparable.

The example sources are read from the installed package at build time, never
copied into this repository. Besides the stock ``send``, ``receive`` and
``broker`` there are two benchmark variants, made by applying a few textual
replacements to the stock sources (each must apply exactly once, so a changed
upstream example fails the build loudly instead of building something else):

``send-bench``
    sends a binary body of N bytes (argv[5], default 100) instead of the stock
    small map ``{"sequence": n}``.
``receive-bench``
    does not print each message, and when it has its count it closes (detaches)
    its link and closes the connection only after the broker's detach arrives.
    The stock receive closes the connection right after its last message, so a
    broker may see the close before the last dispositions and requeue those
    messages; waiting for the detach makes "exactly N received and settled"
    hold.

Every client (``send``, ``receive`` and both variants) authenticates with
PLAIN when the environment has ``HASTANDBY_USER`` and ``HASTANDBY_PASSWORD``
(hastandby nodes require authentication): it sets them on its connection
before the proactor binds it, and allows PLAIN on a plain port (Debian's
libqpid-proton is built without Cyrus SASL, so PLAIN is its built-in
mechanism, which by default it offers only over TLS).  Without those variables
it connects exactly as the stock example does.  Callers pass them with
``env=`` (``Client``, ``run_*``, ``start_*``); the caller's own environment
never supplies them.  ``broker`` stays stock.

With ``HASTANDBY_SSL_CA_FILE`` in the environment as well, a client connects
with TLS: a client SSL domain that trusts that CA (only) and verifies the
server's certificate and its name, ``HASTANDBY_SSL_PEER_NAME`` (default: the
host argument; proton C checks DNS names, so give ``localhost`` when
connecting to ``127.0.0.1``), set up on the transport before it connects.  A
CA file it cannot read is an error (exit 1) rather than a silent plain
connection.

With ``HASTANDBY_DURABLE`` in the environment (any value but empty or
``0``), ``send`` and ``send-bench`` set the header's ``durable`` to true on
every message (``pn_message_set_durable``); without it they send as the stock
example does (no durable flag).  ``send-bench`` also reads
``HASTANDBY_PRIORITIES`` (header priorities), ``HASTANDBY_DELAY_MS`` and
``HASTANDBY_DELAYED_PERCENT`` (the annotation ``x-opt-delivery-delay``), for
the queue-feature figures of ``benchmarks.throughput --queue-kinds``.

Binaries go to a cache directory (default ``paths.build_dir()``: ``build/cexamples/`` in a checkout) under a name
carrying a hash of the patched source, the compiler command and the proton
headers' version, so they are rebuilt only when one of those changes.

This module is imported by integration tests: it uses the standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from hastandby.testing.paths import build_dir

EXAMPLES_DIR = Path(os.environ.get("PROTON_EXAMPLES_DIR", "/usr/share/proton/examples/c"))
"""Where Debian's libqpid-proton11-dev-examples installs the C examples."""

DEFAULT_BUILD_DIR = build_dir()

CFLAGS: tuple[str, ...] = ("-O2", "-Wall")
LDLIBS: tuple[str, ...] = ("-lqpid-proton", "-lpthread")
"""libqpid-proton.so holds core and proactor; Debian ships no unversioned
libqpid-proton-proactor.so to link against."""

PROTON_VERSION_HEADER = Path("/usr/include/proton/version.h")

DEFAULT_BODY_SIZE = 100


@dataclass(frozen=True)
class Patch:
    """Replace ``old`` by ``new`` in an example source; ``old`` must occur exactly once."""

    old: str
    new: str


_CREDENTIALS = (
    Patch("#include <proton/transport.h>\n", "#include <proton/transport.h>\n#include <proton/sasl.h>\n"),
    Patch(
        "  pn_proactor_connect2(app.proactor, NULL, NULL, addr);\n",
        "  {\n"
        "    /* hastandby: PLAIN with $HASTANDBY_USER and $HASTANDBY_PASSWORD, if both are set */\n"
        "    pn_connection_t *connection = pn_connection();\n"
        "    pn_transport_t *transport = pn_transport();\n"
        '    const char *user = getenv("HASTANDBY_USER"), *password = getenv("HASTANDBY_PASSWORD");\n'
        "    if (user && *user && password) {\n"
        "      pn_connection_set_user(connection, user);\n"
        "      pn_connection_set_password(connection, password);\n"
        "      pn_sasl_set_allow_insecure_mechs(pn_sasl(transport), true);\n"
        "    }\n"
        "    pn_proactor_connect2(app.proactor, connection, transport, addr);\n"
        "  }\n",
    ),
)
"""Every client: authenticate with PLAIN from the environment (see the module docstring)."""

_TLS = (
    Patch("#include <proton/sasl.h>\n", "#include <proton/sasl.h>\n#include <proton/ssl.h>\n"),
    Patch(
        "    pn_proactor_connect2(app.proactor, connection, transport, addr);\n",
        "    /* hastandby: TLS when $HASTANDBY_SSL_CA_FILE is set: trust that CA, verify the peer and its name */\n"
        '    const char *ca_file = getenv("HASTANDBY_SSL_CA_FILE");\n'
        "    if (ca_file && *ca_file) {\n"
        '      const char *peer_name = getenv("HASTANDBY_SSL_PEER_NAME");\n'
        "      pn_ssl_domain_t *domain = pn_ssl_domain(PN_SSL_MODE_CLIENT);\n"
        "      pn_ssl_t *ssl = domain ? pn_ssl(transport) : NULL;\n"
        "      if (!domain || !ssl\n"
        "          || pn_ssl_domain_set_trusted_ca_db(domain, ca_file)\n"
        "          || pn_ssl_domain_set_peer_authentication(domain, PN_SSL_VERIFY_PEER_NAME, NULL)\n"
        "          || pn_ssl_init(ssl, domain, NULL)\n"
        "          || pn_ssl_set_peer_hostname(ssl, (peer_name && *peer_name) ? peer_name : app.host)) {\n"
        '        fprintf(stderr, "TLS set-up failed (CA file %s)\\n", ca_file);\n'
        "        exit(1);\n"
        "      }\n"
        "      pn_ssl_domain_free(domain); /* the transport's SSL keeps its own reference */\n"
        "    }\n"
        "    pn_proactor_connect2(app.proactor, connection, transport, addr);\n",
    ),
)
"""Every client, after ``_CREDENTIALS``: TLS from the environment (see the module docstring)."""

_DURABLE = (
    Patch(
        "  pn_message_clear(app->message);\n",
        "  pn_message_clear(app->message);\n"
        "  {\n"
        "    /* hastandby: header durable=true on every message when $HASTANDBY_DURABLE is set and not \"0\" */\n"
        "    static int durable = -1;\n"
        "    if (durable < 0) {\n"
        '      const char *value = getenv("HASTANDBY_DURABLE");\n'
        "      durable = value && *value && !(value[0] == '0' && value[1] == '\\0');\n"
        "    }\n"
        "    if (durable) pn_message_set_durable(app->message, true);\n"
        "  }\n",
    ),
)
"""The senders: durable messages from the environment (see the module docstring)."""

_SHAPED = (
    Patch(
        "    if (durable) pn_message_set_durable(app->message, true);\n"
        "  }\n",
        "    if (durable) pn_message_set_durable(app->message, true);\n"
        "  }\n"
        "  {\n"
        "    /* hastandby: header priorities and a delivery delay from the environment (queue features) */\n"
        "    static int priorities = -1, delay_ms = 0, delayed_percent = 100;\n"
        "    if (priorities < 0) {\n"
        '      const char *p = getenv("HASTANDBY_PRIORITIES"), *d = getenv("HASTANDBY_DELAY_MS");\n'
        '      const char *q = getenv("HASTANDBY_DELAYED_PERCENT");\n'
        "      priorities = (p && *p) ? atoi(p) : 0;\n"
        "      delay_ms = (d && *d) ? atoi(d) : 0;\n"
        "      if (q && *q) delayed_percent = atoi(q);\n"
        "    }\n"
        "    if (priorities > 0) pn_message_set_priority(app->message, (uint8_t)(app->sent % priorities));\n"
        "    if (delay_ms > 0 && app->sent % 100 < delayed_percent) {\n"
        "      pn_data_t *annotations = pn_message_annotations(app->message);\n"
        "      pn_data_put_map(annotations);\n"
        "      pn_data_enter(annotations);\n"
        '      pn_data_put_symbol(annotations, pn_bytes(sizeof("x-opt-delivery-delay")-1, "x-opt-delivery-delay"));\n'
        "      pn_data_put_long(annotations, delay_ms);\n"
        "      pn_data_exit(annotations);\n"
        "    }\n"
        "  }\n",
    ),
)
"""``send-bench``, after ``_DURABLE``: with ``HASTANDBY_PRIORITIES`` N, message i has header priority i % N;
with ``HASTANDBY_DELAY_MS`` D, the message annotation ``x-opt-delivery-delay`` D on ``HASTANDBY_DELAYED_PERCENT``
(default 100) of every 100 messages (i % 100 < P).  Without them it sends as before."""


@dataclass(frozen=True)
class Program:
    """One buildable program: a stock example source plus optional patches."""

    source: str
    patches: tuple[Patch, ...] = ()


_SEND_BENCH = (
    Patch(
        "  int message_count;\n\n  pn_proactor_t *proactor;\n  pn_message_t *message;\n",
        "  int message_count;\n  size_t body_size;\n  char *body;\n\n"
        "  pn_proactor_t *proactor;\n  pn_message_t *message;\n",
    ),
    Patch(
        "  pn_data_put_map(body);\n"
        "  pn_data_enter(body);\n"
        '  pn_data_put_string(body, pn_bytes(sizeof("sequence")-1, "sequence"));\n'
        "  pn_data_put_int(body, app->sent); /* The sequence number */\n"
        "  pn_data_exit(body);\n",
        "  pn_data_put_binary(body, pn_bytes(app->body_size, app->body));\n",
    ),
    Patch(
        "  app.message_count = (argc > 4) ? atoi(argv[4]) : 10;\n",
        "  app.message_count = (argc > 4) ? atoi(argv[4]) : 10;\n"
        f"  app.body_size = (argc > 5) ? (size_t)atol(argv[5]) : {DEFAULT_BODY_SIZE};\n"
        "  app.body = malloc(app.body_size + 1);\n"
        "  memset(app.body, 'x', app.body_size);\n",
    ),
    Patch("#include <stdlib.h>\n", "#include <stdlib.h>\n#include <string.h>\n"),
    Patch(
        "  free(app.message_buffer.start);\n",
        "  free(app.message_buffer.start);\n  free(app.body);\n",
    ),
)

_RECEIVE_BENCH = (
    Patch(
        "    /* Print the decoded message */\n"
        "    pn_string_t *s = pn_string(NULL);\n"
        "    pn_inspect(pn_message_body(m), s);\n"
        '    printf("%s\\n", pn_string_get(s));\n'
        "    pn_free(s);\n",
        "    /* benchmark variant: decoded, not printed */\n",
    ),
    # Close (detach) only the link; the existing PN_LINK_REMOTE_CLOSE handler
    # closes the connection once the broker has answered with its detach.
    Patch(
        "           pn_link_close(l);\n"
        "           pn_session_close(ssn);\n"
        "           pn_connection_close(pn_session_connection(ssn));\n",
        "           pn_link_close(l);\n",
    ),
    Patch(
        "           pn_session_t *ssn = pn_link_session(l);\n",
        "",
    ),
)

PROGRAMS: dict[str, Program] = {
    "send": Program("send.c", _CREDENTIALS + _TLS + _DURABLE),
    "receive": Program("receive.c", _CREDENTIALS + _TLS),
    "broker": Program("broker.c"),
    "send-bench": Program("send.c", _CREDENTIALS + _TLS + _DURABLE + _SHAPED + _SEND_BENCH),
    "receive-bench": Program("receive.c", _CREDENTIALS + _TLS + _RECEIVE_BENCH),
}
"""Every program :func:`build` knows, by name."""


class ClientRun(NamedTuple):
    """Outcome of one client run; stderr is merged into stdout."""

    returncode: int
    elapsed: float
    stdout: str


class PatchError(RuntimeError):
    """A patch did not apply exactly once: the installed example has changed."""


def patched_source(name: str, examples_dir: Path = EXAMPLES_DIR) -> str:
    """Return the C source of program ``name`` with its patches applied."""
    program = PROGRAMS[name]
    text = (examples_dir / program.source).read_text()
    for patch in program.patches:
        found = text.count(patch.old)
        if found != 1:
            raise PatchError(
                f"{name}: patch expected exactly one match in {examples_dir / program.source}, "
                f"found {found}:\n{patch.old}"
            )
        text = text.replace(patch.old, patch.new)
    return text


def build(name: str, build_dir: Path = DEFAULT_BUILD_DIR, examples_dir: Path = EXAMPLES_DIR) -> Path:
    """Return the path of the built program ``name``, compiling it if needed.

    Safe to call from concurrent processes: each compiles in its own
    temporary directory and renames the binary into place.
    """
    source = patched_source(name, examples_dir)
    compiler = os.environ.get("CC", "gcc")
    stamp = hashlib.sha256()
    for part in (
        source,
        (examples_dir / "thread.h").read_text(),  # broker.c includes it
        PROTON_VERSION_HEADER.read_text() if PROTON_VERSION_HEADER.exists() else "",
        " ".join((compiler, *CFLAGS, *LDLIBS)),
    ):
        stamp.update(part.encode())
        stamp.update(b"\0")
    binary = build_dir / f"{name}-{stamp.hexdigest()[:16]}"
    if binary.exists():
        return binary

    build_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build_dir, prefix=f".{name}-") as tmp:
        work = Path(tmp)
        c_file = work / PROGRAMS[name].source
        c_file.write_text(source)
        # broker.c includes "thread.h" from its own directory.
        shutil.copyfile(examples_dir / "thread.h", work / "thread.h")
        try:
            subprocess.run(
                [compiler, *CFLAGS, "-o", str(work / name), str(c_file), *LDLIBS],
                check=True,
                capture_output=True,
                text=True,
                timeout=120,
            )
        except subprocess.CalledProcessError as err:
            raise RuntimeError(f"building {name} failed:\n{err.stderr}") from err
        os.replace(work / name, binary)
    return binary


class Client:
    """A started C client; :meth:`wait` collects its result.

    Starting and waiting are separate so a sender and a receiver can run
    concurrently.  ``env`` is added to this process's environment: the
    client's credentials (``HASTANDBY_USER``, ``HASTANDBY_PASSWORD``) come only
    from it, never from the caller's own environment (a benchmark's shell, a
    test process's exported admin), so a client without ``env`` connects as the
    stock example does.
    """

    def __init__(self, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self.argv = argv
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**_without_credentials(os.environ), **(env or {})},
        )

    def wait(self, timeout: float) -> ClientRun:
        """Wait for the client to exit; on timeout kill it and raise ``subprocess.TimeoutExpired``."""
        try:
            out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
            raise subprocess.TimeoutExpired(self.argv, timeout, output=out) from None
        return ClientRun(self.process.returncode, time.monotonic() - self.started, out)

    def kill(self) -> None:
        """Kill the client if it still runs (for cleanup after another failure)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.communicate()


CREDENTIAL_VARIABLES = ("HASTANDBY_USER", "HASTANDBY_PASSWORD", "HASTANDBY_SSL_CA_FILE", "HASTANDBY_SSL_PEER_NAME",
                        "HASTANDBY_DURABLE")
"""Taken from ``env`` only (credentials, the TLS settings that go with them, durable messages)."""


def _without_credentials(environment: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environment.items() if k not in CREDENTIAL_VARIABLES}


def start_send(
    host: str,
    port: int,
    address: str,
    count: int,
    body_size: int = DEFAULT_BODY_SIZE,
    build_dir: Path = DEFAULT_BUILD_DIR,
    env: Mapping[str, str] | None = None,
) -> Client:
    """Start ``send-bench``: ``count`` messages with a binary body of ``body_size`` bytes.

    It exits 0 after printing "N messages sent and acknowledged" once the
    broker has accepted every message.  ``env``: see :class:`Client`.
    """
    binary = build("send-bench", build_dir)
    return Client([str(binary), host, str(port), address, str(count), str(body_size)], env)


def start_receive(host: str, port: int, address: str, count: int, build_dir: Path = DEFAULT_BUILD_DIR,
                  env: Mapping[str, str] | None = None) -> Client:
    """Start ``receive-bench``: take exactly ``count`` messages (it grants that much credit).

    It prints "N messages received" when it has them, then detaches and waits
    for the broker's detach before closing; so with exit code 0 all ``count``
    messages were accepted and settled.  ``env``: see :class:`Client`.
    """
    binary = build("receive-bench", build_dir)
    return Client([str(binary), host, str(port), address, str(count)], env)


def run_send(
    host: str,
    port: int,
    address: str,
    count: int,
    body_size: int = DEFAULT_BODY_SIZE,
    timeout: float = 120.0,
    build_dir: Path = DEFAULT_BUILD_DIR,
    env: Mapping[str, str] | None = None,
) -> ClientRun:
    """Send ``count`` messages and wait; see :func:`start_send`."""
    return start_send(host, port, address, count, body_size, build_dir, env).wait(timeout)


def run_receive(
    host: str,
    port: int,
    address: str,
    count: int,
    timeout: float = 120.0,
    build_dir: Path = DEFAULT_BUILD_DIR,
    env: Mapping[str, str] | None = None,
) -> ClientRun:
    """Receive ``count`` messages and wait; see :func:`start_receive`."""
    return start_receive(host, port, address, count, build_dir, env).wait(timeout)


_SENT = re.compile(r"^(\d+) messages sent and acknowledged$", re.MULTILINE)
_RECEIVED = re.compile(r"^(\d+) messages received$", re.MULTILINE)


def sent_count(run: ClientRun) -> int | None:
    """Messages the sender reports as acknowledged, or None if it did not report."""
    match = _SENT.search(run.stdout)
    return int(match.group(1)) if match else None


def received_count(run: ClientRun) -> int | None:
    """Messages the receiver reports, or None if it did not report."""
    match = _RECEIVED.search(run.stdout)
    return int(match.group(1)) if match else None
