"""Auto-recovery with real processes: etcd, bookies and ``asyncbk autorecovery``."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from asyncbk.autorecovery.service import AUDITOR_LOCK
from asyncbk.client.client import BookKeeper
from asyncbk.client.quorum import write_set
from asyncbk.clock import ManualClock
from asyncbk.meta.etcd import EtcdMetadataStore
from asyncbk.meta.model import LedgerMetadata
from asyncbk.proto import ReadRequest, ReadResponse, Status
from asyncbk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

FAST = {"lost_bookie_delay": 2, "audit_interval": 5, "open_ledger_grace": 3, "rate": 0}


@pytest.fixture
async def cluster4(tmp_path):  # type: ignore[no-untyped-def]
    async with LocalCluster(bookies=4, data_dir=tmp_path / "cluster") as c:
        yield c


async def stored_everywhere(bk: BookKeeper, md: LedgerMetadata) -> bool:
    """Whether every entry is on every bookie of its write set (asked directly)."""
    for index, (first, ensemble) in enumerate(md.ensembles):
        last = md.fragment_bounds(index)[1]
        for entry_id in range(first, last + 1):
            for p in write_set(entry_id, md.ensemble_size, md.write_quorum):
                ch = bk.bookie_client.channel(ensemble[p])
                resp = await ch.request(ReadRequest(ch.next_request_id(), md.ledger_id,
                                                    entry_id, 0, b""), 5.0)
                assert isinstance(resp, ReadResponse)
                if resp.status != Status.OK:
                    return False
    return True


async def test_dead_bookie_is_replaced_in_every_ledger(cluster4: LocalCluster) -> None:
    bk = await cluster4.client()
    payloads: dict[int, list[bytes]] = {}
    for n in range(4):
        lh = await bk.create_ledger(3, 2, 2, password=b"pw")
        data = [b"ledger %d entry %d" % (lh.id, i) for i in range(200 + n * 50)]
        await asyncio.gather(*(lh.append(d) for d in data))
        await lh.close()
        payloads[lh.id] = data
    idle = await bk.create_ledger(3, 3, 2, password=b"pw")  # open, writer idle (then gone)
    idle_data = [b"open %d" % i for i in range(100)]
    await asyncio.gather(*(idle.append(d) for d in idle_data))
    payloads[idle.id] = idle_data

    idle_md = await bk.ledger_metadata(idle.id)
    victim = next(b for b in cluster4.bookies if b.id == idle_md.ensembles[0][1][0])
    on_victim = [lid for lid in payloads
                 if victim.id in (await bk.ledger_metadata(lid)).all_bookies()]
    assert idle.id in on_victim
    await cluster4.start_autorecovery(**FAST)
    victim.kill()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    async with asyncio.timeout(90):
        while True:
            mds = [await bk.ledger_metadata(lid) for lid in payloads]
            if not any(victim.id in md.all_bookies() for md in mds):
                break
            await asyncio.sleep(0.5)
    healed_s = loop.time() - t0
    assert healed_s >= FAST["lost_bookie_delay"]  # not before the delay
    for md in mds:
        assert md.is_closed  # the open ledger was recovered (fenced and closed) first
        assert await stored_everywhere(bk, md), f"ledger {md.ledger_id} still misses entries"
    reader = await cluster4.client()
    for lid, data in payloads.items():
        rh = await reader.open_ledger(lid, password=b"pw")
        assert [e.data for e in await rh.read(0, len(data) - 1)] == data
    async with asyncio.timeout(10):
        while await bk.meta.list_underreplicated():  # noqa: ASYNC110 - polling etcd
            await asyncio.sleep(0.2)
    async with aiohttp.ClientSession() as s:
        ar = cluster4.autorecovery[0]
        async with s.get(f"{ar.http_url}/api/v1/autorecovery/status") as r:
            status = await r.json()
        async with s.get(f"{ar.http_url}/metrics") as r:
            metrics = await r.text()
        async with s.get(f"{ar.http_url}/api/v1/autorecovery/underreplicated") as r:
            assert await r.json() == {"ledgers": []}
    assert status["is_auditor"] and status["lost_bookies"] == [victim.id]
    assert status["ledgers_marked"] == len(on_victim)
    assert status["recovered_open_ledgers"] == 1
    assert status["copied_entries"] > 0
    assert f'asyncbk_autorecovery_copied_entries_total{{id="{ar.id}"}}' in metrics


async def test_bookie_back_within_the_delay_causes_no_work(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 3, 2)
    await asyncio.gather(*(lh.append(b"x") for _ in range(50)))
    await lh.close()
    ar = await cluster.start_autorecovery(lost_bookie_delay=8, audit_interval=2, rate=0)
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(20):
            while True:
                async with s.get(f"{ar.http_url}/api/v1/autorecovery/status") as r:
                    if (await r.json())["is_auditor"]:
                        break
                await asyncio.sleep(0.2)
        b = cluster.bookies[1]
        b.kill()
        await b.wait()
        await asyncio.sleep(5)  # its lease (4 s) expired: the auditor saw it go
        async with s.get(f"{ar.http_url}/api/v1/autorecovery/status") as r:
            assert b.id in (await r.json())["bookies_within_delay"]
        await b.start()
        await asyncio.sleep(8)  # past the delay from when it went
        async with s.get(f"{ar.http_url}/api/v1/autorecovery/status") as r:
            status = await r.json()
    assert status["bookies_within_delay"] == {} and status["lost_bookies"] == []
    assert status["ledgers_marked"] == 0 and status["copied_entries"] == 0
    assert await bk.meta.list_underreplicated() == []
    assert b.id in (await bk.ledger_metadata(lh.id)).all_bookies()


async def test_killing_the_auditor_moves_the_role(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    first = await cluster.start_autorecovery(rate=0)
    second = await cluster.start_autorecovery(rate=0)
    async with asyncio.timeout(20):
        while (holder := await bk.meta.lock_holder(AUDITOR_LOCK)) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
    auditor, other = (first, second) if holder == first.id else (second, first)
    assert holder == auditor.id
    auditor.kill()  # its lease expires (10 s TTL); the other takes over
    async with asyncio.timeout(30):
        while await bk.meta.lock_holder(AUDITOR_LOCK) != other.id:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
    async with aiohttp.ClientSession() as s, s.get(
            f"{other.http_url}/api/v1/autorecovery/auditor") as r:
        assert await r.json() == {"auditor": other.id}


async def test_no_spare_bookie_is_reported_and_healed_once_one_joins(
        cluster: LocalCluster) -> None:
    """With every bookie in the ensemble there is no replacement: the worker says so
    (status and metrics), keeps the mark, loses nothing, and heals once a bookie joins."""
    bk = await cluster.client()
    lh = await bk.create_ledger(3, 2, 2)
    data = [b"d%d" % i for i in range(200)]
    await asyncio.gather(*(lh.append(d) for d in data))
    await lh.close()
    ar = await cluster.start_autorecovery(**FAST)
    victim = cluster.bookies[0]
    victim.kill()
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(60):
            while True:
                async with s.get(f"{ar.http_url}/api/v1/autorecovery/status") as r:
                    status = await r.json()
                if status["errors"]:
                    break
                await asyncio.sleep(0.5)
        assert "start more bookies" in status["last_error"]
        assert [m.ledger_id for m in await bk.meta.list_underreplicated()] == [lh.id]
        await cluster.add_bookie()
        async with asyncio.timeout(60):
            while await bk.meta.list_underreplicated():  # noqa: ASYNC110 - polling etcd
                await asyncio.sleep(0.5)
    md = await bk.ledger_metadata(lh.id)
    assert victim.id not in md.all_bookies()
    assert await stored_everywhere(bk, md)
    rh = await (await cluster.client()).open_ledger(lh.id)
    assert [e.data for e in await rh.read(0, 199)] == data


async def test_etcd_dates_marks_with_the_injected_clock(etcd_server, root) -> None:  # type: ignore[no-untyped-def]
    """The time a ledger was marked under-replicated (what the open-ledger grace and
    ``marked_s_ago`` count from) is the store's clock's, and a merge keeps it."""
    clock = ManualClock(start_s=5_000.0)
    store = await EtcdMetadataStore.connect([(etcd_server.host, etcd_server.port)], root,
                                            clock=clock)
    try:
        await store.mark_underreplicated(7, {"b3:3181"})
        clock.advance(10.0)
        await store.mark_underreplicated(7, {"b4:3181"})
        [mark] = await store.list_underreplicated()
        assert mark.bookies == {"b3:3181", "b4:3181"} and mark.marked_ms == 5_000_000
    finally:
        await store.close()
