"""Certificates for tests and benchmarks, made with the openssl command (Debian's openssl).

``make_pki(directory)`` (the tests) writes a CA, a server certificate for
``127.0.0.1`` and ``localhost``, client certificates for the names asked for,
an expired one and one signed by an unrelated CA.  ``make_certificates``
(the TLS benchmarks) writes only the CA and the server certificate, with the
common name ``SUBJECT``.  Keys are EC P-256 (quick to make), valid for two
days.  Nodes serve the server certificate on ``--listen-tls`` and present it
to their peers with ``--peer-tls``; clients trust the CA.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


SERVER_NAME = "localhost"
"""The name clients verify the server certificate against (python-qpid-proton and
proton C check DNS names, not IP addresses)."""

SUBJECT = "bench-node"
"""``make_certificates``' server common name.  A node presents the certificate to its peers
too (``--peer-tls``), and a peer that authenticates with EXTERNAL is the user
of that name (``--no-password``, group ``cluster``): see ``benchmarks.security``."""


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Pki:
    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def ca(self) -> Path:
        return self.path("ca.pem")

    def cert(self, name: str) -> Path:
        return self.path(f"{name}.pem")

    def key(self, name: str) -> Path:
        return self.path(f"{name}.key")


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=directory)


def _issue(directory: Path, name: str, ca: str, server: bool = False, expired: bool = False,
           subject: str | None = None) -> None:
    """``name``.pem and .key signed by ``ca``; the common name is ``subject`` (default ``name``)."""
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={subject or name}",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=directory)
    extensions = directory / f"{name}.ext"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else "basicConstraints=CA:FALSE\n")
    if not expired:
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-extfile", extensions.name, "-days", "2", cwd=directory)
        return
    # openssl 3.0's x509 cannot date a certificate in the past; its ca command can.
    (directory / "index.txt").write_text("")
    config = directory / "ca.cnf"
    config.write_text("[ca]\ndefault_ca=test\n[test]\ndatabase=index.txt\nnew_certs_dir=.\n"
                      "default_md=sha256\npolicy=any\nserial=serial.txt\n[any]\ncommonName=supplied\n")
    (directory / "serial.txt").write_text("1000\n")
    _openssl("ca", "-batch", "-config", config.name, "-cert", f"{ca}.pem", "-keyfile", f"{ca}.key",
             "-in", f"{name}.csr", "-out", f"{name}.pem", "-startdate", "20200101000000Z",
             "-enddate", "20200102000000Z", "-notext", cwd=directory)


def make_pki(directory: Path, clients: tuple[str, ...] = ("client",)) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "rogue-ca")
    _issue(directory, "server", "ca", server=True)
    for name in clients:
        _issue(directory, name, "ca")
    _issue(directory, "rogue", "rogue-ca")
    _issue(directory, "expired", "ca", expired=True)
    return Pki(directory)


@dataclass(frozen=True)
class Certificates:
    """Paths of the CA certificate and of the server's certificate and key."""

    ca: Path
    cert: Path
    key: Path

    def serve_arguments(self) -> list[str]:
        """``hastandby serve`` options for this certificate (the TLS listener itself is ``--listen-tls``)."""
        return ["--ssl-cert-file", str(self.cert), "--ssl-key-file", str(self.key), "--ssl-ca-file", str(self.ca)]


def make_certificates(directory: Path) -> Certificates:
    """Write ``ca.pem``/``ca.key`` and ``server.pem``/``server.key`` (SAN localhost, 127.0.0.1; CN ``SUBJECT``)."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _issue(directory, "server", "ca", server=True, subject=SUBJECT)
    return Certificates(directory / "ca.pem", directory / "server.pem", directory / "server.key")
