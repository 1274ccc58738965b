"""Behavioural contract of :class:`asyncbk.meta.api.MetadataStore`.

Both implementations run these same tests (``tests/unit/test_meta_memory.py``
on the memory store, ``tests/integration/test_meta_etcd.py`` on a real etcd),
which is what keeps the memory store a faithful stand-in for etcd.

A test module subclasses :class:`MetadataStoreContract` and provides a
``make_store`` fixture: an async factory returning a new, connected store
("client") on one shared backend and root per test; the fixture closes what
it made.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import pytest

from asyncbk.errors import MetadataError, MetadataVersionError, NoSuchLedgerError
from asyncbk.meta.api import BookieRegistration, MetadataStore
from asyncbk.meta.model import LedgerMetadata, LedgerState, new_metadata
from asyncbk.types import BookieId

StoreFactory = Callable[[], Awaitable[MetadataStore]]
View = dict[BookieId, BookieRegistration]

WATCH_TIMEOUT_S = 10.0


def make_md(ledger_id: int) -> LedgerMetadata:
    return new_metadata(
        ledger_id=ledger_id,
        ensemble=["10.0.0.1:3181", "10.0.0.2:3181", "10.0.0.3:3181"],
        write_quorum=3,
        ack_quorum=2,
        digest="xxh3",
        password=b"secret",
        custom={"app": b"test"},
        ctime_ms=1_700_000_000_000,
    )


async def next_view(views: AsyncIterator[View], timeout_s: float = WATCH_TIMEOUT_S) -> View:
    return await asyncio.wait_for(anext(views), timeout_s)


async def view_where(
    views: AsyncIterator[View],
    predicate: Callable[[View], bool],
    timeout_s: float = WATCH_TIMEOUT_S,
) -> View:
    """The first view satisfying ``predicate`` (views in between are skipped)."""

    async def scan() -> View:
        async for view in views:
            if predicate(view):
                return view
        raise AssertionError("the watch ended")

    return await asyncio.wait_for(scan(), timeout_s)


def reg(bookie_id: str, readonly: bool = False, **info: Any) -> BookieRegistration:
    return BookieRegistration(bookie_id=bookie_id, readonly=readonly, info=dict(info))


class MetadataStoreContract:
    """Mix into a ``Test*`` class that provides the ``make_store`` fixture."""

    @pytest.fixture
    async def store(self, make_store: StoreFactory) -> MetadataStore:
        return await make_store()

    # --- ledgers ---------------------------------------------------------

    async def test_create_read_update_delete(self, store: MetadataStore) -> None:
        ledger_id = await store.allocate_ledger_id()
        assert ledger_id > 0
        created = await store.create_ledger(make_md(ledger_id))
        assert created.version > 0

        read = await store.read_ledger(ledger_id)
        assert read == created
        assert read.password == b"secret" and read.custom == {"app": b"test"}

        closed = read.replace(state=LedgerState.CLOSED, last_entry_id=9, length=1234)
        updated = await store.update_ledger(closed)
        assert updated.version > created.version
        assert await store.read_ledger(ledger_id) == updated

        await store.delete_ledger(ledger_id, updated.version)
        with pytest.raises(NoSuchLedgerError):
            await store.read_ledger(ledger_id)

    async def test_lost_cas_and_missing_ledgers(self, store: MetadataStore) -> None:
        ledger_id = await store.allocate_ledger_id()
        v1 = await store.create_ledger(make_md(ledger_id))
        with pytest.raises(MetadataVersionError):
            await store.create_ledger(make_md(ledger_id))

        v2 = await store.update_ledger(v1.replace(last_entry_id=1))
        with pytest.raises(MetadataVersionError):  # stale version: lost race
            await store.update_ledger(v1.replace(last_entry_id=2))
        with pytest.raises(MetadataVersionError):
            await store.delete_ledger(ledger_id, v1.version)
        assert (await store.read_ledger(ledger_id)).last_entry_id == 1

        await store.delete_ledger(ledger_id)
        with pytest.raises(NoSuchLedgerError):  # deleted meanwhile, not "changed"
            await store.update_ledger(v2.replace(last_entry_id=3))
        with pytest.raises(NoSuchLedgerError):
            await store.delete_ledger(ledger_id)
        with pytest.raises(NoSuchLedgerError):
            await store.delete_ledger(ledger_id, v2.version)
        with pytest.raises(NoSuchLedgerError):
            await store.read_ledger(ledger_id + 10**12)

    async def test_concurrent_id_allocation_is_unique(self, make_store: StoreFactory) -> None:
        stores = [await make_store() for _ in range(4)]
        ids = await asyncio.gather(*(stores[i % 4].allocate_ledger_id() for i in range(200)))
        assert len(set(ids)) == 200
        assert min(ids) > 0

    async def test_ids_increase(self, store: MetadataStore) -> None:
        ids = [await store.allocate_ledger_id() for _ in range(5)]
        assert ids == sorted(ids) and len(set(ids)) == 5

    async def test_concurrent_cas_exactly_one_wins(self, make_store: StoreFactory) -> None:
        a, b = await make_store(), await make_store()
        ledger_id = await a.allocate_ledger_id()
        base = await a.create_ledger(make_md(ledger_id))
        outcomes = await asyncio.gather(
            a.update_ledger(base.replace(last_entry_id=100)),
            b.update_ledger(base.replace(last_entry_id=200)),
            return_exceptions=True,
        )
        winners = [o for o in outcomes if isinstance(o, LedgerMetadata)]
        losers = [o for o in outcomes if isinstance(o, MetadataVersionError)]
        assert len(winners) == 1 and len(losers) == 1, outcomes
        assert await b.read_ledger(ledger_id) == winners[0]

    async def test_list_ledgers_in_order_with_paging(self, make_store: StoreFactory) -> None:
        store = await make_store()
        assert [i async for i in store.iter_ledger_ids()] == []
        wanted = [7, 1, 1000, 42, 3, 10**15, 99, 100, 8]
        for ledger_id in wanted:
            await store.create_ledger(make_md(ledger_id))
        for page_size in (1, 2, 3, 1000):
            assert [i async for i in store.iter_ledger_ids(page_size)] == sorted(wanted)
        other = await make_store()
        await other.delete_ledger(1000)
        assert [i async for i in store.iter_ledger_ids(4)] == sorted(set(wanted) - {1000})

    # --- leases and bookie registry ---------------------------------------

    async def test_register_writable_then_readonly(self, store: MetadataStore) -> None:
        lease = await store.grant_lease(30)
        await store.register_bookie(reg("b1:3181", host="b1", n=1), lease)
        await store.register_bookie(reg("b2:3181"), lease)
        view = await store.list_bookies()
        assert view == {
            "b1:3181": reg("b1:3181", host="b1", n=1),
            "b2:3181": reg("b2:3181"),
        }

        await store.register_bookie(reg("b1:3181", readonly=True, host="b1"), lease)
        view = await store.list_bookies()
        assert view["b1:3181"] == reg("b1:3181", readonly=True, host="b1")
        assert len(view) == 2  # the writable key is gone, not listed twice

        await store.register_bookie(reg("b1:3181", readonly=False), lease)
        assert (await store.list_bookies())["b1:3181"].readonly is False

        await store.unregister_bookie("b1:3181")
        await store.unregister_bookie("never-registered:1")
        assert set(await store.list_bookies()) == {"b2:3181"}
        await store.revoke_lease(lease)

    async def test_lease_revoke_drops_registrations(self, store: MetadataStore) -> None:
        lease = await store.grant_lease(30)
        assert await store.keepalive_lease(lease) > 0
        await store.register_bookie(reg("b1:3181"), lease)
        await store.revoke_lease(lease)
        assert await store.list_bookies() == {}
        assert await store.keepalive_lease(lease) == 0
        await store.revoke_lease(lease)  # revoking again is harmless
        with pytest.raises(MetadataError):
            await store.register_bookie(reg("b1:3181"), lease)

    async def test_watch_sees_adds_and_removes(self, make_store: StoreFactory) -> None:
        watcher, writer = await make_store(), await make_store()
        lease = await writer.grant_lease(30)
        await writer.register_bookie(reg("b0:1"), lease)
        async with aclosing(watcher.watch_bookies()) as views:
            assert set(await next_view(views)) == {"b0:1"}

            await writer.register_bookie(reg("b1:1", host="x"), lease)
            view = await view_where(views, lambda v: "b1:1" in v)
            assert view["b1:1"] == reg("b1:1", host="x")

            await writer.register_bookie(reg("b1:1", readonly=True), lease)
            view = await view_where(views, lambda v: v.get("b1:1", reg("?")).readonly)
            assert set(view) == {"b0:1", "b1:1"}

            await writer.unregister_bookie("b0:1")
            assert set(await view_where(views, lambda v: "b0:1" not in v)) == {"b1:1"}

            await writer.revoke_lease(lease)
            assert await view_where(views, lambda v: not v) == {}

    async def test_watch_ends_when_store_closes(self, make_store: StoreFactory) -> None:
        store = await make_store()
        views = store.watch_bookies()
        try:
            assert await next_view(views) == {}
            pending = asyncio.ensure_future(anext(views))
            await asyncio.sleep(0.2)
            await store.close()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(pending, WATCH_TIMEOUT_S)
        finally:
            await views.aclose()
        with pytest.raises(MetadataError):
            await store.list_bookies()

    # --- cookies and cluster identity -------------------------------------

    async def test_cookies(self, make_store: StoreFactory) -> None:
        a, b = await make_store(), await make_store()
        assert await a.read_cookie("b1:1") is None
        with pytest.raises(MetadataVersionError):  # CAS on an absent cookie
            await a.write_cookie("b1:1", b"c0", 12345)

        v1 = await a.write_cookie("b1:1", b"c1", None)
        assert await b.read_cookie("b1:1") == (b"c1", v1)
        with pytest.raises(MetadataVersionError):  # create-if-absent: exists
            await b.write_cookie("b1:1", b"other", None)

        v2 = await b.write_cookie("b1:1", b"c2", v1)
        assert v2 > v1
        with pytest.raises(MetadataVersionError):  # stale version
            await a.write_cookie("b1:1", b"c3", v1)
        assert await a.read_cookie("b1:1") == (b"c2", v2)

        await a.delete_cookie("b1:1")
        await a.delete_cookie("b1:1")
        assert await b.read_cookie("b1:1") is None

    async def test_instance_id_is_stable(self, make_store: StoreFactory) -> None:
        stores = [await make_store() for _ in range(4)]
        ids = await asyncio.gather(*(s.get_or_create_instance_id() for s in stores))
        assert len(set(ids)) == 1 and len(ids[0]) == 36
        assert await stores[0].get_or_create_instance_id() == ids[0]

    # --- auto-recovery: locks and under-replication marks --------------------

    async def test_lock_is_exclusive_and_goes_with_its_lease(self,
                                                             make_store: StoreFactory) -> None:
        a, b = await make_store(), await make_store()
        la, lb = await a.grant_lease(30), await b.grant_lease(30)
        holders = await asyncio.gather(a.acquire_lock("auditor", "A", la),
                                       b.acquire_lock("auditor", "B", lb))
        assert holders[0] == holders[1] and holders[0] in ("A", "B")
        winner, loser = (a, b) if holders[0] == "A" else (b, a)
        won_lease = la if winner is a else lb
        assert await loser.lock_holder("auditor") == holders[0]
        assert await winner.acquire_lock("auditor", holders[0], won_lease) == holders[0]
        await loser.release_lock("auditor", "nobody")  # not the holder: nothing happens
        assert await a.lock_holder("auditor") == holders[0]
        await winner.revoke_lease(won_lease)  # the holder dies
        assert await a.lock_holder("auditor") is None
        other = "B" if holders[0] == "A" else "A"
        other_lease = lb if winner is a else la
        assert await loser.acquire_lock("auditor", other, other_lease) == other
        await loser.release_lock("auditor", other)
        assert await a.lock_holder("auditor") is None
        assert await a.lock_holder("ledger-7") is None
        with pytest.raises(MetadataError):
            await a.acquire_lock("ledger-7", "A", won_lease)  # revoked lease

    async def test_underreplication_marks(self, make_store: StoreFactory) -> None:
        a, b = await make_store(), await make_store()
        assert await a.list_underreplicated() == []
        await a.mark_underreplicated(12, {"b1:3181"})
        await b.mark_underreplicated(12, {"b2:3181", "b1:3181"})
        await b.mark_underreplicated(3, {"b9:3181"})
        (m3, m12) = await a.list_underreplicated()
        assert (m3.ledger_id, m3.bookies) == (3, frozenset({"b9:3181"}))
        assert (m12.ledger_id, m12.bookies) == (12, frozenset({"b1:3181", "b2:3181"}))
        assert m12.marked_ms > 0
        await a.mark_underreplicated(12, {"b1:3181"})  # already known: unchanged
        assert (await a.list_underreplicated())[1].version == m12.version
        await b.mark_underreplicated(12, {"b3:3181"})  # a new loss: the version moves
        assert not await a.clear_underreplicated(12, m12.version)
        (_, fresh) = await a.list_underreplicated()
        assert fresh.bookies == {"b1:3181", "b2:3181", "b3:3181"}
        assert await a.clear_underreplicated(12, fresh.version)
        assert not await a.clear_underreplicated(12, fresh.version)  # already gone
        assert [m.ledger_id for m in await b.list_underreplicated()] == [3]

    # --- generic keys ------------------------------------------------------

    async def test_kv_transactions_are_all_or_nothing(self, make_store: StoreFactory) -> None:
        a, b = await make_store(), await make_store()
        p = f"{a.root}/kvtest/"
        assert await a.kv_get(p + "x") is None
        rev = await a.kv_txn([(p + "x", 0)], put=[(p + "x", b"1"), (p + "y", b"2")])
        x = await b.kv_get(p + "x")
        assert x is not None and (x.value, x.version) == (b"1", rev)
        # A stale compare changes nothing, and names the key.
        with pytest.raises(MetadataVersionError, match="kvtest/x"):
            await b.kv_txn([(p + "y", rev), (p + "x", 0)], put=[(p + "z", b"3")],
                           delete=[p + "y"])
        assert await a.kv_get(p + "z") is None and await a.kv_get(p + "y") is not None
        # Concurrent CAS on one version: exactly one wins.
        results = await asyncio.gather(
            a.kv_txn([(p + "x", rev)], put=[(p + "x", b"a")]),
            b.kv_txn([(p + "x", rev)], put=[(p + "x", b"b")]), return_exceptions=True)
        assert sum(isinstance(r, int) for r in results) == 1
        assert sum(isinstance(r, MetadataVersionError) for r in results) == 1
        # Ranges are in key order, pageable; a prefix delete takes every key under it.
        await a.kv_txn([], put=[(p + f"s/{i:03d}", b"%d" % i) for i in range(5)])
        page = await a.kv_range(p + "s/", limit=2)
        assert [kv.key for kv in page] == [p + "s/000", p + "s/001"]
        rest = await a.kv_range(p + "s/", after=page[-1].key)
        assert [kv.value for kv in rest] == [b"2", b"3", b"4"]
        await b.kv_txn([], delete_prefix=[p + "s/"], delete=[p + "x"])
        assert await a.kv_range(p + "s/") == [] and await a.kv_get(p + "x") is None
        assert await a.kv_get(p + "y") is not None
