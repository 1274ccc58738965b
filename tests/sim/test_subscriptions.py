"""Subscriptions on the simulator: consumers that ack, crash, freeze and are taken
over, while a writer pumps records and bookies crash.

The real stream client (writer, reader, subscription) and the real ledger client
and bookies run on virtual time.  Each randomized run hands the subscription from
consumer to consumer (each a new client): a consumer reads some records, acks
every one or every few, sometimes flushes, then closes, crashes (``abort``: no
last persistence) or freezes with a persistence held at the metadata store
while the next consumer takes over (released after).  After every step and at
the end it checks invariant 9 of ARCHITECTURE.md:

* the stored position never moves backwards (there are no seeks here), and never
  past a record some consumer was delivered;
* each consumer starts exactly at the record the store named when it subscribed
  (so a record is delivered again only if it came after the last persisted ack);
* a frozen consumer's persistence, released after the takeover, changes nothing;
* every record before the final stored position was delivered at least once.

``SUB_SIM_SEEDS=1,2,3`` (the default) chooses the seeds; a failure names its seed
(``SUB_SIM_VERBOSE=1`` prints what each run did).
"""

from __future__ import annotations

import asyncio
import bisect
import os
import random
import sys

import pytest

from asyncbk.errors import SubscriptionFencedError
from asyncbk.stream.position import Position
from asyncbk.stream.subscription import Subscription, read_cursor

from .test_streams import (
    STREAM,
    Book,
    Faults,
    namespace_of,
    new_cluster,
    open_writer,
    pump,
    read_back,
    run_seeded,
    store_of,
)

SEEDS = [int(s) for s in os.environ.get("SUB_SIM_SEEDS", "1,2,3").split(",")]
NAME = "billing"


def after(p: Position) -> Position:
    return Position(p.segment, p.entry, p.slot + 1)


async def workload(seed: int, rounds: int = 8) -> tuple[object, ...]:
    rng = random.Random(seed)
    c, ns = await new_cluster(seed, rolling_entries=rng.choice([20, 60, 200]),
                              subscription_ack_interval_s=rng.choice([0.05, 0.3, 1.0]))
    await (await ns.subscribe(STREAM, NAME)).close()  # created at the start
    book = Book()
    writer = await open_writer(await namespace_of(c, "w"))
    pumping = asyncio.create_task(pump(writer, book, rng, pause_s=(0.0, 0.02)))
    faults = Faults(c, rng, ["crash"], lambda: "w")
    admin = await namespace_of(c, "admin")
    ctx = admin.context

    stored: list[Position] = []
    delivered_max: list[Position] = []
    runs: list[tuple[Position, list[Position]]] = []  # (stored at subscribe, delivered)
    frozen: list[tuple[Subscription, asyncio.Event]] = []

    async def check_store() -> Position:
        rec = await read_cursor(ctx, STREAM, NAME)
        assert rec is not None
        if stored:
            assert rec.position >= stored[-1], f"the cursor went back: {stored[-1]} -> " \
                f"{rec.position}"
        if delivered_max:
            assert rec.position <= after(max(delivered_max)), \
                f"the cursor {rec.position} passed every delivery ({max(delivered_max)})"
        stored.append(rec.position)
        return rec.position

    for k in range(rounds):
        start = await check_store()
        sns = await namespace_of(c, f"c{k}")
        sub = await sns.subscribe(STREAM, NAME)
        assert sub.persisted_position == start
        # A frozen predecessor's persistence goes through now: it must change nothing.
        for old, gate in frozen:
            gate.set()
            with pytest.raises(SubscriptionFencedError):
                await asyncio.wait_for(old.flush(), 30)
            await old.close()
        frozen.clear()
        assert await check_store() == start
        got: list[Position] = []
        every = rng.choice([1, 1, 3, 10])
        for i in range(rng.randint(20, 250)):
            try:
                rec = await asyncio.wait_for(sub.read_next(), 30)
            except TimeoutError:
                break  # caught up with a writer held up by the faults
            got.append(rec.position)
            delivered_max.append(rec.position)
            if i % every == every - 1:
                await sub.ack(rec.position)
            if rng.random() < 0.02:
                await sub.flush()
                await check_store()
        runs.append((start, got))
        how = rng.choice(["close", "abort", "freeze"])
        if how == "close":
            await sub.close()
        elif how == "abort":
            await sub.abort()
        else:  # the next persistence is held at this client's store until the takeover
            store = store_of(sns)
            gate = asyncio.Event()
            store.txn_waiting.clear()
            store.txn_gate = gate
            if got:
                await sub.ack(got[-1])
            flushing = asyncio.create_task(sub.flush())
            try:
                await asyncio.wait_for(store.txn_waiting.wait(), 10)
            except TimeoutError:
                pass  # nothing to persist: it holds nothing
            frozen.append((sub, gate))
            flushing.add_done_callback(lambda t: t.cancelled() or t.exception())
        await check_store()
        await asyncio.sleep(rng.uniform(0.0, 0.5))

    for old, gate in frozen:
        gate.set()
        await old.close()
    await faults.stop()
    for b in c.bookies:
        if not b.up:
            await b.restart()
    final = await open_writer(await namespace_of(c, "final"))
    await asyncio.wait_for(pumping, 60)
    await final.close()
    last = await check_store()
    records, _ = await read_back(c)
    positions = [r.position for r in records]
    stamps = [r.timestamp_ms for r in records]
    assert stamps == sorted(stamps), "record times went down"  # invariant 10
    seen: set[Position] = set()
    for start, got in runs:
        if got:
            first = bisect.bisect_left(positions, start)
            assert got == positions[first:first + len(got)], \
                f"a consumer resumed at {got[0]}, not at the first record from {start} on"
        seen.update(got)
    missing = [p for p in positions if p < last and p not in seen]
    assert not missing, f"records before the cursor ({last}) never delivered: {missing[:5]}"
    delivered = sum(len(got) for _, got in runs)
    assert delivered >= 100 and last > positions[0], (delivered, last)
    if os.environ.get("SUB_SIM_VERBOSE"):
        sys.stderr.write(f"seed {seed}: {len(records)} records, {delivered} deliveries, "
                         f"cursor {last}, faults {faults.count}, stored values "
                         f"{len(set(stored))}\n")
    await c.stop()
    return (len(records), delivered, last, tuple(stored), tuple(r.timestamp_ms for r in records))


@pytest.mark.parametrize("seed", SEEDS)
def test_subscription_handovers_with_crashes_and_frozen_consumers(seed: int) -> None:
    run_seeded(seed, lambda: workload(seed))


def test_a_seed_replays_the_same_run() -> None:
    """Record times included: the stream client takes the simulator's clock."""
    runs: list[tuple[object, ...]] = []

    async def twice() -> None:
        runs.append(await workload(5, rounds=3))

    run_seeded(5, twice)
    run_seeded(5, twice)
    assert runs[0] == runs[1]
