"""How an asyncbk process authenticates to etcd: TLS and etcd's user and password.

An ``etcds://`` metadata URI means TLS to etcd.  The client context comes from
the process's ``--etcd-ca`` / ``--etcd-cert`` / ``--etcd-key`` (config keys
``etcd_tls_ca_file``, ...), or, when none is given, from its own TLS settings
(``--tls-ca`` / ``--tls-cert`` / ``--tls-key``): one CA signing the bookies,
the clients and etcd is the common set-up.  A plain ``etcd://`` URI with any
``--etcd-*`` TLS option is refused rather than silently sent in the clear.

etcd's own authentication (``etcdctl auth enable``) takes a user name
(``--etcd-user``) and a password read from a file (``--etcd-password-file``)
or the environment variable ``ASYNCBK_ETCD_PASSWORD``; never from a command
line, where ``ps`` shows it.  The password is held only by the metadata store
and never logged or put in an error.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .security import client_context

PASSWORD_ENV = "ASYNCBK_ETCD_PASSWORD"
"""The environment variable etcd's password may come from."""


@dataclass(frozen=True)
class EtcdSecurity:
    """What :func:`~asyncbk.meta.uri.open_metadata_store` needs beyond the URI."""

    ssl: ssl.SSLContext | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    def store_options(self) -> dict[str, Any]:
        """Keyword arguments of ``open_metadata_store``."""
        return {"ssl": self.ssl, "user": self.user, "password": self.password}

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments of ``BookKeeper.connect``."""
        return {"etcd_ssl": self.ssl, "etcd_user": self.user, "etcd_password": self.password}


def read_password(path: str = "", env: str = PASSWORD_ENV) -> str | None:
    """etcd's password: the first line of ``path``, else the environment variable
    ``env``, else None."""
    if path:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"etcd password file {path!r}: no such file")
        try:
            text = p.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"etcd password file {path!r} unreadable: "
                              f"{type(exc).__name__}") from None
        lines = text.splitlines()
        password = lines[0].strip() if lines else ""
        if not password:
            raise ConfigError(f"etcd password file {path!r} is empty (the password goes on "
                              "its first line)")
        return password
    value = os.environ.get(env, "")
    return value.strip() or None


def is_tls_uri(uri: str) -> bool:
    return uri.strip().lower().startswith("etcds://")


def etcd_security(uri: str, *, ca: str = "", cert: str = "", key: str = "",
                  user: str = "", password_file: str = "", fallback_ca: str = "",
                  fallback_cert: str = "", fallback_key: str = "") -> EtcdSecurity:
    """The etcd TLS context and credentials from a process's settings (reads files:
    call it off the event loop).  ``ca``/``cert``/``key``: the etcd-specific TLS
    files; when all are empty, ``fallback_*`` (the process's own TLS files) serve."""
    own = bool(ca or cert or key)
    if own and not is_tls_uri(uri):
        raise ConfigError(f"--etcd-ca/--etcd-cert/--etcd-key were given, but the metadata URI "
                          f"{uri!r} is plain etcd://; write it etcds://... to use TLS")
    context = None
    if is_tls_uri(uri):
        ca, cert, key = (ca, cert, key) if own else (fallback_ca, fallback_cert, fallback_key)
        context = client_context(ca, cert, key)
    password = read_password(password_file)
    if password_file and not user:
        raise ConfigError("--etcd-password-file needs --etcd-user (whose password it is)")
    if user and password is None:
        raise ConfigError(f"etcd user {user!r} needs a password: --etcd-password-file FILE "
                          f"or the environment variable {PASSWORD_ENV}")
    return EtcdSecurity(context, user or None, password if user else None)


def bookie_etcd_security(cfg: Any) -> EtcdSecurity:
    """A bookie's etcd security from its BookieConfig (files read: off the loop)."""
    return etcd_security(cfg.metadata_uri, ca=cfg.etcd_tls_ca_file, cert=cfg.etcd_tls_cert_file,
                         key=cfg.etcd_tls_key_file, user=cfg.etcd_user,
                         password_file=cfg.etcd_password_file, fallback_ca=cfg.tls_ca_file,
                         fallback_cert=cfg.tls_cert_file, fallback_key=cfg.tls_key_file)


__all__ = ["PASSWORD_ENV", "EtcdSecurity", "bookie_etcd_security", "etcd_security",
           "is_tls_uri", "read_password"]
