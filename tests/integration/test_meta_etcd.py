"""EtcdMetadataStore against a real etcd: the shared metadata contract, plus
what only a real server shows (lease expiry in real time, etcd restarts,
unreachable or mute endpoints, the streaming adapter)."""

from __future__ import annotations

import asyncio
import gc
import time
import warnings
from collections.abc import AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest

from asyncbk.errors import MetadataError
from asyncbk.errors import TimeoutError as BKTimeoutError
from asyncbk.meta.api import MetadataStore
from asyncbk.meta.etcd import EtcdMetadataStore
from asyncbk.meta.etcd3_adapter import new_client
from asyncbk.meta.etcd_stream import lease_keepalive_once, stream_json
from asyncbk.meta.uri import open_metadata_store
from asyncbk.testing.etcd import EtcdServer, EtcdServerError, find_etcd_binary, free_port

# Plain asserts in the shared contract module get pytest's rewriting too.
pytest.register_assert_rewrite("tests.meta_contract")
from tests.meta_contract import (  # noqa: E402
    MetadataStoreContract,
    StoreFactory,
    make_md,
    next_view,
    reg,
    view_where,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


async def connect(server: EtcdServer, root: str, **kwargs: float) -> EtcdMetadataStore:
    return await EtcdMetadataStore.connect([(server.host, server.port)], root, **kwargs)


class TestEtcdContract(MetadataStoreContract):
    @pytest.fixture
    async def make_store(self, etcd_server: EtcdServer, root: str) -> AsyncIterator[StoreFactory]:
        made: list[EtcdMetadataStore] = []

        async def make() -> MetadataStore:
            store = await connect(etcd_server, root, timeout_s=5.0)
            made.append(store)
            return store

        yield make
        for store in made:
            await store.close()


@pytest.fixture
async def store(etcd_server: EtcdServer, root: str) -> AsyncIterator[EtcdMetadataStore]:
    store = await connect(etcd_server, root, timeout_s=5.0)
    yield store
    await store.close()


async def test_lease_expiry_and_keepalive(store: EtcdMetadataStore) -> None:
    """ttl 2: the lease nobody refreshes takes its registration with it within
    the TTL (plus etcd's expiry tick); the one refreshed every ttl/3 stays."""
    ttl_s = 2
    dying = await store.grant_lease(ttl_s)
    kept = await store.grant_lease(ttl_s)
    await store.register_bookie(reg("dying:1"), dying)
    await store.register_bookie(reg("kept:1"), kept)
    registered_at = time.monotonic()

    async def keep_alive() -> None:
        while True:
            assert await store.keepalive_lease(kept) > 0
            await asyncio.sleep(ttl_s / 3)

    keeper = asyncio.create_task(keep_alive())
    try:
        async with aclosing(store.watch_bookies()) as views:
            await view_where(views, lambda v: "dying:1" not in v, timeout_s=ttl_s + 3)
            gone_after_s = time.monotonic() - registered_at
            assert ttl_s - 0.5 <= gone_after_s <= ttl_s + 2.0
        await asyncio.sleep(3 * ttl_s - gone_after_s)  # well past the TTL
        assert set(await store.list_bookies()) == {"kept:1"}
        assert not keeper.done()
    finally:
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
    assert await store.keepalive_lease(dying) == 0
    await store.revoke_lease(kept)
    assert await store.list_bookies() == {}


async def test_watch_survives_etcd_restart(tmp_path: Path) -> None:
    async with EtcdServer(tmp_path / "etcd") as server:
        store = await connect(server, "/restart", timeout_s=2.0, watch_backoff_s_max=0.5)
        try:
            lease = await store.grant_lease(60)
            await store.register_bookie(reg("b1:1"), lease)
            async with aclosing(store.watch_bookies()) as views:
                assert set(await next_view(views)) == {"b1:1"}
                pending = asyncio.ensure_future(anext(views))
                await server.stop()
                await asyncio.sleep(1.0)  # the watch breaks and re-listing fails meanwhile
                assert not pending.done()
                await server.start()  # same ports, same data
                await store.register_bookie(reg("b2:1"), lease)
                view = await asyncio.wait_for(pending, 15)
                if set(view) != {"b1:1", "b2:1"}:
                    view = await view_where(views, lambda v: set(v) == {"b1:1", "b2:1"}, 15)
                await store.unregister_bookie("b1:1")
                assert set(await view_where(views, lambda v: "b1:1" not in v)) == {"b2:1"}
        finally:
            await store.close()


async def test_failover_skips_a_dead_endpoint(etcd_server: EtcdServer, root: str) -> None:
    dead = ("127.0.0.1", free_port())
    live = (etcd_server.host, etcd_server.port)
    for endpoints in ([dead, live], [live, dead]):
        store = await EtcdMetadataStore.connect(endpoints, root, timeout_s=5.0)
        try:
            ledger_id = await store.allocate_ledger_id()
            await store.create_ledger(make_md(ledger_id))
            assert (await store.read_ledger(ledger_id)).ledger_id == ledger_id
        finally:
            await store.close()
    # Not connected through connect(): the first call itself must fail over.
    store = EtcdMetadataStore([dead, live], root, timeout_s=5.0)
    try:
        assert await store.allocate_ledger_id() > 0
    finally:
        await store.close()


async def test_unreachable_etcd_fails_clearly() -> None:
    port = free_port()
    with pytest.raises(MetadataError) as info:
        await EtcdMetadataStore.connect([("127.0.0.1", port)], "/x", timeout_s=2.0)
    message = str(info.value)
    assert message == (f"cannot reach etcd at 127.0.0.1:{port} (connection refused) -- is "
                       "etcd running?")


async def test_mute_endpoint_times_out() -> None:
    """A server that accepts connections but never answers: every call ends
    with asyncbk's TimeoutError after timeout_s, connect() with MetadataError."""
    accepted: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(MetadataError, match="cannot reach etcd"):
            await EtcdMetadataStore.connect([("127.0.0.1", port)], "/x", timeout_s=0.5)
        store = EtcdMetadataStore([("127.0.0.1", port)], "/x", timeout_s=0.5)
        try:
            started = time.monotonic()
            with pytest.raises(BKTimeoutError):
                await store.read_ledger(1)
            assert time.monotonic() - started < 2.0
            with pytest.raises(BKTimeoutError):
                await store.keepalive_lease(1)
        finally:
            await store.close()
    finally:
        for writer in accepted:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_roots_are_isolated(etcd_server: EtcdServer, root: str) -> None:
    a = await connect(etcd_server, root + "/a")
    b = await connect(etcd_server, root + "/b")
    try:
        ledger_id = await a.allocate_ledger_id()
        await a.create_ledger(make_md(ledger_id))
        lease = await a.grant_lease(30)
        await a.register_bookie(reg("b1:1"), lease)
        assert [i async for i in b.iter_ledger_ids()] == []
        assert await b.list_bookies() == {}
        assert await a.get_or_create_instance_id() != await b.get_or_create_instance_id()
        await a.revoke_lease(lease)
    finally:
        await a.close()
        await b.close()


async def test_open_metadata_store_etcd_uri(etcd_server: EtcdServer, root: str) -> None:
    store = await open_metadata_store(etcd_server.uri(root), timeout_s=5.0)
    try:
        assert isinstance(store, EtcdMetadataStore)
        assert store.root == root
        assert len(await store.get_or_create_instance_id()) == 36
    finally:
        await store.close()


async def test_stream_adapter_watch_and_keepalive(etcd_server: EtcdServer, root: str) -> None:
    client = new_client(etcd_server.host, etcd_server.port)
    try:
        key = f"{root}/stream/k".encode()
        start = (await client.put(key, b"v1")).header.revision
        await client.delete_range(key)
        request = {"create_request": {"key": key, "start_revision": start}}
        events: list[dict[str, Any]] = []
        async with aclosing(stream_json(client, "/watch", request)) as results:
            async for result in results:
                events.extend(result.get("events") or [])
                if len(events) >= 2:
                    break
        put, delete = events
        assert put["kv"]["key"] == key and put["kv"]["value"] == b"v1"
        assert put["kv"]["mod_revision"] == start and "type" not in put
        assert delete["type"].value == "DELETE" and delete["kv"]["mod_revision"] == start + 1

        lease = (await client.lease_grant(5)).ID
        assert 0 < await lease_keepalive_once(client, lease, 5.0) <= 5
        await client.lease_revoke(lease)
        assert await lease_keepalive_once(client, lease, 5.0) == 0

        with pytest.raises(MetadataError, match="HTTP 404"):
            async with aclosing(stream_json(client, "/no/such/method", {})) as results:
                async for _ in results:
                    pass
    finally:
        await client.close()


async def test_close_leaves_no_unclosed_sessions(etcd_server: EtcdServer, root: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = await connect(etcd_server, root)
        await store.allocate_ledger_id()
        async with aclosing(store.watch_bookies()) as views:
            await next_view(views)
        await store.close()
        await store.close()  # idempotent
        del store, views
        gc.collect()
        await asyncio.sleep(0)
    unclosed = [w for w in caught if "nclosed" in str(w.message)]
    assert unclosed == []


def test_find_etcd_binary() -> None:
    assert Path(find_etcd_binary()).is_file()


async def test_etcd_server_reports_a_failed_start(tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "bad", extra_args=("--no-such-flag",), ready_timeout_s=5.0)
    with pytest.raises(EtcdServerError, match="exited with code") as info:
        await server.start()
    assert "no-such-flag" in str(info.value)  # the log tail explains why
    assert not server.running
    await server.stop()  # harmless after a failed start
