"""The metadata store against a real etcd with TLS (client certificates required)
and authentication on: it works as a permitted user, re-authenticates when etcd
forgets its token, and every wrong setting is refused with a message that says
what to fix and holds no password."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from asyncbk.errors import ConfigError, MetadataError
from asyncbk.local.etcd import EtcdServer
from asyncbk.local.tls import LocalTLS
from asyncbk.meta.api import BookieRegistration
from asyncbk.meta.etcd import EtcdMetadataStore
from asyncbk.meta.uri import open_metadata_store
from asyncbk.net.security import client_context

pytestmark = pytest.mark.asyncio

USER = "abk"
PASSWORD = "pw-7d1e0b2c"
ROOT = "/secure"


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls(tmp_path: Path, ca: trustme.CA) -> LocalTLS:
    """The files of LocalTLS, from a CA the test keeps (to issue more certificates)."""
    d = tmp_path / "tls"
    d.mkdir()
    made = LocalTLS(d, d / "ca.pem", d / "etcd.pem", d / "etcd.key", d / "client.pem",
                    d / "client.key")
    ca.cert_pem.write_to_path(str(made.ca))
    for leaf, cert, key in ((ca.issue_cert("127.0.0.1", "localhost"), made.server_cert,
                             made.server_key),
                            (ca.issue_cert("asyncbk-client"), made.client_cert,
                             made.client_key)):
        leaf.cert_chain_pems[0].write_to_path(str(cert))
        leaf.private_key_pem.write_to_path(str(key))
    return made


@pytest.fixture
async def etcd(tmp_path: Path, tls: LocalTLS) -> AsyncIterator[EtcdServer]:
    # A 2 s token TTL, so that a token expiring is something a test can wait for.
    server = EtcdServer(tmp_path / "etcd", tls=tls, extra_args=("--auth-token-ttl", "2"))
    await server.start()
    try:
        await server.enable_auth(USER, PASSWORD, ROOT)
        await server.enable_auth(USER, PASSWORD, ROOT)  # on already: nothing to do
        yield server
    finally:
        await server.stop()


async def _open(etcd: EtcdServer, tls: LocalTLS, root: str = ROOT, **kwargs: object) -> object:
    ctx = await asyncio.to_thread(tls.client_context)
    options: dict[str, object] = {"ssl": ctx, "user": USER, "password": PASSWORD, **kwargs}
    return await open_metadata_store(etcd.uri(root), timeout_s=5.0, **options)  # type: ignore[arg-type]


async def test_a_permitted_user_over_mutual_tls_reads_writes_watches_and_leases(
        etcd: EtcdServer, tls: LocalTLS) -> None:
    assert etcd.uri(ROOT).startswith("etcds://")
    store = await _open(etcd, tls)
    assert isinstance(store, EtcdMetadataStore)
    try:
        ledger_id = await store.allocate_ledger_id()
        assert ledger_id > 0
        lease = await store.grant_lease(5)
        assert await store.keepalive_lease(lease) > 0
        views = store.watch_bookies()
        assert await anext(views) == {}
        await store.register_bookie(BookieRegistration("127.0.0.1:3181", False, {}), lease)
        async with asyncio.timeout(10):
            view = await anext(views)
        assert list(view) == ["127.0.0.1:3181"]
        await views.aclose()
        await store.revoke_lease(lease)
    finally:
        await store.close()


async def test_an_expired_token_is_renewed_for_calls_watches_and_keepalives(
        etcd: EtcdServer, tls: LocalTLS) -> None:
    """etcd drops a simple token unused for --auth-token-ttl (2 s here) and all of
    them when it restarts; the store authenticates again and the call succeeds."""
    store = await _open(etcd, tls)
    assert isinstance(store, EtcdMetadataStore)
    try:
        lease = await store.grant_lease(30)
        first = await store.allocate_ledger_id()
        await asyncio.sleep(4)  # the token expires
        assert await store.allocate_ledger_id() > first
        await asyncio.sleep(4)
        assert await store.keepalive_lease(lease) > 0  # a streamed answer says it otherwise
        await etcd.stop()
        await etcd.start()
        assert await store.allocate_ledger_id() > first
        views = store.watch_bookies()
        await asyncio.sleep(4)
        async with asyncio.timeout(10):
            assert await anext(views) == {}
        await views.aclose()
    finally:
        await store.close()


async def test_wrong_or_missing_credentials_are_refused_clearly(
        etcd: EtcdServer, tls: LocalTLS, tmp_path: Path) -> None:
    ctx = await asyncio.to_thread(tls.client_context)
    uri = etcd.uri(ROOT)
    cases: dict[str, tuple[dict[str, object], str]] = {
        "wrong password": ({"ssl": ctx, "user": USER, "password": "not-" + PASSWORD},
                           "wrong user name or password"),
        "unknown user": ({"ssl": ctx, "user": "nobody", "password": PASSWORD},
                         "wrong user name or password"),
        "no user": ({"ssl": ctx}, "requires authentication"),
    }
    for what, (options, expected) in cases.items():
        with pytest.raises(MetadataError, match=expected) as info:
            await open_metadata_store(uri, timeout_s=5.0, **options)  # type: ignore[arg-type]
        assert PASSWORD not in str(info.value), what
    # outside the user's prefix: permission denied, naming the prefix
    with pytest.raises(MetadataError, match="permission denied.*/elsewhere") as info:
        await _open(etcd, tls, root="/elsewhere")
    assert PASSWORD not in str(info.value)
    # TLS: no CA (the system's do not know this one), no client certificate,
    # a certificate of another CA, plain HTTP against TLS, TLS options with etcd://
    other = trustme.CA().issue_cert("asyncbk-client")
    (tmp_path / "o.pem").write_bytes(other.cert_chain_pems[0].bytes())
    (tmp_path / "o.key").write_bytes(other.private_key_pem.bytes())
    no_cert = client_context(str(tls.ca))
    stranger = client_context(str(tls.ca), str(tmp_path / "o.pem"), str(tmp_path / "o.key"))
    for ssl_ctx in (None, no_cert, stranger):
        with pytest.raises(MetadataError, match="TLS|cannot reach"):
            await open_metadata_store(uri, timeout_s=5.0, ssl=ssl_ctx, user=USER,
                                      password=PASSWORD)
    with pytest.raises(MetadataError, match="etcds://"):
        await open_metadata_store(uri.replace("etcds://", "etcd://"), timeout_s=5.0)
    with pytest.raises(ConfigError, match="etcds://"):
        await open_metadata_store(uri.replace("etcds://", "etcd://"), timeout_s=5.0,
                                  ssl=ssl.create_default_context())
    with pytest.raises(ConfigError, match="both a user name and a password"):
        await open_metadata_store(uri, timeout_s=5.0, ssl=ctx, user=USER)


async def test_a_client_certificate_with_a_common_name_is_refused_with_advice(
        etcd: EtcdServer, tls: LocalTLS, ca: trustme.CA, tmp_path: Path) -> None:
    """etcd's JSON gateway answers such a client in plain text once auth is on; the
    error says so and what to do, instead of an AttributeError from etcd3-py."""
    leaf = ca.issue_cert("asyncbk-client", common_name="asyncbk-client")
    leaf.cert_chain_pems[0].write_to_path(str(tmp_path / "cn.pem"))
    leaf.private_key_pem.write_to_path(str(tmp_path / "cn.key"))
    ctx = client_context(str(tls.ca), str(tmp_path / "cn.pem"), str(tmp_path / "cn.key"))
    with pytest.raises(MetadataError, match="without a CN") as info:
        await open_metadata_store(etcd.uri(ROOT), timeout_s=5.0, ssl=ctx, user=USER,
                                  password=PASSWORD)
    assert PASSWORD not in str(info.value)
