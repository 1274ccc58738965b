"""MemoryMetadataStore: the shared metadata contract, plus lease expiry on a
manual clock and state sharing between store objects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest

from asyncbk.clock import ManualClock
from asyncbk.errors import MetadataError
from asyncbk.meta.api import MetadataStore
from asyncbk.meta.memory import (
    MemoryMetadataState,
    MemoryMetadataStore,
    forget_named_states,
    named_state,
)
from asyncbk.meta.uri import open_metadata_store

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

pytestmark = pytest.mark.usefixtures("loop_errors")


class TestMemoryContract(MetadataStoreContract):
    @pytest.fixture
    async def make_store(self) -> AsyncIterator[StoreFactory]:
        state = MemoryMetadataState()
        made: list[MemoryMetadataStore] = []

        async def make() -> MetadataStore:
            store = MemoryMetadataStore("/contract", state=state)
            made.append(store)
            return store

        yield make
        for store in made:
            await store.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def store(clock: ManualClock) -> AsyncIterator[MemoryMetadataStore]:
    store = MemoryMetadataStore("/t", clock=clock)
    yield store
    await store.close()


async def test_lease_expires_without_keepalive(
    store: MemoryMetadataStore, clock: ManualClock
) -> None:
    lease = await store.grant_lease(5)
    await store.register_bookie(reg("b1:1"), lease)
    clock.advance(4)
    assert set(await store.list_bookies()) == {"b1:1"}
    assert await store.keepalive_lease(lease) == 5
    clock.advance(4)  # 8 s after the grant, 4 after the keep-alive
    assert set(await store.list_bookies()) == {"b1:1"}
    clock.advance(1.5)
    assert await store.list_bookies() == {}
    assert await store.keepalive_lease(lease) == 0
    with pytest.raises(MetadataError):
        await store.register_bookie(reg("b1:1"), lease)


async def test_expire_leases_applies_expiry_now(
    store: MemoryMetadataStore, clock: ManualClock
) -> None:
    lease = await store.grant_lease(2)
    await store.register_bookie(reg("b1:1"), lease)
    await store.register_bookie(reg("b2:1", readonly=True), lease)
    revision = store.state.revision
    clock.advance(2)
    assert store.expire_leases() == 1
    assert store.state.revision == revision + 1  # one change deletes both keys
    assert store.state.range("/t/bookies/") == []


async def test_watch_wakes_on_lease_expiry_alone(
    store: MemoryMetadataStore, clock: ManualClock
) -> None:
    """No call is made after the registration: the watcher itself must notice
    that the lease ran out when the clock passes its deadline."""
    lease = await store.grant_lease(3)
    await store.register_bookie(reg("b1:1"), lease)
    async with aclosing(store.watch_bookies()) as views:
        assert set(await next_view(views)) == {"b1:1"}
        pending = asyncio.ensure_future(anext(views))
        await asyncio.sleep(0.01)
        assert not pending.done()
        clock.advance(3)
        assert await asyncio.wait_for(pending, 5) == {}


async def test_watch_with_system_clock_sees_expiry() -> None:
    store = MemoryMetadataStore()
    try:
        lease = await store.grant_lease(1)
        await store.register_bookie(reg("b1:1"), lease)
        async with aclosing(store.watch_bookies()) as views:
            assert set(await next_view(views)) == {"b1:1"}
            assert await view_where(views, lambda v: not v, timeout_s=3) == {}
    finally:
        await store.close()


async def test_keepalive_keeps_registration(store: MemoryMetadataStore, clock: ManualClock) -> None:
    lease = await store.grant_lease(3)
    await store.register_bookie(reg("b1:1"), lease)
    for _ in range(10):
        clock.advance(1)
        assert await store.keepalive_lease(lease) == 3
    assert set(await store.list_bookies()) == {"b1:1"}


async def test_versions_follow_one_store_wide_revision(store: MemoryMetadataStore) -> None:
    id1 = await store.allocate_ledger_id()
    md = await store.create_ledger(make_md(id1))
    id2 = await store.allocate_ledger_id()
    assert id1 < md.version < id2
    assert store.state.revision == id2


async def test_stores_share_state_but_not_roots() -> None:
    state = MemoryMetadataState()
    a = MemoryMetadataStore("/a", state=state)
    a2 = MemoryMetadataStore("a/", state=state)
    b = MemoryMetadataStore("/b", state=state)
    try:
        ledger_id = await a.allocate_ledger_id()
        await a.create_ledger(make_md(ledger_id))
        assert (await a2.read_ledger(ledger_id)).ledger_id == ledger_id
        assert [i async for i in b.iter_ledger_ids()] == []
        assert await a.get_or_create_instance_id() == await a2.get_or_create_instance_id()
        assert await a.get_or_create_instance_id() != await b.get_or_create_instance_id()
        await a.close()
        with pytest.raises(MetadataError):
            await a.read_ledger(ledger_id)
        assert (await a2.read_ledger(ledger_id)).ledger_id == ledger_id  # others unaffected
    finally:
        for s in (a, a2, b):
            await s.close()


async def test_shared_state_clock_conflict_is_refused() -> None:
    state = MemoryMetadataState(ManualClock())
    with pytest.raises(ValueError):
        MemoryMetadataStore(state=state, clock=ManualClock())
    MemoryMetadataStore(state=state, clock=state.clock)  # the same clock is fine


async def test_memory_uri_names_a_process_wide_state() -> None:
    forget_named_states()
    try:
        a = await open_metadata_store("memory://cluster1/ns")
        b = await open_metadata_store("memory://cluster1/ns")
        c = await open_metadata_store("memory://cluster2/ns")
        assert isinstance(a, MemoryMetadataStore) and a.root == "/ns"
        assert a.state is named_state("cluster1") is not named_state("cluster2")
        ledger_id = await a.allocate_ledger_id()
        await a.create_ledger(make_md(ledger_id))
        assert (await b.read_ledger(ledger_id)).ledger_id == ledger_id
        assert [i async for i in c.iter_ledger_ids()] == []
        for s in (a, b, c):
            await s.close()
    finally:
        forget_named_states()


async def test_bad_arguments(store: MemoryMetadataStore) -> None:
    with pytest.raises(ValueError):
        await store.grant_lease(0)
    with pytest.raises(ValueError):
        [i async for i in store.iter_ledger_ids(0)]
