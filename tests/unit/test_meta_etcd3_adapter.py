"""The etcd3-py internals asyncbk relies on (``asyncbk.meta.etcd3_adapter``) still do
what the adapter says: an etcd3-py that changed them fails here, loudly, with the
name that changed."""

from __future__ import annotations

import base64
import ssl

import pytest

from asyncbk.meta import etcd3_adapter
from asyncbk.meta.etcd3_adapter import (
    decode_rpc_response,
    encode_rpc_request,
    missing_internals,
    new_client,
    rpc_url,
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_every_internal_the_adapter_uses_is_there() -> None:
    assert missing_internals() == [], "etcd3-py changed: see asyncbk/meta/etcd3_adapter.py"


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself can fail (else the test above proves nothing)."""
    monkeypatch.setitem(etcd3_adapter.INTERNALS, "etcd3.AioClient",
                        (etcd3_adapter.AioClient, ("_url", "_no_such_internal")))
    assert missing_internals() == ["etcd3.AioClient._no_such_internal"]


async def test_urls_requests_and_answers_as_the_gateway_needs_them() -> None:
    client = new_client("127.0.0.1", 2379, 1.0)
    tls = new_client("localhost", 2380, 1.0, ssl.create_default_context())
    try:
        assert rpc_url(client, "/watch") == "http://127.0.0.1:2379/v3/watch"
        assert rpc_url(client, "/version", prefix=False) == "http://127.0.0.1:2379/version"
        assert rpc_url(tls, "/lease/keepalive") == "https://localhost:2380/v3/lease/keepalive"
        body = encode_rpc_request(client, "/watch", {"create_request": {
            "key": b"/a", "range_end": b"/b", "start_revision": 5}})
        request = body["create_request"]
        assert (request["key"], request["range_end"], request["start_revision"]) == (
            b64(b"/a"), b64(b"/b"), 5)
        answer = decode_rpc_response(client, "/watch", {"result": {
            "header": {"revision": "7"},
            "events": [{"type": "DELETE", "kv": {"key": b64(b"/a"), "value": b64(b"x"),
                                                 "mod_revision": "3"}}]}})
        result = answer["result"]
        assert result["header"]["revision"] == 7
        event = result["events"][0]
        assert event["kv"] == {"key": b"/a", "value": b"x", "mod_revision": 3}
        assert getattr(event["type"], "value", None) == "DELETE"
        ttl = decode_rpc_response(client, "/lease/keepalive", {"result": {"ID": "12",
                                                                          "TTL": "5"}})
        assert ttl == {"result": {"ID": 12, "TTL": 5}}
        assert repr(client) == "<etcd client 127.0.0.1:2379>"  # (never its password)
        assert client.server_version_sem >= client.server_version_sem.__class__("3.4.0")
    finally:
        await client.close()
        await tls.close()


def test_etcd3_request_builders_no_longer_inspect_signatures_per_call() -> None:
    """etcd3-py's memoize decorator asks ``getargspec`` twice per call: the adapter
    puts a cache in front of it, with the same answers."""
    import inspect

    import etcd3.utils

    from asyncbk.meta import etcd3_adapter  # noqa: F401  (patches at import)

    spec = etcd3.utils.getargspec
    assert spec(etcd3.utils.incr_last_byte) == inspect.getfullargspec(etcd3.utils.incr_last_byte)
    before = spec.cache_info().hits  # type: ignore[attr-defined]
    spec(etcd3.utils.incr_last_byte)
    assert spec.cache_info().hits == before + 1  # type: ignore[attr-defined]
