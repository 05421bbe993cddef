"""Test certificates, made by the tests themselves with the openssl command (Debian's openssl).

``make_pki(directory)`` writes a CA, a server certificate for ``127.0.0.1`` and
``localhost``, client certificates for the names asked for, an expired one and
one signed by an unrelated CA.  Keys are EC P-256: quick to make.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


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


def _issue(directory: Path, name: str, ca: str, server: bool = False, expired: bool = False) -> None:
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", f"/CN={name}",
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
