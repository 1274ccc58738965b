"""Everything asyncbk takes from etcd3-py beyond its public API, in one place.

asyncbk drives etcd's JSON gateway through etcd3-py 0.1.6 (pinned in
``pyproject.toml``), and needs a few of its internals that have no public
equivalent:

* ``AioClient._url(path, prefix=...)``: the gateway URL of a call (``/v3`` prefix
  or none), for ``/version`` and the streaming calls asyncbk makes itself;
* ``AioClient._encodeRPCRequest`` / ``_decodeRPCResponseData``: its request
  encoder (base64 for bytes fields) and response decoder (int64 fields to ``int``,
  bytes fields to ``bytes``, enums), for those streaming calls
  (:mod:`asyncbk.meta.etcd_stream` says why they are not etcd3-py's own);
* ``BaseClient.__init__``, ``_retrieve_version``, ``_raise_for_status`` and
  ``etcd3.baseclient.sem``: to make a client without the *blocking* version probe
  of ``AioClient.__init__``, on an ``ssl.SSLContext`` of ours, and to read
  refusals that are not JSON;
* ``etcd3.utils.getargspec``: its request builders are memoized by a decorator
  that calls ``inspect.getfullargspec`` twice per call, hundreds of times per
  transaction (7-10 ms of CPU per etcd call); it is replaced, once, by the same
  function behind a cache (the arguments of a function never change), which
  makes every etcd call 3-4x cheaper for the client.

These names are checked when this module is imported (:func:`missing_internals`):
an etcd3-py that changed them fails at once, with a message that says so, not in
the middle of a watch.  ``tests/unit/test_meta_etcd3_adapter.py`` checks what
they do.
"""

from __future__ import annotations

import functools
import inspect
import ssl
from typing import Any

import aiohttp
import etcd3.baseclient
import etcd3.utils
from etcd3 import AioClient
from etcd3.baseclient import BaseClient
from etcd3.errors import get_client_error

ASSUMED_SERVER_VERSION = "3.5.0"
"""What etcd3-py is told the server is: any >= 3.4 selects the ``/v3`` prefix
and the newest request schema it ships (3.3's, a subset of 3.4/3.5's)."""

POOL_SIZE = 30
"""Connections one client's aiohttp session keeps to its endpoint."""

CONNECT_TIMEOUT_S_DEFAULT = 10.0

INTERNALS: dict[str, tuple[object, tuple[str, ...]]] = {
    "etcd3.AioClient": (AioClient, ("_url", "_encodeRPCRequest", "_decodeRPCResponseData",
                                    "_retrieve_version", "_raise_for_status")),
    "etcd3.baseclient": (etcd3.baseclient, ("sem", "BaseClient")),
    "etcd3.utils": (etcd3.utils, ("getargspec", "memoize_in_object")),
}
"""The etcd3-py internals this module uses, by owner."""


def missing_internals() -> list[str]:
    """The names of :data:`INTERNALS` the installed etcd3-py lacks (``[]``: none)."""
    return [f"{owner}.{name}" for owner, (obj, names) in INTERNALS.items()
            for name in names if not hasattr(obj, name)]


_MISSING = missing_internals()
if _MISSING:
    raise ImportError(
        f"the installed etcd3-py lacks {', '.join(_MISSING)}, which asyncbk's etcd adapter "
        "needs (it was written for etcd3-py 0.1.6): install etcd3-py==0.1.6")

if not isinstance(etcd3.utils.getargspec, functools._lru_cache_wrapper):
    etcd3.utils.getargspec = functools.lru_cache(maxsize=None)(inspect.getfullargspec)


class AdaptedAioClient(AioClient):
    """etcd3-py's AioClient without the blocking version probe in its constructor,
    and with TLS from a context of ours.

    etcd3-py builds its own context, and only when given a client certificate:
    without hostname checking, and with no way to trust a CA without presenting
    a certificate.  So its constructor is skipped (``BaseClient``'s runs) and the
    session is made here, on ``ssl_context`` (or plain HTTP without one)."""

    def __init__(self, host: str, port: int, timeout: aiohttp.ClientTimeout,
                 ssl_context: ssl.SSLContext | None) -> None:
        BaseClient.__init__(
            self, host=host, port=port, protocol="https" if ssl_context else "http",
            timeout=timeout, server_version=ASSUMED_SERVER_VERSION,
            cluster_version=ASSUMED_SERVER_VERSION)
        self.ssl_context = ssl_context
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=POOL_SIZE,
                                           ssl=ssl_context if ssl_context else False))

    def _retrieve_version(self) -> None:
        semver = etcd3.baseclient.sem
        self.server_version_sem = semver.Version(self.server_version)
        self.cluster_version_sem = semver.Version(self.cluster_version)

    def __repr__(self) -> str:  # etcd3-py keeps the password on the client
        return f"<etcd client {self.host}:{self.port}>"

    @staticmethod
    async def _raise_for_status(resp: aiohttp.ClientResponse) -> None:
        """etcd3-py's, but an answer that is not JSON (etcd's gateway says some
        refusals in plain text) becomes an etcd error holding that text, instead of
        an AttributeError from etcd3-py reading a private aiohttp field."""
        if resp.status < 400:
            return
        try:
            data = await resp.json(content_type=None)
        except (ValueError, aiohttp.ClientError):
            data = None
        if isinstance(data, dict):
            error, code = data.get("error") or data.get("message") or "", data.get("code", 2)
        else:
            error, code = (await resp.text(errors="replace")).strip()[:300] or resp.reason, 2
        raise get_client_error(error, code, resp.status, resp)


def new_client(host: str, port: int, connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
               ssl_context: ssl.SSLContext | None = None) -> Any:
    """An etcd3-py ``AioClient`` for etcd >= 3.4 at ``host:port`` (HTTPS with
    ``ssl_context``), made without the blocking version probe of etcd3-py's
    constructor.  Call it inside the running loop (it opens an aiohttp session);
    ``await client.close()`` it."""
    return AdaptedAioClient(host, port,
                            aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s),
                            ssl_context)


def rpc_url(client: Any, path: str, *, prefix: bool = True) -> str:
    """The URL of gateway call ``path`` (``"/watch"``) on ``client``'s endpoint; without
    the ``/v3`` prefix with ``prefix=False`` (``"/version"``)."""
    return str(client._url(path, prefix=prefix))


def encode_rpc_request(client: Any, method: str, data: dict[str, Any]) -> Any:
    """``data`` (etcd3-py form: ``bytes`` for bytes fields) as the JSON body of gateway
    call ``method`` (bytes fields base64)."""
    return client._encodeRPCRequest(method, data)


def decode_rpc_response(client: Any, method: str, obj: dict[str, Any]) -> Any:
    """A decoded JSON answer ``obj`` of gateway call ``method`` in etcd3-py form:
    int64 fields as ``int``, bytes fields as ``bytes``, enum fields as enums."""
    return client._decodeRPCResponseData(method, obj)


__all__ = ["ASSUMED_SERVER_VERSION", "CONNECT_TIMEOUT_S_DEFAULT", "INTERNALS", "POOL_SIZE", "AdaptedAioClient",
           "decode_rpc_response", "encode_rpc_request", "missing_internals", "new_client",
           "rpc_url"]
