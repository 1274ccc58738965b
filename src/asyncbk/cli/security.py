"""Command-line options of a client's TLS and token (``asyncbk shell``, ``stream``,
``autorecovery``): ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--auth-token-file``
(or the environment variable ASYNCBK_AUTH_TOKEN; never the token itself on the
command line, where ``ps`` shows it), and towards etcd ``--etcd-ca``,
``--etcd-cert``, ``--etcd-key``, ``--etcd-user``, ``--etcd-password-file``."""

from __future__ import annotations

import argparse
from typing import Any

from ..net.etcd_security import PASSWORD_ENV, EtcdSecurity, etcd_security
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
    add_etcd_security_options(p)


def add_etcd_security_options(p: argparse.ArgumentParser) -> None:
    """``--etcd-ca``, ``--etcd-cert``, ``--etcd-key``, ``--etcd-user``,
    ``--etcd-password-file`` (see asyncbk.net.etcd_security)."""
    p.add_argument("--etcd-ca", metavar="FILE",
                   help="CA of etcd's certificate, for an etcds:// metadata URI (PEM; "
                   "default: --tls-ca, else the system's CAs)")
    p.add_argument("--etcd-cert", metavar="FILE",
                   help="client certificate for etcd (PEM; default: --tls-cert, for an "
                   "etcds:// URI)")
    p.add_argument("--etcd-key", metavar="FILE",
                   help="the key of --etcd-cert (PEM; default: --tls-key)")
    p.add_argument("--etcd-user", metavar="NAME",
                   help="etcd user, when etcd has authentication enabled (default: none)")
    p.add_argument("--etcd-password-file", metavar="FILE",
                   help=f"a file whose first line is the etcd user's password (default: the "
                   f"environment variable {PASSWORD_ENV}, if set)")


def etcd_security_of(args: argparse.Namespace, uri: str) -> EtcdSecurity:
    """The etcd TLS and credentials of a command's options (reads files: off the loop)."""
    def opt(name: str) -> str:
        return getattr(args, name, None) or ""

    return etcd_security(uri, ca=opt("etcd_ca"), cert=opt("etcd_cert"), key=opt("etcd_key"),
                         user=opt("etcd_user"), password_file=opt("etcd_password_file"),
                         fallback_ca=opt("tls_ca"), fallback_cert=opt("tls_cert"),
                         fallback_key=opt("tls_key"))


def client_security(args: argparse.Namespace) -> dict[str, Any]:
    """``ssl``, ``token`` and the etcd settings for ``BookKeeper.connect`` from the
    options above (reads files: call it off the event loop)."""
    ca, cert, key = (getattr(args, n, None) for n in ("tls_ca", "tls_cert", "tls_key"))
    ctx = client_context(ca or "", cert or "", key or "") if (ca or cert) else None
    etcd = etcd_security_of(args, getattr(args, "metadata_uri", None) or "")
    return {"ssl": ctx, "token": read_token(getattr(args, "auth_token_file", None) or ""),
            **etcd.connect_options()}
