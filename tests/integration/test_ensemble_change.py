"""Bookie failures during pipelined appends: ensemble change keeps the ledger going."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from asyncbk.client.ledger import LedgerHandle
from asyncbk.testing.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


@pytest_asyncio.fixture
async def cluster5(tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(bookies=5, data_dir=tmp_path / "cluster") as c:
        yield c


async def _writer(lh: LedgerHandle, stop: asyncio.Event, window: int) -> list[int]:
    """Append with ``window`` in flight until ``stop`` is set; the acknowledged ids."""
    sem = asyncio.Semaphore(window)
    futures = []
    i = 0
    while not stop.is_set():
        await sem.acquire()
        fut = lh.append(b"entry-%d" % i)
        fut.add_done_callback(lambda _f: sem.release())
        futures.append(fut)
        i += 1
        if i % 20 == 0:
            await asyncio.sleep(0.001)  # a steady stream, not a burst
    return list(await asyncio.gather(*futures))


async def test_sigkill_and_sigstop_during_pipelined_appends(cluster5: LocalCluster) -> None:
    bk = await cluster5.client(add_timeout_s=1.0, speculative_read_timeout_s=0.2)
    lh = await bk.create_ledger(3, 3, 2)
    first = lh.metadata.ensembles[0][1]
    victims = [b for b in cluster5.bookies if b.id in first]
    killed, hung = victims[0], victims[1]
    stop = asyncio.Event()
    writer = asyncio.create_task(_writer(lh, stop, 128))
    await asyncio.sleep(0.5)
    killed.kill()
    await asyncio.sleep(0.5)
    hung.pause()
    try:
        await asyncio.sleep(3)  # keeps writing through both failures
        stop.set()
        async with asyncio.timeout(60):
            ids = await writer
        n = len(ids)
        assert ids == list(range(n)) and n > 1000
        md = await bk.ledger_metadata(lh.id)
        assert len(md.ensembles) >= 2, "the failed bookies were replaced"
        last_ensemble = md.ensembles[-1][1]
        assert killed.id not in last_ensemble and hung.id not in last_ensemble
        assert [f for f, _ in md.ensembles] == sorted(f for f, _ in md.ensembles)
        await lh.close()
        # Readable with the dead bookie still down and the hung one still hung:
        # older fragments are read from their surviving replicas (speculatively
        # past the hung one).
        reader = await cluster5.client(read_timeout_s=2.0, speculative_read_timeout_s=0.2)
        rh = await reader.open_ledger(lh.id)
        assert rh.last_add_confirmed == n - 1
        async with asyncio.timeout(120):
            entries = await rh.read(0, n - 1)
        assert [e.data for e in entries] == [b"entry-%d" % i for i in range(n)]
    finally:
        hung.resume()


async def test_ensemble_change_with_no_spare_bookie_fails_cleanly(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, data_dir=tmp_path / "c") as cluster:
        bk = await cluster.client(add_timeout_s=1.0, ensemble_change_timeout_s=3.0)
        lh = await bk.create_ledger(3, 3, 3)
        acked = [await lh.append(b"a%d" % i) for i in range(10)]
        cluster.bookies[0].kill()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(Exception) as info:
            async with asyncio.timeout(20):
                await lh.append(b"lost")
        # The append waited for a replacement (ensemble_change_timeout_s), then failed
        # naming the bookie that was lost.
        assert loop.time() - started >= 3.0
        assert type(info.value).__name__ == "NotEnoughBookiesError"
        assert cluster.bookies[0].id in str(info.value)
        assert "ensemble_change_timeout_s" in str(info.value)
        md = await bk.ledger_metadata(lh.id)
        assert len(md.ensembles) == 1, "the ensemble is unchanged"
        await cluster.bookies[0].start()
        rh = await (await cluster.client()).open_ledger(lh.id)
        assert rh.last_add_confirmed >= acked[-1]
        assert [e.data for e in await rh.read(0, 9)] == [b"a%d" % i for i in range(10)]


async def test_read_only_bookie_is_replaced(tmp_path: Path) -> None:
    """A bookie restarted read-only (maintenance) registers as such, is not picked for
    new ensembles, refuses adds with READ_ONLY (the writer replaces it with the spare
    bookie) and still serves reads."""
    async with LocalCluster(bookies=4, data_dir=tmp_path / "c") as cluster:
        bk = await cluster.client()
        lh = await bk.create_ledger(3, 3, 2)
        for i in range(20):
            await lh.append(b"r%d" % i)
        ro = next(b for b in cluster.bookies if b.id in lh.metadata.ensembles[0][1])
        await ro.stop()
        cluster.bookie_config["read_only"] = True
        try:
            await ro.start()
        finally:
            cluster.bookie_config["read_only"] = False
        async with asyncio.timeout(10):
            while not (view := await bk.meta.list_bookies()).get(ro.id, None) or \
                    not view[ro.id].readonly:  # noqa: ASYNC110 - polling etcd
                await asyncio.sleep(0.1)
        async with asyncio.timeout(30):
            more = [await lh.append(b"r%d" % i) for i in range(20, 40)]
        assert more == list(range(20, 40))
        md = await bk.ledger_metadata(lh.id)
        assert len(md.ensembles) >= 2 and ro.id not in md.ensembles[-1][1]
        with pytest.raises(Exception, match="need 4 writable bookies, 3"):
            await bk.create_ledger(4, 3, 2)  # a read-only bookie is not offered
        await lh.close()
        rh = await (await cluster.client()).open_ledger(lh.id)
        assert [e.data for e in await rh.read(0, 39)] == [b"r%d" % i for i in range(40)]
