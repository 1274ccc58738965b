"""Tiered storage on the simulator: the real offloader, stream writer and readers, the
real ledger client and bookies on virtual time, and an in-memory object store
(``MemoryObjectStore``: the same contract as S3, with injected failures).

Each seeded run pumps records into a stream that rolls often while bookies crash
and restart; offloader "processes" (a new client each) make passes that are cut off
at random moments (the task cancelled: a crash at any step of the protocol) while
the object store fails requests at random; segments are offloaded, and their
ledgers deleted after the lag.  Then faults end, a last writer seals the stream,
clean passes finish the work, and the run checks:

* a fresh client reads every acknowledged record exactly once, at its position, in
  txid order (invariant 7), from the object store where offloaded;
* no segment with records lost its ledger unless an object is recorded for it, at
  every moment the offloader was stopped;
* the objects in the store are exactly the ones segments name (the sweep removed
  the others).
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest
import xxhash

from asyncbk.errors import NoSuchLedgerError
from asyncbk.offload.offloader import Offloader, OffloaderOptions
from asyncbk.stream.namespace import Namespace
from asyncbk.stream.position import Position
from asyncbk.stream.reader import StreamRecord
from asyncbk.testing.sim import SimCluster
from asyncbk.tiered.location import ObjectStoreUri
from asyncbk.tiered.store import MemoryObjectStore

from .test_streams import (
    NS,
    STREAM,
    Book,
    Faults,
    check_stream,
    namespace_of,
    new_cluster,
    open_writer,
    pump,
    run_seeded,
    stream_client,
    wait_all,
)

SEEDS = [int(s) for s in os.environ.get("TIERED_SIM_SEEDS", "1,2,3").split(",")]


async def no_lost_ledger(c: SimCluster, ns: Namespace) -> None:
    """Every segment with records has its ledger, or a recorded object."""
    for seg in await ns.md.segments(NS, STREAM):
        if seg.records and seg.offload is None:
            await ns.bk.open_ledger(seg.ledger_id, recovery=False)  # NoSuchLedgerError: lost


async def read_all(c: SimCluster, store: MemoryObjectStore) -> tuple[list[StreamRecord], object]:
    bk = stream_client(c, "final-reader")
    bk.objects.add(store)
    ns = await bk.namespace(NS)
    info = await ns.stream_info(STREAM)
    total = info.segments[-1].start_sequence + info.segments[-1].records if info.segments else 0
    records: list[StreamRecord] = []
    async with await ns.open_reader(STREAM, Position.EARLIEST) as reader:
        while len(records) < total:
            records.extend(await asyncio.wait_for(reader.read_batch(500, wait_s=5), 60))
    return records, info


async def workload(seed: int, rounds: int = 10) -> dict[str, int]:
    rng = random.Random(seed)
    c, ns = await new_cluster(seed, rolling_entries=rng.choice([20, 60]),
                              offload_after_s=0.3,
                              offload_deletion_lag_s=rng.choice([0.0, 0.5, 2.0]))
    store = MemoryObjectStore(ObjectStoreUri("sim-objects"), wall_s=c.clock.wall_s)
    book = Book()
    faults = Faults(c, rng, ["crash"], lambda: "w0")
    w = await open_writer(await namespace_of(c, "w0"))
    pumping = asyncio.create_task(pump(w, book, rng, pause_s=(0.0, 0.02)))
    cut = 0
    for r in range(rounds):
        await asyncio.sleep(rng.uniform(0.3, 1.0))
        bk = stream_client(c, f"offloader{r}")
        off = Offloader(bk, store, OffloaderOptions(segments_per_pass=rng.choice([1, 2, 4]),
                                                    sweep_grace_s=3.0, retries=2),
                        clock=c.clock, rng=random.Random(rng.getrandbits(64)))
        store.fail_next = rng.choice([0, 0, 1, 2, 5])
        task = asyncio.create_task(off.run_pass([NS]))
        done, _ = await asyncio.wait([task], timeout=rng.uniform(0.01, 1.5))
        if not done:  # the offloader "crashes" wherever it is
            task.cancel()
            await asyncio.wait([task])
            cut += 1
        elif task.exception() is not None:
            raise AssertionError(f"an offload pass raised {task.exception()!r}")
        await no_lost_ledger(c, ns)
    await faults.stop()
    for b in c.bookies:
        if not b.up:
            await b.restart()
    final = await open_writer(await namespace_of(c, "final"))
    await wait_all([pumping], 60, "writers that were taken over")
    await final.close()
    await asyncio.sleep(3.0)  # past the lag and the sweep's grace
    store.fail_next = 0
    for r in range(8):  # clean passes until every segment is offloaded and off the bookies
        off = Offloader(stream_client(c, f"finisher{r}"), store,
                        OffloaderOptions(segments_per_pass=100, sweep_grace_s=3.0),
                        clock=c.clock, rng=random.Random(rng.getrandbits(64)))
        report = await off.run_pass([NS])
        assert not report.failures, report
        await asyncio.sleep(2.5)
        if all(s.storage == "object" for s in await ns.md.segments(NS, STREAM) if s.records):
            break
    await off.run_pass([NS])  # the sweep, past the grace of the last pass's objects
    records, info = await read_all(c, store)
    check_stream(records, info, book)  # type: ignore[arg-type]
    segs = await ns.md.segments(NS, STREAM)
    named = {s.offload.key for s in segs if s.offload is not None}
    assert set(store.objects) == named, (sorted(store.objects), sorted(named))
    full = [s for s in segs if s.records]
    assert full and all(s.storage == "object" for s in full), [
        (s.seq, s.storage, s.completion_ms, s.offload) for s in full if s.storage != "object"]
    for s in full:
        with pytest.raises(NoSuchLedgerError):
            await ns.bk.open_ledger(s.ledger_id, recovery=False)
    await c.stop()
    return {"segments": len(full), "acked": len(book.acked), "cut": cut,
            "faults": sum(faults.count.values()),
            "objects": xxhash.xxh3_64_intdigest("\n".join(sorted(store.objects)).encode())}


@pytest.mark.parametrize("seed", SEEDS)
def test_offloads_cut_off_at_random_under_bookie_crashes_lose_nothing(seed: int,
                                                                      finding: Any) -> None:
    out: dict[str, int] = {}

    async def body() -> None:
        out.update(await workload(seed))

    run_seeded(seed, body)
    finding(f"seed {seed}: {out['segments']} segments offloaded and read back, "
            f"{out['acked']} records, {out['cut']} passes cut off, {out['faults']} bookie crashes")
    assert out["segments"] >= 3 and out["acked"] >= 200, out


def test_a_seed_replays_the_same_run() -> None:
    """Same seed, same run: the same records, cuts, faults and object keys."""
    outs: list[dict[str, int]] = []
    for _ in range(2):
        async def body() -> None:
            outs.append(await workload(7, rounds=6))

        run_seeded(7, body)
    assert outs[0] == outs[1]
