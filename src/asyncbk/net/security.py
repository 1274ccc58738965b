"""TLS contexts and tokens for bookies and their clients.

* :func:`server_context`: a bookie's TLS (its certificate and key; with a CA, it
  checks client certificates, and requires one with ``require_client_cert``).
* :func:`client_context`: a client's TLS (the CA that signed the bookies, and the
  client's own certificate where bookies require one).  Hostname checking is on:
  a bookie's certificate must name the host of its id.
* :func:`load_tokens` / :func:`read_token`: tokens come from files (one per line;
  blank lines and ``#`` comments skipped) or the environment, never from command
  lines, and no error message or log line ever holds one.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from ..errors import ConfigError

TOKEN_ENV = "ASYNCBK_AUTH_TOKEN"
"""The environment variable a client's token may come from."""


def _readable(path: str, what: str) -> str:
    if not Path(path).is_file():
        raise ConfigError(f"{what} {path!r}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{what} {path!r}: not readable by this user")
    return path


def server_context(cert_file: str, key_file: str, ca_file: str = "",
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """TLS for a server (TLS 1.2 or newer)."""
    if require_client_cert and not ca_file:
        raise ConfigError("requiring client certificates needs the CA that signs them "
                          "(--tls-ca)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(_readable(cert_file, "TLS certificate"),
                            _readable(key_file, "TLS key"))
        if ca_file:
            ctx.load_verify_locations(_readable(ca_file, "TLS CA file"))
    except ssl.SSLError as exc:
        raise ConfigError(f"TLS material unusable ({exc.reason or exc}): check that the "
                          "certificate, its key and the CA are PEM files that belong "
                          "together") from None
    ctx.verify_mode = (ssl.CERT_REQUIRED if require_client_cert
                       else ssl.CERT_OPTIONAL if ca_file else ssl.CERT_NONE)
    return ctx


def client_context(ca_file: str = "", cert_file: str = "", key_file: str = "",
                   check_hostname: bool = True) -> ssl.SSLContext:
    """TLS for a client: ``ca_file`` (else the system's CAs) checks the server; the
    client's own certificate with ``cert_file`` and ``key_file``."""
    if bool(cert_file) != bool(key_file):
        raise ConfigError("a client certificate needs both its file and its key file")
    try:
        ctx = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=_readable(ca_file, "TLS CA file") if ca_file
            else None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert_file:
            ctx.load_cert_chain(_readable(cert_file, "TLS certificate"),
                                _readable(key_file, "TLS key"))
    except ssl.SSLError as exc:
        raise ConfigError(f"TLS material unusable ({exc.reason or exc})") from None
    ctx.check_hostname = check_hostname
    return ctx


def load_tokens(path: str) -> list[bytes]:
    """The tokens in ``path`` (one per line; blank lines and ``# comments`` skipped)."""
    try:
        text = Path(_readable(path, "tokens file")).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"tokens file {path!r} unreadable: {type(exc).__name__}") from None
    tokens = [line.strip().encode() for line in text.splitlines()
              if line.strip() and not line.strip().startswith("#")]
    if not tokens:
        raise ConfigError(f"tokens file {path!r} holds no token (one per line)")
    return tokens


def read_token(path: str = "", env: str = TOKEN_ENV) -> str | None:
    """A client's token: the first in ``path``, else the environment variable ``env``,
    else None."""
    if path:
        return load_tokens(path)[0].decode()
    value = os.environ.get(env, "").strip()
    return value or None
