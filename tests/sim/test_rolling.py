"""A writer under rolling bookie faults, on the simulator (virtual time).

A writer once died after a few faults with ``NotEnoughBookiesError: need 1
writable bookies, 0 available`` although most bookies were up: every bookie
that had ever failed one of its adds stayed excluded for the life of the
handle.  Now a failed bookie is quarantined for a bounded time, released at
once when it registers anew (a restart) or answers a health probe (a pause
that ended), and a writer with no replacement waits (bounded by
``ensemble_change_timeout_s``) instead of failing at the first try.
"""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from asyncbk.client.ledger import LedgerHandle
from asyncbk.errors import NotEnoughBookiesError
from asyncbk.testing.sim import SimCluster, run_sim

from .client_config import PW, config


def payload(ledger_id: int, entry_id: int) -> bytes:
    return b"%d/%d" % (ledger_id, entry_id)


async def keep_writing(lh: LedgerHandle, acked: list[int], stop: asyncio.Event) -> None:
    """Pipelined appends in rounds of 20 until ``stop``; records acknowledged ids."""
    next_id = 0
    while not stop.is_set():
        futures = [lh.append(payload(lh.id, next_id + k)) for k in range(20)]
        next_id += 20
        acked.extend(await asyncio.gather(*futures))
        await asyncio.sleep(0.1)


ROLLING_SEEDS = [int(s) for s in os.environ.get("SIM_ROLLING_SEEDS", "1").split(",")]


@pytest.mark.parametrize("seed", ROLLING_SEEDS)
def test_writer_survives_rolling_restarts_and_pauses(seed: int) -> None:
    """5 bookies, 3 ledgers E3 Qw2 Qa2; one bookie at a time is crashed and restarted,
    or cut off from the writer and healed, every 1-3 s for 30 faults
    (``SIM_ROLLING_SEEDS=1,2,3`` runs more seeds).  The writer
    never fails; after it is abandoned (killed), recovery finds every acknowledged
    entry with its bytes."""
    async def body() -> None:
        rng = random.Random(seed)
        c = SimCluster(seed, 5)
        await c.start()
        bk = c.client("writer", config())
        handles = [await bk.create_ledger(3, 2, 2, password=PW) for _ in range(3)]
        acked: dict[int, list[int]] = {lh.id: [] for lh in handles}
        stop = asyncio.Event()
        writers = [asyncio.create_task(keep_writing(lh, acked[lh.id], stop)) for lh in handles]
        kinds = {"crash": 0, "pause": 0}
        for _ in range(30):
            victim = rng.choice(c.bookies)
            if rng.random() < 0.5:
                kinds["crash"] += 1
                await victim.crash(torn=rng.random() < 0.5)
                await asyncio.sleep(rng.uniform(1, 3))
                await victim.restart()
            else:
                kinds["pause"] += 1
                c.net.partition("writer", victim.id)
                await asyncio.sleep(rng.uniform(1, 3))
                c.net.heal("writer", victim.id)
            await asyncio.sleep(rng.uniform(0.2, 1.0))
            for w in writers:
                if w.done():
                    w.result()  # raises the writer's error: the test fails here
        stop.set()
        await asyncio.gather(*writers)
        changes = sum(lh.ensemble_changes for lh in handles)
        assert changes >= 10, f"the faults must have forced ensemble changes ({changes})"
        assert all(kinds.values()), kinds
        for lh in handles:  # the writer dies without closing anything
            await lh.close_quietly()
        reader = c.client("reader", config())
        for lh in handles:
            ids = acked[lh.id]
            assert ids == list(range(len(ids))) and len(ids) > 300
            rh = await reader.open_ledger(lh.id, password=PW)
            last = rh.metadata.last_entry_id
            assert last >= ids[-1], f"ledger {lh.id}: acknowledged {ids[-1]}, recovered {last}"
            got = await rh.read(0, ids[-1])
            assert [e.data for e in got] == [payload(lh.id, i) for i in ids]
        await c.stop()

    run_sim(body)


def test_appends_wait_for_a_bookie_then_complete() -> None:
    """E = Qw = Qa = 3 on 3 bookies: with one down there is no replacement and no ack
    quorum, so appends wait (no error) and complete once it is back."""
    async def body() -> None:
        c = SimCluster(5, 3)
        await c.start()
        bk = c.client("writer", config(ensemble_change_timeout_s=30.0))
        lh = await bk.create_ledger(3, 3, 3, password=PW)
        assert await asyncio.gather(*(lh.append(b"a%d" % i) for i in range(5))) == list(range(5))
        victim = c.bookies[1]
        await victim.crash(torn=False)
        futures = [lh.append(b"b%d" % i) for i in range(5)]
        await asyncio.sleep(10)
        assert not any(f.done() for f in futures), "appends wait while no bookie can help"
        await victim.restart()
        assert await asyncio.gather(*futures) == list(range(5, 10))
        await lh.close()
        rh = await c.client("r", config()).open_ledger(lh.id, password=PW)
        assert [e.data for e in await rh.read(0, 9)] == \
            [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)]
        await c.stop()

    run_sim(body)


def test_no_replacement_fails_after_the_named_timeout_naming_the_bookies() -> None:
    async def body() -> None:
        c = SimCluster(6, 3)
        await c.start()
        bk = c.client("writer", config(ensemble_change_timeout_s=20.0))
        lh = await bk.create_ledger(3, 3, 3, password=PW)
        await lh.append(b"x")
        victim = c.bookies[2]
        await victim.crash(torn=False)
        started = asyncio.get_running_loop().time()
        fut = lh.append(b"y")
        with pytest.raises(NotEnoughBookiesError) as info:
            await fut
        waited = asyncio.get_running_loop().time() - started
        assert 20.0 <= waited < 25.0, waited
        assert victim.id in str(info.value) and "ensemble_change_timeout_s" in str(info.value)
        await c.stop()

    run_sim(body)


def test_quarantine_lifted_when_the_bookie_registers_anew() -> None:
    """A restarted bookie is eligible at once, not after the quarantine runs out."""
    async def body() -> None:
        c = SimCluster(8, 4)
        await c.start()
        bk = c.client("writer", config(bookie_quarantine_s=3600.0))
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await lh.append(b"x")
        victim = c.bookie(lh.metadata.ensembles[0][1][0])
        await victim.crash(torn=False)
        await lh.append(b"y")  # replaced by the spare
        assert victim.id in bk.quarantine.active()
        await victim.restart()
        for _ in range(50):
            if victim.id not in bk.quarantine.active():
                break
            await asyncio.sleep(0.1)
        assert victim.id not in bk.quarantine.active()
        await c.stop()

    run_sim(body)


def test_reader_with_stale_fragments_finds_entries_on_the_replacement() -> None:
    """A reader of an open ledger opened before the writer replaced a bookie reads
    the later entries from the replacement (it re-reads the metadata), not a
    BookieUnavailableError from the replaced bookie."""
    async def body() -> None:
        c = SimCluster(9, 2)
        await c.start()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(1, 1, 1, password=PW)
        assert await asyncio.gather(*(lh.append(b"a%d" % i) for i in range(5))) == list(range(5))
        rh = await c.client("reader", config()).open_ledger(lh.id, password=PW, recovery=False)
        victim = c.bookie(lh.metadata.ensembles[0][1][0])
        await victim.crash(torn=False)
        assert await asyncio.gather(*(lh.append(b"b%d" % i) for i in range(5))) == \
            list(range(5, 10))
        assert len(lh.metadata.ensembles) == 2 and len(rh.metadata.ensembles) == 1
        got = await rh.read_unconfirmed(5, 9)
        assert [e.data for e in got] == [b"b%d" % i for i in range(5)]
        assert len(rh.metadata.ensembles) == 2
        await c.stop()

    run_sim(body)
