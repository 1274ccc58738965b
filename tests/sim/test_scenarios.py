"""BookKeeper's hard interleavings, scripted step by step on the simulator's parts.

Each test runs the real client and bookie logic on virtual time
(``run_sim``), freezing one side at a chosen point (a metadata gate, a network
partition that holds traffic, a crashed bookie) and checking the outcome.
The numbers refer to the scenario table in docs/scenarios.md.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asyncbk.client.client import BookKeeper
from asyncbk.client.digest import DigestManager, master_key
from asyncbk.client.ledger import LedgerHandle
from asyncbk.errors import (
    BookieUnavailableError,
    LedgerClosedError,
    LedgerFencedError,
    NotEnoughBookiesError,
    UnauthorizedAccessError,
)
from asyncbk.meta.model import LedgerState
from asyncbk.proto import AddBatchRequest, AddRequest, ReadFlag, ReadRequest, Status
from asyncbk.testing.sim import BlockableStore, SimCluster, run_sim

from .client_config import PW, config


async def started(bookies: int, seed: int = 1) -> SimCluster:
    c = SimCluster(seed, bookies)
    await c.start()
    return c


async def write(lh: LedgerHandle, n: int, start: int = 0) -> list[int]:
    return list(await asyncio.gather(*(lh.append(b"e%d" % i) for i in range(start, start + n))))


async def read_all(bk: BookKeeper, ledger_id: int) -> tuple[int, list[bytes]]:
    rh = await bk.open_ledger(ledger_id, password=PW)
    last = rh.metadata.last_entry_id
    return last, [e.data for e in await rh.read(0, last)] if last >= 0 else []


def test_s19_no_add_completes_while_the_ensemble_change_is_committed() -> None:
    async def body() -> None:
        # A race by design (the refusal must reach the writer before the healthy
        # bookies' fsyncs end); seed 1 lost it once the real storage ran here.
        c = await started(4, seed=2)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        assert await write(lh, 10) == list(range(10))
        store: BlockableStore = bk.meta
        store.gate = asyncio.Event()
        refuser = c.bookie(lh.metadata.ensembles[0][1][0])
        refuser.refuse_adds()  # answers NOT_READY
        futures = [lh.append(b"e%d" % i) for i in range(10, 30)]  # all sent to all three
        completed_while_gated: list[int] = []
        for f in futures:
            f.add_done_callback(lambda f: completed_while_gated.append(f.result())
                                if store.waiting.is_set() and not store.gate.is_set() else None)
        await asyncio.wait_for(store.waiting.wait(), 10)  # the change is at its CAS
        pending_at_gate = sum(not f.done() for f in futures)
        await asyncio.sleep(2)  # the two healthy bookies have long acknowledged
        assert pending_at_gate > 0, "the test must catch adds in flight"
        assert not completed_while_gated, "completed during the ensemble change"
        store.gate.set()
        assert await asyncio.gather(*futures) == list(range(10, 30))
        assert len(lh.metadata.ensembles) == 2
        await lh.close()
        assert await read_all(c.client("r", config()), lh.id) == (29, [b"e%d" % i for i in range(30)])
        await c.stop()

    run_sim(body)


def test_failed_recovery_attempt_leaves_fragments_untouched() -> None:
    """Simulator bug #2 (seed 1701), scripted: a recovery attempt whose re-writes need
    an ensemble change, and which then fails, must not leave a fragment behind; the
    next attempt recovers every acknowledged entry."""
    async def body() -> None:
        c = await started(6)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(4, 4, 4, password=PW)
        for i in range(12):
            await lh.append(b"e%d" % i)  # one at a time: bookies know LAC 10, 11 is re-written
        await lh.close_quietly()
        ensemble = lh.metadata.ensembles[0][1]
        spares = [b for b in c.bookies if b.id not in ensemble]
        refuser = c.bookie(ensemble[0])
        refuser.refuse_adds()  # refuses re-writes
        for spare in spares:  # the replacements accept the fence but then die
            spare.refuse_adds()
        rec = c.client("rec", config())
        with pytest.raises(NotEnoughBookiesError):
            await rec.open_ledger(lh.id, password=PW)
        md = await rec.ledger_metadata(lh.id)
        assert md.state is LedgerState.IN_RECOVERY
        assert md.ensembles == lh.metadata.ensembles, "no half-done fragment was persisted"
        for b in c.bookies:
            b.take_adds()
        assert await read_all(rec, lh.id) == (11, [b"e%d" % i for i in range(12)])
        await c.stop()

    run_sim(body)


def test_s20_recovery_during_the_writers_ensemble_change_wins() -> None:
    async def body() -> None:
        c = await started(4)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 10)
        store: BlockableStore = bk.meta
        store.gate = asyncio.Event()
        await c.bookie(lh.metadata.ensembles[0][1][0]).crash(torn=False)
        futures = [lh.append(b"e%d" % i) for i in range(10, 20)]
        await asyncio.wait_for(store.waiting.wait(), 10)
        recovered = await c.client("rec", config()).open_ledger(lh.id, password=PW)
        last = recovered.metadata.last_entry_id
        assert recovered.metadata.state is LedgerState.CLOSED and last >= 9
        store.gate.set()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, (LedgerFencedError, LedgerClosedError)) for r in results)
        md = await bk.ledger_metadata(lh.id)
        assert md.last_entry_id == last, "the writer's late CAS did not overwrite recovery"
        got_last, data = await read_all(c.client("r", config()), lh.id)
        assert got_last == last and data == [b"e%d" % i for i in range(last + 1)]
        await c.stop()

    run_sim(body)


def test_s20_writer_change_meeting_a_ledger_in_recovery_fails() -> None:
    """The writer's ensemble change commits only on an OPEN ledger: meeting one that a
    recoverer has put IN_RECOVERY (not yet closed) fails its adds, instead of moving
    them to bookies the recovery never fenced."""
    async def body() -> None:
        c = await started(5)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 10)
        wstore: BlockableStore = bk.meta
        wstore.gate = asyncio.Event()
        await c.bookie(lh.metadata.ensembles[0][1][0]).crash(torn=False)
        futures = [lh.append(b"e%d" % i) for i in range(10, 20)]
        await asyncio.wait_for(wstore.waiting.wait(), 10)  # writer held at its CAS
        rec = c.client("rec", config())
        rstore: BlockableStore = rec.meta
        rstore.gate = asyncio.Event()
        rstore.gate_if = lambda md: md.state is LedgerState.CLOSED  # hold only the close
        recovery = asyncio.create_task(rec.open_ledger(lh.id, password=PW))
        await asyncio.wait_for(rstore.waiting.wait(), 10)  # IN_RECOVERY, about to close
        wstore.gate.set()
        results = await asyncio.gather(*futures, return_exceptions=True)
        assert all(isinstance(r, LedgerFencedError) for r in results), results
        md = await rec.ledger_metadata(lh.id)
        assert md.state is LedgerState.IN_RECOVERY and len(md.ensembles) == 1
        rstore.gate.set()
        last = (await recovery).metadata.last_entry_id
        assert await read_all(c.client("r", config()), lh.id) == (
            last, [b"e%d" % i for i in range(last + 1)])
        await c.stop()

    run_sim(body)


def test_s12_undecidable_entry_fails_recovery_instead_of_closing_short() -> None:
    """The bookies holding an acknowledged entry are silent and too few others say it
    is missing: recovery must fail (ledger stays IN_RECOVERY), not close before it."""
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 10)
        # Entry 10 reaches only two bookies: the third refuses it, and with no spare
        # the writer goes on without it (each write set keeps Qa=2).
        third = c.bookie(lh.metadata.ensembles[0][1][2])
        third.refuse_adds()
        assert await lh.append(b"e10") == 10
        await lh.close_quietly()
        silent = [c.bookie(b) for b in lh.metadata.ensembles[0][1][:2]]
        for b in silent:
            assert b.processor is not None
            original = b.processor.handle

            def drop(req: Any, conn: Any, original: Any = original) -> None:
                if isinstance(req, ReadRequest) and req.entry_id >= 10:
                    return  # never answered
                original(req, conn)

            b.processor.handle = drop  # type: ignore[method-assign]
        third.take_adds()
        rec = c.client("rec", config())
        with pytest.raises(BookieUnavailableError, match="cannot tell"):
            await rec.open_ledger(lh.id, password=PW)
        assert (await rec.ledger_metadata(lh.id)).state is LedgerState.IN_RECOVERY
        for b in silent:
            assert b.processor is not None
            del b.processor.handle  # back to the class method
        assert await read_all(rec, lh.id) == (10, [b"e%d" % i for i in range(11)])
        await c.stop()

    run_sim(body)


def test_s15_recovery_stops_at_a_gap() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await write(lh, 9)  # 0..8 acknowledged
        # A stray entry 14 on one bookie (a writer bug or a lost batch): never read past 8..
        dm = DigestManager(lh.id, "xxh3", PW)
        stray = c.bookie(lh.metadata.ensembles[0][1][14 % 3])
        ch = bk.bookie_client.channel(stray.id)
        resp = await ch.request(AddRequest(ch.next_request_id(), lh.id, 14, master_key(PW), 0, 8,
                                           dm.seal(14, 8, 999, b"stray")), 5)
        assert resp.status == Status.OK
        await lh.close_quietly()
        last, data = await read_all(c.client("rec", config()), lh.id)
        assert last == 8 and data == [b"e%d" % i for i in range(9)]
        await c.stop()

    run_sim(body)


def test_s13_empty_ledger_recovery() -> None:
    async def body() -> None:
        c = await started(3)
        lh = await c.client("writer", config()).create_ledger(3, 2, 2, password=PW)
        rh = await c.client("rec", config()).open_ledger(lh.id, password=PW)
        md = rh.metadata
        assert (md.state, md.last_entry_id, md.length) == (LedgerState.CLOSED, -1, 0)
        await c.stop()

    run_sim(body)


def test_s5_s16_many_concurrent_recoverers_converge() -> None:
    async def body() -> None:
        c = await started(5)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        acked = await write(lh, 40)
        inflight = [lh.append(b"e%d" % i) for i in range(40, 60)]  # some land, some don't
        await asyncio.sleep(0.0003)
        c.net.reset_links("writer")
        await lh.close_quietly()
        clients = [c.client(f"rec{i}", config()) for i in range(6)]
        handles = await asyncio.gather(*(k.open_ledger(lh.id, password=PW) for k in clients))
        ends = {(h.metadata.last_entry_id, h.metadata.length) for h in handles}
        assert len(ends) == 1, ends
        (last, _), = ends
        assert last >= acked[-1]
        for f in inflight:
            if f.done() and not f.exception():
                assert f.result() <= last
        await c.stop()

    run_sim(body)


def test_s9_lac_readable_but_rewrite_impossible_never_closes_short() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 3, password=PW)
        await write(lh, 10)  # bookies know LAC 8 from the piggyback; 9 must be re-written
        await lh.close_quietly()
        for b in c.bookies:
            b.refuse_adds()  # adds refused, reads served
        rec = c.client("rec", config())
        with pytest.raises(NotEnoughBookiesError):
            await rec.open_ledger(lh.id, password=PW)
        md = await rec.ledger_metadata(lh.id)
        assert md.state is LedgerState.IN_RECOVERY, "must not close the ledger short"
        for b in c.bookies:
            b.take_adds()
        assert await read_all(rec, lh.id) == (9, [b"e%d" % i for i in range(10)])
        await c.stop()

    run_sim(body)


def test_s12_all_bookies_down_recovery_fails_and_ledger_stays_open() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await write(lh, 5)
        for b in c.bookies:
            await b.crash(torn=False)
        rec = c.client("rec", config())
        with pytest.raises(BookieUnavailableError):
            await rec.open_ledger(lh.id, password=PW)
        assert (await rec.ledger_metadata(lh.id)).state is not LedgerState.CLOSED
        for b in c.bookies:
            await b.restart()
        await asyncio.sleep(1)  # past the client's reconnect back-off
        assert await read_all(rec, lh.id) == (4, [b"e%d" % i for i in range(5)])
        await c.stop()

    run_sim(body)


def test_s3_fencing_and_recovery_with_a_hung_bookie() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 20)
        hung = c.bookie(lh.metadata.ensembles[0][1][1])
        c.net.partition("rec", hung.id)  # its answers never come
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        rh = await c.client("rec", config(read_timeout_s=30.0)).open_ledger(lh.id, password=PW)
        assert rh.metadata.last_entry_id == 19
        # Fencing needs Qw-Qa+1 = 2 answers per write set: no waiting for the hung one.
        assert loop.time() - t0 < 5
        with pytest.raises(LedgerFencedError):
            await lh.append(b"late")
        await c.stop()

    run_sim(body)


def test_s7_every_recovery_read_fences() -> None:
    """Recovery reads carry the fence flag too (BookKeeper's TLA+-found bug): a bookie
    that missed the fence round but answers a recovery read is fenced by it, so the old
    writer cannot complete an entry there after the ledger is closed."""
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 5)
        seen: list[ReadRequest] = []
        for b in c.bookies:
            assert b.processor is not None
            original = b.processor.handle

            def spy(req: Any, conn: Any, original: Any = original) -> None:
                if isinstance(req, ReadRequest) and conn.peer.startswith("rec:"):
                    seen.append(req)
                original(req, conn)

            b.processor.handle = spy  # type: ignore[method-assign]
        late = c.bookie(lh.metadata.ensembles[0][1][2])
        c.net.partition("rec", late.id)
        loop = asyncio.get_running_loop()
        loop.call_later(0.02, c.net.heal, "rec", late.id)  # it answers later reads
        rh = await c.client("rec", config(read_timeout_s=1.0)).open_ledger(lh.id, password=PW)
        last = rh.metadata.last_entry_id
        assert last == 4
        assert seen and all(r.flags & ReadFlag.FENCE for r in seen), seen
        results = await asyncio.gather(*(lh.append(b"x") for _ in range(3)),
                                       return_exceptions=True)
        assert all(isinstance(r, Exception) for r in results)
        assert await read_all(c.client("r", config()), lh.id) == (4, [b"e%d" % i for i in range(5)])
        await c.stop()

    run_sim(body)


def test_s17_s18_close_variants() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        pending = [lh.append(b"e%d" % i) for i in range(10)]
        await lh.close()  # waits for the adds in flight
        assert [f.result() for f in pending] == list(range(10))
        await lh.close()  # double close is harmless
        with pytest.raises(LedgerClosedError):
            lh.append(b"after")
        assert (await bk.ledger_metadata(lh.id)).last_entry_id == 9
        # Someone else recovered (and closed) the ledger: the writer's close fails.
        lh2 = await bk.create_ledger(3, 2, 2, password=PW)
        await write(lh2, 3)
        await c.client("rec", config()).open_ledger(lh2.id, password=PW)
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await lh2.append(b"x")
        with pytest.raises((LedgerFencedError, LedgerClosedError)):
            await lh2.close()
        await c.stop()

    run_sim(body)


def test_s2_bad_password_does_not_fence() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 2, 2, password=PW)
        await write(lh, 3)
        with pytest.raises(UnauthorizedAccessError):
            await c.client("bad", config()).open_ledger(lh.id, password=b"wrong")
        assert await lh.append(b"still mine") == 3
        assert (await bk.ledger_metadata(lh.id)).state is LedgerState.OPEN
        await c.stop()

    run_sim(body)


def test_s26_long_poll_with_some_bookies_down() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 3)
        rh = await c.client("tail", config()).open_ledger(lh.id, password=PW, recovery=False)
        down = c.bookie(lh.metadata.ensembles[0][1][0])
        await down.crash(torn=False)
        waiter = asyncio.create_task(rh.wait_for_lac(rh.last_add_confirmed, timeout=10))
        await asyncio.sleep(0.1)
        await write(lh, 3, start=3)
        assert await waiter > 1
        await c.stop()

    run_sim(body)


def test_degraded_writing_without_a_spare_then_replacement() -> None:
    async def body() -> None:
        c = await started(3)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 5)
        dead = c.bookie(lh.metadata.ensembles[0][1][0])
        await dead.crash(torn=False)
        assert await write(lh, 20, start=5) == list(range(5, 25))  # Qa=2 still reachable
        assert len(lh.metadata.ensembles) == 1
        await dead.restart()  # not a spare: it is in the ensemble, so still excluded
        c.bookies.append(spare := type(dead)("b9:3181", c.net, c.state, c.bookie_config))
        await spare.start()
        await asyncio.sleep(5)  # the periodic retry finds the spare
        assert await write(lh, 5, start=25) == list(range(25, 30))
        assert lh.metadata.ensembles[-1][1][0] == spare.id
        await lh.close()
        assert await read_all(c.client("r", config()), lh.id) == (29, [b"e%d" % i for i in range(30)])
        await c.stop()

    run_sim(body)


def test_s8_recovery_replaces_two_bookies_that_refuse_rewrites() -> None:
    async def body() -> None:
        c = await started(5)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(10):
            await lh.append(b"e%d" % i)  # one at a time: bookies know LAC 8, 9 is re-written
        await lh.close_quietly()
        refusing = lh.metadata.ensembles[0][1][:2]
        for bid in refusing:
            c.bookie(bid).refuse_adds()  # reads served, adds refused
        rh = await c.client("rec", config()).open_ledger(lh.id, password=PW)
        md = rh.metadata
        assert md.last_entry_id == 9
        assert [f for f, _ in md.ensembles] == [0, 9]
        assert not set(refusing) & set(md.ensembles[1][1])
        for bid in refusing:
            await c.bookie(bid).crash(torn=False)
        assert await read_all(c.client("r", config()), lh.id) == (9, [b"e%d" % i for i in range(10)])
        await c.stop()

    run_sim(body)


def test_s10_last_fragment_with_fresh_bookies_reporting_lac_minus_one() -> None:
    """The writer changed its ensemble at 10 and died before writing there: the new
    fragment's bookie knows nothing (LAC -1).  Recovery starts at 9, not at -1."""
    async def body() -> None:
        c = await started(2)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(1, 1, 1, password=PW)
        await write(lh, 10)
        await lh.close_quietly()
        spare = next(b.id for b in c.bookies if b.id not in lh.metadata.ensembles[0][1])
        md = await bk.ledger_metadata(lh.id)
        await bk.meta.update_ledger(md.replace(ensembles=md.ensembles + ((10, (spare,)),)))
        rh = await c.client("rec", config()).open_ledger(lh.id, password=PW)
        assert rh.metadata.last_entry_id == 9
        assert rh.metadata.length == sum(len(b"e%d" % i) for i in range(10))
        assert [f for f, _ in rh.metadata.ensembles] == [0, 10]
        assert await read_all(c.client("r", config()), lh.id) == (9, [b"e%d" % i for i in range(10)])
        await c.stop()

    run_sim(body)


def test_s14_bookie_crash_in_the_middle_of_recovery() -> None:
    async def body() -> None:
        c = await started(4)
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        for i in range(10):
            await lh.append(b"e%d" % i)
        await asyncio.gather(*(lh.append(b"e%d" % i) for i in range(10, 30)))
        await lh.close_quietly()
        victim = c.bookie(lh.metadata.ensembles[0][1][1])
        assert victim.processor is not None
        original = victim.processor.handle
        crashed: list[bool] = []

        def crash_on_rewrite(req: Any, conn: Any) -> None:
            if isinstance(req, (AddRequest, AddBatchRequest)) and req.flags and not crashed:
                crashed.append(True)
                asyncio.get_running_loop().create_task(victim.crash(torn=True))
                return
            original(req, conn)

        victim.processor.handle = crash_on_rewrite  # type: ignore[method-assign]
        rh = await c.client("rec", config()).open_ledger(lh.id, password=PW)
        assert crashed, "the victim crashed during recovery"
        assert rh.metadata.last_entry_id == 29
        assert victim.id not in rh.metadata.ensembles[-1][1]
        assert await read_all(c.client("r", config()), lh.id) == (29, [b"e%d" % i for i in range(30)])
        await c.stop()

    run_sim(body)
