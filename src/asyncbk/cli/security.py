"""Command-line options of a client's TLS and token (``asyncbk shell``, ``stream``,
``autorecovery``): ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--auth-token-file``
(or the environment variable ASYNCBK_AUTH_TOKEN; never the token itself on the
command line, where ``ps`` shows it)."""

from __future__ import annotations

import argparse
from typing import Any

from ..net.security import TOKEN_ENV, client_context, read_token


def add_client_security_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-ca", metavar="FILE",
                   help="connect to the bookies over TLS, checking them against this CA "
                   "(PEM; default: plain TCP)")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="this client's certificate (PEM), for bookies that require one "
                   "(default: none)")
    p.add_argument("--tls-key", metavar="FILE",
                   help="the key of --tls-cert (PEM; default: none)")
    p.add_argument("--auth-token-file", metavar="FILE",
                   help=f"a file holding the token bookies ask for (default: the "
                   f"environment variable {TOKEN_ENV}, if set)")


def client_security(args: argparse.Namespace) -> dict[str, Any]:
    """``ssl`` and ``token`` for ``BookKeeper.connect`` from the options above."""
    ca, cert, key = (getattr(args, n, None) for n in ("tls_ca", "tls_cert", "tls_key"))
    ctx = client_context(ca or "", cert or "", key or "") if (ca or cert) else None
    return {"ssl": ctx, "token": read_token(getattr(args, "auth_token_file", None) or "")}
