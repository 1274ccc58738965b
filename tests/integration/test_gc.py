"""Garbage collection and compaction on live bookie processes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from asyncbk.autorecovery.replication import RateLimiter, ReplicationStats, replicate_ledger
from asyncbk.proto import ReadRequest, ReadResponse, Status
from asyncbk.testing.cluster import LocalBookie, LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

GC_CONFIG = {"entry_log_bytes_max": 256 * 1024, "gc_interval_s": 3600,
             "compaction_rate_bytes_per_s": 0}


def entrylog_bytes(b: LocalBookie) -> int:
    return sum(p.stat().st_size for p in (b.ledger_dir / "entrylog").iterdir())


async def gc(s: aiohttp.ClientSession, b: LocalBookie) -> dict:
    async with s.put(f"{b.http_url}/api/v1/bookie/gc") as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def status_of(bk, bookie: str, ledger_id: int) -> int:  # type: ignore[no-untyped-def]
    ch = bk.bookie_client.channel(bookie)
    resp = await ch.request(ReadRequest(ch.next_request_id(), ledger_id, 0, 0, b""), 5.0)
    assert isinstance(resp, ReadResponse)
    return int(resp.status)


async def test_deleted_ledgers_are_reclaimed_while_a_writer_writes(tmp_path: Path) -> None:
    async with LocalCluster(bookies=3, data_dir=tmp_path / "c", bookie_config=GC_CONFIG) as c:
        bk = await c.client()
        doomed = [await bk.create_ledger(3, 3, 2) for _ in range(5)]
        keep = await bk.create_ledger(3, 3, 2)
        payload = b"z" * 2000
        for _ in range(10):  # interleaved, so every entry log holds every ledger
            await asyncio.gather(*(lh.append(payload) for lh in [*doomed, keep]
                                   for _ in range(50)))
        for lh in doomed:
            await lh.close()
        before = [await asyncio.to_thread(entrylog_bytes, b) for b in c.bookies]
        for lh in doomed:
            await bk.delete_ledger(lh.id)

        stop = asyncio.Event()
        written: list[int] = []

        async def writer() -> None:
            while not stop.is_set():
                written.append(await keep.append(b"during gc"))
                await asyncio.sleep(0.005)

        task = asyncio.create_task(writer())
        try:
            async with aiohttp.ClientSession() as s:
                results = [await gc(s, b) for b in c.bookies]
        finally:
            stop.set()
            await task
        await keep.close()
        after = [await asyncio.to_thread(entrylog_bytes, b) for b in c.bookies]
        for r, b0, a in zip(results, before, after, strict=True):
            assert r["deleted"] == 5 and r["bytes_freed"] > 0
            assert a < b0 * 0.5, (b0, a)  # five of six ledgers' data gone
        assert written  # the writer kept going
        for b in c.bookies:
            for lh in doomed:
                assert await status_of(bk, b.id, lh.id) == Status.NO_LEDGER
        rh = await bk.open_ledger(keep.id)
        got = await rh.read(0, rh.last_add_confirmed)
        assert [e.data for e in got[:500]] == [payload] * 500
        assert [e.data for e in got[500:]] == [b"during gc"] * len(written)
        async with aiohttp.ClientSession() as s, s.get(f"{c.bookies[0].http_url}/metrics") as r:
            text = await r.text()
        assert "asyncbk_bookie_ledgers_deleted_total" in text
        assert "asyncbk_bookie_compactions_total" in text


async def test_a_bookie_replaced_in_a_ledger_drops_its_copy(tmp_path: Path) -> None:
    async with LocalCluster(bookies=4, data_dir=tmp_path / "c", bookie_config=GC_CONFIG) as c:
        bk = await c.client()
        lh = await bk.create_ledger(3, 3, 2)
        await asyncio.gather(*(lh.append(b"e%d" % i) for i in range(100)))
        await lh.close()
        md = await bk.ledger_metadata(lh.id)
        leaving = md.ensembles[0][1][0]
        others = {b.id for b in c.bookies} - {leaving}
        await replicate_ledger(bk, lh.id, others, sorted(others), RateLimiter(0),
                               ReplicationStats())
        assert leaving not in (await bk.ledger_metadata(lh.id)).all_bookies()
        assert await status_of(bk, leaving, lh.id) == Status.OK  # still holds its copy
        b = next(x for x in c.bookies if x.id == leaving)
        async with aiohttp.ClientSession() as s:
            result = await gc(s, b)
            async with s.get(f"{b.http_url}/api/v1/bookie/gc") as r:
                totals = await r.json()
        assert result["dropped"] == 1
        assert totals["runs"] == 1 and totals["ledgers_not_in_ensemble"] == 1
        assert await status_of(bk, leaving, lh.id) == Status.NO_LEDGER
        rh = await bk.open_ledger(lh.id)
        assert [e.data for e in await rh.read(0, 99)] == [b"e%d" % i for i in range(100)]


async def test_a_zombie_writer_cannot_write_to_a_deleted_collected_ledger(tmp_path: Path) -> None:
    """BookKeeper's TestFencing.testWriteAfterDeleted: after the ledger is deleted
    and bookies collected it, the old writer's adds fail instead of re-creating it."""
    from asyncbk.errors import LedgerFencedError

    async with LocalCluster(bookies=3, data_dir=tmp_path / "c", bookie_config=GC_CONFIG) as c:
        bk = await c.client()
        lh = await bk.create_ledger(3, 3, 2)
        assert await lh.append(b"before") == 0
        other = await c.client()
        await other.delete_ledger(lh.id)
        async with aiohttp.ClientSession() as s:
            for b in c.bookies:
                assert (await gc(s, b))["deleted"] == 1
        with pytest.raises(LedgerFencedError):
            await lh.append(b"after")
        for b in c.bookies:
            assert await status_of(bk, b.id, lh.id) == Status.NO_LEDGER  # nothing re-created
