"""TLS material and a token for a LocalCluster run with ``tls=True`` / ``auth_token``.

A throw-away CA (made by ``trustme``) signs one certificate for the bookies
(``127.0.0.1`` and ``localhost``) and one for clients; the files are written
under ``<data_dir>/tls/`` (keys and the tokens file readable by this user only)
and made anew at each start.  Nothing here is for production: see
docs/security.md for certificates of your own.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from ..errors import MissingExtraError
from ..net.security import client_context

HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class LocalTLS:
    """Paths of the PEM files of a local cluster's TLS."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    @classmethod
    def make(cls, directory: Path, hosts: tuple[str, ...] = ()) -> LocalTLS:
        """New certificates in ``directory``; the server's is valid for loopback and
        ``hosts`` (the addresses of a network's hosts)."""
        try:
            import trustme
        except ImportError:
            raise MissingExtraError.of("a LocalCluster with tls=True (its certificates)",
                                       "trustme", "standalone") from None
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        ca = trustme.CA()
        server = ca.issue_cert(*HOSTS, *hosts)
        client = ca.issue_cert("asyncbk-client")
        tls = cls(directory, directory / "ca.pem", directory / "bookie.pem",
                  directory / "bookie.key", directory / "client.pem", directory / "client.key")
        ca.cert_pem.write_to_path(str(tls.ca))
        server.cert_chain_pems[0].write_to_path(str(tls.server_cert))
        client.cert_chain_pems[0].write_to_path(str(tls.client_cert))
        for key, path in ((server.private_key_pem, tls.server_key),
                          (client.private_key_pem, tls.client_key)):
            _write_private(path, key.bytes())
        return tls

    def client_context(self) -> ssl.SSLContext:
        """What a client of the cluster passes as ``ssl``: trusts the cluster's CA and
        presents the client certificate the bookies require."""
        return client_context(str(self.ca), str(self.client_cert), str(self.client_key))


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` readable by this user only (from the first byte)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def write_tokens(path: Path, tokens: list[str]) -> None:
    """A tokens file (one per line) readable by this user only."""
    _write_private(path, "".join(f"{t}\n" for t in tokens).encode())
