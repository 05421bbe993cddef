"""Certificates for the benchmarks that use TLS, made with the openssl command (Debian's openssl).

Benchmarks must not import ``tests/``, so this is the part of
``tests/support/certs.py`` they need: a CA and a server certificate signed by
it for ``localhost`` and ``127.0.0.1`` (subjectAltName; common name ``bench-node``), EC P-256 keys (quick
to make), valid for two days.  Nodes serve it on ``--listen-tls`` and present
it to their peers with ``--peer-tls``; clients trust the CA.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_NAME = "localhost"
"""The name clients verify the server certificate against (python-qpid-proton and
proton C check DNS names, not IP addresses)."""

SUBJECT = "bench-node"
"""The certificate's common name.  A node presents the certificate to its peers
too (``--peer-tls``), and a peer that authenticates with EXTERNAL is the user
of that name (``--no-password``, group ``cluster``): see ``benchmarks.security``."""


@dataclass(frozen=True)
class Certificates:
    """Paths of the CA certificate and of the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def serve_arguments(self) -> list[str]:
        """``hastandby serve`` options for this certificate (the TLS listener itself is ``--listen-tls``)."""
        return ["--ssl-cert-file", str(self.cert), "--ssl-key-file", str(self.key), "--ssl-ca-file", str(self.ca)]


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


def make_certificates(directory: Path) -> Certificates:
    """Write ``ca.pem``/``ca.key`` and ``server.pem``/``server.key`` (SAN localhost, 127.0.0.1) into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=hastandby-bench-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=directory)
    _openssl("req", *ec, "-subj", f"/CN={SUBJECT}", "-keyout", "server.key", "-out", "server.csr", cwd=directory)
    (directory / "server.ext").write_text(f"subjectAltName=DNS:{SERVER_NAME},IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-extfile", "server.ext", "-days", "2", cwd=directory)
    return Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
