"""Streaming etcd calls (watch, lease keep-alive) over etcd3-py's aiohttp session.

Why this module exists
----------------------
asyncbk talks to etcd through etcd3-py 0.1.6, which drives etcd's gRPC-JSON
gateway over HTTP.  Its *unary* calls (put, range, txn, lease grant/revoke)
work on every aiohttp release, but its *streaming* helpers do not:
``ModelizedStreamResponse.__anext__`` checks
``isinstance(resp, aiohttp.client._RequestContextManager)``, and since
aiohttp 3.10 that name is a parameterised generic alias, so the check raises
``TypeError`` before a single byte is read.  Watches and lease keep-alives
are therefore unusable through etcd3-py on current aiohttp.

Rather than pin aiohttp below 3.10 (which would fight every other library in
an application), we drive the gateway's streaming endpoints ourselves, over
the very same ``aiohttp.ClientSession`` etcd3-py opened, reusing its request
encoder (base64 for ``bytes`` fields) and response decoder (``int`` for
int64 fields, ``bytes`` for byte fields), through
:mod:`asyncbk.meta.etcd3_adapter`.  Nothing here depends on aiohttp
internals: only ``ClientSession.post``, ``ClientResponse.status`` and
``StreamReader.iter_any``, which behave the same on every aiohttp >= 3.9.

Wire format
-----------
A streaming gateway call answers HTTP 200 and then a sequence of JSON objects
concatenated with no delimiter (etcd 3.4/3.5 sends none, older ones may send
newlines: both are handled).  Each object is either ``{"result": {...}}`` or
``{"error": {"grpc_code": .., "http_code": .., "message": ..}}``.  Integers
arrive as JSON strings and keys/values as base64, which the etcd3-py decoder
turns back into ``int`` and ``bytes``.

Errors
------
An ``error`` object or a non-200 status raises
:class:`~asyncbk.errors.MetadataError`.  Transport failures (connection
refused, reset, server gone) propagate as ``aiohttp.ClientError`` so that the
caller can tell "etcd is unreachable" apart from "etcd said no" and fail over
to another endpoint.
"""

from __future__ import annotations

import asyncio
import builtins
import codecs
import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import aiohttp

from ..errors import MetadataError
from ..errors import TimeoutError as BKTimeoutError
from .etcd3_adapter import decode_rpc_response, encode_rpc_request, rpc_url

STREAM_BUFFER_BYTES_MAX = 64 * 1024 * 1024
"""Largest undecoded tail we accept before declaring the stream garbage: a
malformed object would otherwise make us buffer forever, waiting for its end."""

CONNECT_TIMEOUT_S_DEFAULT = 5.0

_WHITESPACE = " \t\r\n"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        message = error.get("message") or error.get("error") or json.dumps(error)
        code = error.get("grpc_code", error.get("code"))
        return f"{message} (grpc code {code})" if code is not None else str(message)
    return str(error)


async def _raise_for_http_status(resp: aiohttp.ClientResponse, method: str) -> None:
    if resp.status == 200:
        return
    try:
        body = await resp.text()
    except aiohttp.ClientError:
        body = ""
    detail = body.strip()
    try:
        parsed = json.loads(body)
    except ValueError:
        pass
    else:
        if isinstance(parsed, dict):
            detail = _error_text(parsed.get("error", parsed))
    raise MetadataError(
        f"etcd {method} at {resp.url.host}:{resp.url.port} answered HTTP {resp.status}: {detail[:500]}"
    )


def _decode_objects(buf: str, pos: int, decoder: json.JSONDecoder) -> tuple[list[Any], int]:
    """Every complete JSON object in ``buf`` from ``pos``; returns them and the
    offset of the first unconsumed character."""
    objects: list[Any] = []
    end = len(buf)
    while True:
        while pos < end and buf[pos] in _WHITESPACE:
            pos += 1
        if pos >= end:
            return objects, pos
        try:
            obj, pos_next = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            # Most likely an object cut in the middle by chunking: wait for more.
            return objects, pos
        objects.append(obj)
        pos = pos_next


async def stream_json(
    client: Any,
    method: str,
    data: dict[str, Any],
    *,
    connect_timeout_s: float = CONNECT_TIMEOUT_S_DEFAULT,
) -> AsyncGenerator[dict[str, Any], None]:
    """POST ``data`` to the streaming gateway ``method`` (e.g. ``"/watch"``) and
    yield the decoded ``result`` of every object the server sends.

    ``client`` is an ``etcd3.AioClient``: its session, URL prefix, auth token
    and (de)serialisation schema are used.  ``data`` is the request in
    etcd3-py form (``bytes`` for byte fields, ``int`` for int64 fields).
    Results come back decoded the same way: byte fields as ``bytes``,
    int64 fields as ``int``, enum fields (an event's ``type``) as etcd3-py
    enums; fields the server left out are absent.

    The stream has no read timeout (a watch may legitimately stay silent for
    hours); only connecting is bounded by ``connect_timeout_s``.  Wrap the
    iteration in ``contextlib.aclosing`` (or call ``aclose()``) so the HTTP
    response is released as soon as the caller stops iterating.

    Raises MetadataError for an ``error`` object, a non-200 answer or an
    undecodable stream; transport failures propagate as ``aiohttp.ClientError``.
    The iteration simply ends when the server closes the stream.
    """
    body = encode_rpc_request(client, method, data)
    headers: dict[str, str] = {}
    if getattr(client, "token", None):
        headers["authorization"] = client.token
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=None)
    async with client.session.post(
        rpc_url(client, method), json=body, headers=headers, timeout=timeout
    ) as resp:
        await _raise_for_http_status(resp, method)
        decoder = json.JSONDecoder()
        text = codecs.getincrementaldecoder("utf-8")()
        buf = ""
        async for chunk in resp.content.iter_any():
            buf += text.decode(chunk)
            objects, pos = _decode_objects(buf, 0, decoder)
            buf = buf[pos:]
            if len(buf) > STREAM_BUFFER_BYTES_MAX:
                raise MetadataError(
                    f"etcd {method} stream sent {len(buf)} bytes that do not decode as JSON"
                )
            for obj in objects:
                yield _unwrap(client, method, obj)
        buf += text.decode(b"", final=True)
        if buf.strip():
            raise MetadataError(f"etcd {method} stream ended inside a JSON object: {buf[:200]!r}")


def _unwrap(client: Any, method: str, obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise MetadataError(f"etcd {method} stream sent a non-object: {str(obj)[:200]}")
    if obj.get("error"):
        raise MetadataError(f"etcd {method} stream error: {_error_text(obj['error'])}")
    result = obj.get("result")
    if not isinstance(result, dict):
        raise MetadataError(f"etcd {method} stream sent an object without result: {str(obj)[:200]}")
    try:
        decoded = decode_rpc_response(client, method, obj)
    except Exception as exc:
        raise MetadataError(f"etcd {method} stream sent an undecodable result: {exc}") from exc
    value = decoded.get("result") if isinstance(decoded, dict) else None
    return value if isinstance(value, dict) else {}


async def lease_keepalive_once(client: Any, lease_id: int, timeout_s: float) -> int:
    """Refresh lease ``lease_id`` once; returns its remaining TTL in seconds,
    0 if the lease no longer exists (expired or revoked).

    The gateway's keep-alive is a bidirectional stream, but the HTTP bridge can
    only send one request body, so each call is one POST whose first answer is
    read before the response is closed.  One POST per refresh costs a little
    more than a long-lived stream but needs no background task and recovers
    from a broken connection on the very next call.

    Raises asyncbk's TimeoutError if no answer arrives within ``timeout_s``,
    MetadataError if etcd answers with an error; transport failures propagate
    as ``aiohttp.ClientError``.
    """
    try:
        async with asyncio.timeout(timeout_s):
            stream = stream_json(
                client, "/lease/keepalive", {"ID": lease_id}, connect_timeout_s=timeout_s
            )
            async with aclosing(stream):
                async for result in stream:
                    return int(result.get("TTL") or 0)
    except BKTimeoutError:
        raise
    except aiohttp.ClientError:
        # aiohttp's connect timeout is also a builtins.TimeoutError: keep it a
        # transport failure so that the caller can try another endpoint.
        raise
    except builtins.TimeoutError:
        raise BKTimeoutError(
            f"etcd lease keep-alive of {lease_id:#x} got no answer in {timeout_s}s"
        ) from None
    raise MetadataError(f"etcd lease keep-alive of {lease_id:#x}: stream closed without an answer")
