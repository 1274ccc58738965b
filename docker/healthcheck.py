#!/usr/bin/env python3
"""The image's HEALTHCHECK: GET /healthz of the HTTP admin endpoint on loopback.

Exit 0 when it answers 200 (the bookie serves, writable or read-only; an
``asyncbk autorecovery`` process runs), 1 otherwise (starting, lease lost, draining,
not listening). Only the standard library.

Where it looks:

* ``ASYNCBK_HEALTHCHECK_URL``, when set, is the whole URL.
* Otherwise ``127.0.0.1`` and the port of ``ASYNCBK_HTTP_PORT``, else ``http_port``
  in the file of ``ASYNCBK_CONFIG``, else 8000.
* When the endpoint has a certificate, the probe speaks TLS first: for a bookie,
  its own (``ASYNCBK_TLS_CERT``, or ``tls_cert_file`` in the config file); for
  ``asyncbk autorecovery``, the one of ``--http-tls-cert``
  (``ASYNCBK_HTTP_TLS_CERT``). It checks the endpoint's certificate against
  ``ASYNCBK_TLS_CA`` and presents ``ASYNCBK_TLS_CERT`` (with ``ASYNCBK_TLS_KEY``),
  for an endpoint that asks for one. The host name is not checked: the probe talks
  to its own container on loopback, which the certificate does not name. An
  endpoint that answers in plain HTTP is then asked again without TLS.
"""

from __future__ import annotations

import os
import ssl
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

TIMEOUT_S = 4.0
DEFAULT_PORT = 8000


def _config(environ: Mapping[str, str]) -> dict[str, Any]:
    path = environ.get("ASYNCBK_CONFIG", "").strip()
    if not path:
        return {}
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    section = data.get("bookie", data)
    return section if isinstance(section, dict) else {}


def _setting(environ: Mapping[str, str], config: Mapping[str, Any], env: str,
             key: str) -> str:
    return environ.get(env, "").strip() or str(config.get(key, "") or "")


def probe_plan(environ: Mapping[str, str]) -> tuple[list[str], ssl.SSLContext | None]:
    """The URLs to try, in order, and the TLS context of the https one."""
    url = environ.get("ASYNCBK_HEALTHCHECK_URL", "").strip()
    config = _config(environ)
    cert = _setting(environ, config, "ASYNCBK_TLS_CERT", "tls_cert_file")
    key = _setting(environ, config, "ASYNCBK_TLS_KEY", "tls_key_file")
    ca = _setting(environ, config, "ASYNCBK_TLS_CA", "tls_ca_file")
    http_cert = environ.get("ASYNCBK_HTTP_TLS_CERT", "").strip()  # autorecovery's HTTPS
    tls = url.startswith("https:") if url else bool(cert or http_cert)
    ctx = None
    if tls:
        ctx = ssl.create_default_context(cafile=ca or None)
        ctx.check_hostname = False  # loopback: the certificate names the service
        if cert and key:
            ctx.load_cert_chain(cert, key)
    if url:
        return [url], ctx
    port = _setting(environ, config, "ASYNCBK_HTTP_PORT", "http_port") or str(DEFAULT_PORT)
    plain = f"http://127.0.0.1:{port}/healthz"
    return ([f"https://127.0.0.1:{port}/healthz", plain] if tls else [plain]), ctx


def _plain_http_answer(exc: BaseException) -> bool:
    """Did a TLS handshake fail because the server answered in plain HTTP?"""
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, ssl.SSLError) and reason.reason in (
        "WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG")


def check(environ: Mapping[str, str]) -> tuple[bool, str]:
    """(healthy, one line saying why)."""
    try:
        urls, ctx = probe_plan(environ)
    except (OSError, ssl.SSLError) as exc:
        return False, f"cannot load the TLS material: {exc}"
    for i, url in enumerate(urls):
        try:
            with urllib.request.urlopen(
                    url, timeout=TIMEOUT_S,
                    context=ctx if url.startswith("https:") else None) as resp:
                return resp.status == 200, f"{url}: {resp.status}"
        except urllib.error.HTTPError as exc:
            return False, f"{url}: {exc.code} {exc.read(200).decode(errors='replace').strip()}"
        except (urllib.error.URLError, OSError) as exc:
            if i + 1 < len(urls) and _plain_http_answer(exc):
                continue
            return False, f"{url}: {getattr(exc, 'reason', exc)}"
    return False, "no URL to probe"


def main() -> None:
    healthy, why = check(os.environ)
    sys.stdout.write(why + "\n")
    sys.exit(0 if healthy else 1)


if __name__ == "__main__":
    main()
