"""Whole bookies on the simulator: what its composition root brings, scripted.

Each simulated bookie is the real :class:`~asyncbk.bookie.server.BookieServer` over
its simulated disks, network and virtual time, so these run the parts a bookie wires
up around its storage: the disk watch switching read-only and back, several ledger
directories with one failing, the cookie and the directory lock, garbage collection
and compaction, and an auto-recovery worker beside the bookies.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from asyncbk.bookie.server import BookieServer
from asyncbk.bookie.state import BookieState, ReadOnlyReason
from asyncbk.client.client import BookKeeper
from asyncbk.client.ledger import LedgerHandle
from asyncbk.client.quorum import write_set
from asyncbk.config import BookieConfig
from asyncbk.errors import ConfigError, CookieError
from asyncbk.proto import AddFlag, AddRequest, AddResponse, Status
from asyncbk.testing.sim import SIM_BOOKIE_CONFIG, SimCluster, run_sim

from .client_config import PW, config


async def write(lh: LedgerHandle, n: int, start: int = 0) -> list[int]:
    return list(await asyncio.gather(*(lh.append(b"e%d" % i) for i in range(start, start + n))))


async def read_all(bk: BookKeeper, ledger_id: int) -> tuple[int, list[bytes]]:
    rh = await bk.open_ledger(ledger_id, password=PW)
    last = rh.metadata.last_entry_id
    return last, [e.data for e in await rh.read(0, last)] if last >= 0 else []


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait (virtual time) until ``condition()`` holds."""
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - polling virtual time
            await asyncio.sleep(0.05)


async def add(bk: BookKeeper, bookie: str, ledger_id: int, entry_id: int,
              flags: int = 0) -> Status:
    """One ADD straight to ``bookie``; its status."""
    ch = bk.bookie_client.channel(bookie)
    resp = await ch.request(AddRequest(ch.next_request_id(), ledger_id, entry_id, b"key",
                                       flags, -1, b"body"), 1.0)
    assert isinstance(resp, AddResponse)
    return Status(resp.status)


async def registered_read_only(c: SimCluster, bookie: str) -> bool | None:
    reg = (await c.clients[0].meta.list_bookies()).get(bookie)
    return None if reg is None else reg.readonly


def test_a_full_disk_turns_the_bookie_read_only_and_writable_below_the_low_mark() -> None:
    """The disk watch, on the simulated disk's usage: past the threshold (0.95) the
    bookie refuses plain adds (recovery adds still taken), moves its registration to
    read-only and writers replace it; between the marks it stays read-only; below the
    low mark (0.90) it is writable again."""
    async def body() -> None:
        trace: list[str] = []
        c = SimCluster(1, 4, trace=trace.append)
        await c.start()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 10)
        full = c.bookie(lh.metadata.ensembles[0][1][0])
        full.fs.set_usage(0.97)
        await until(lambda: full.state is BookieState.READ_ONLY)
        assert full.server is not None
        assert full.server.state_view().reasons == ("disk_full",)
        await until(lambda: True, 0.5)
        assert await registered_read_only(c, full.id) is True
        probe = c.client("probe", config())
        assert await add(probe, full.id, 1 << 40, 0) == Status.READ_ONLY
        assert await add(probe, full.id, 1 << 40, 0, AddFlag.RECOVERY_ADD) == Status.OK
        await write(lh, 10, 10)  # the writer replaces the read-only bookie
        assert full.id not in lh.metadata.ensembles[-1][1]
        full.fs.set_usage(0.92)  # between the marks: read-only still
        await asyncio.sleep(3)
        assert full.state is BookieState.READ_ONLY
        full.fs.set_usage(0.5)
        await until(lambda: full.state is BookieState.WRITABLE)
        await until(lambda: True, 0.5)
        assert await registered_read_only(c, full.id) is False
        assert f"{full.id} writable -> readonly [disk_full]" in trace
        assert f"{full.id} readonly -> writable []" in trace
        await lh.close()
        assert await read_all(bk, lh.id) == (19, [b"e%d" % i for i in range(20)])
        await c.stop()

    run_sim(body)


def test_maintenance_and_a_full_disk_are_reasons_of_one_state() -> None:
    """The admin switch and the disk watch feed one state machine: the bookie is
    writable again only when neither reason holds; a restart forgets maintenance."""
    async def body() -> None:
        c = SimCluster(2, 3)
        await c.start()
        b = c.bookies[0]
        assert b.server is not None
        view = await b.server.set_maintenance(True)
        assert (view.state, view.reasons) == (BookieState.READ_ONLY, ("maintenance",))
        b.fs.set_usage(0.99)
        await until(lambda: b.server is not None and len(b.server.state_view().reasons) == 2)
        assert b.server.state_machine.reasons == (ReadOnlyReason.DISK_FULL,
                                                  ReadOnlyReason.MAINTENANCE)
        await b.server.set_maintenance(False)
        assert b.state is BookieState.READ_ONLY  # the disk is still full
        await b.server.set_maintenance(True)
        await b.crash(torn=False)
        await b.restart()  # the disk is still full; maintenance is forgotten
        await until(lambda: b.state is BookieState.READ_ONLY)
        assert b.server.state_view().reasons == ("disk_full",)
        b.fs.set_usage(None)
        await until(lambda: b.state is BookieState.WRITABLE)
        await c.stop()
        assert b.state is BookieState.CLOSED

    run_sim(body)


def test_a_failing_ledger_directory_takes_only_its_ledgers_out() -> None:
    """A bookie with two ledger directories, one of whose disks fails: adds to the
    ledgers there fail (writers replace the bookie in those ledgers), new ledgers go to
    the other directory, the bookie stays writable; once both directories' journals
    failed it is read-only (journal_failed).  Power-cycled with the disks repaired, it
    serves every acknowledged entry again."""
    async def body() -> None:
        cfg = BookieConfig(**SIM_BOOKIE_CONFIG).validate()
        c = SimCluster(3, 5, ledger_dirs=2, bookie_config=cfg)
        await c.start()
        bk = c.client("writer", config())
        handles = [await bk.create_ledger(4, 4, 3, password=PW) for _ in range(2)]
        both = set(handles[0].metadata.ensembles[0][1]) & set(handles[1].metadata.ensembles[0][1])
        b = c.bookie(sorted(both)[0])
        for lh in handles:
            await write(lh, 5)
        assert b.storage is not None
        where = {lh.id: b.storage.directory_of(lh.id) for lh in handles}  # type: ignore[attr-defined]
        assert set(where.values()) == set(b.ledger_dirs)  # one ledger in each directory
        broken = where[handles[0].id]
        b.fs.fail_directory(broken)
        await write(handles[0], 5, 5)  # b fails these adds: the writer replaces it
        await until(lambda: b.id not in handles[0].metadata.ensembles[-1][1])
        await write(handles[1], 5, 5)  # the other directory goes on
        assert b.id in handles[1].metadata.ensembles[-1][1]
        assert b.state is BookieState.WRITABLE
        fresh = await bk.create_ledger(5, 5, 5, password=PW)  # needs b: placed elsewhere
        await write(fresh, 3)
        assert b.storage.directory_of(fresh.id) != broken  # type: ignore[attr-defined]
        b.fs.fail_directory(b.ledger_dirs[0].parent / "journal")  # every journal now
        with pytest.raises(TimeoutError):  # b fails it; no spare bookie for E=5: it waits
            await asyncio.wait_for(write(fresh, 1, 3), 5)
        await until(lambda: b.state is BookieState.READ_ONLY)
        assert b.server is not None
        assert "journal_failed" in b.server.state_view().reasons
        await b.crash(torn=True)
        b.fs.heal_directories()
        await b.restart()
        assert b.state is BookieState.WRITABLE
        for lh in handles:
            await lh.close()
        assert await read_all(bk, handles[0].id) == (9, [b"e%d" % i for i in range(10)])
        assert await read_all(bk, handles[1].id) == (9, [b"e%d" % i for i in range(10)])
        await c.stop()

    run_sim(body)


def test_cookie_and_directory_lock_refuse_a_second_process_and_a_wiped_disk() -> None:
    """A second process of a running bookie is refused (its namesake answers; and
    its directories are locked); a bookie whose ledger disk was wiped refuses to start
    (invariant 6); a crashed bookie restarts at once (its stale registration does not
    count, the lock died with it)."""
    async def body() -> None:
        c = SimCluster(4, 3)
        await c.start()
        b = c.bookies[0]
        twin = BookieServer(b.config, context=b.context())  # same machine, same id
        with pytest.raises(CookieError, match="already registered and running"):
            await twin.start()
        assert twin.state is BookieState.CLOSED
        lock = b.fs.lock([b.ledger_dirs[0]])
        with pytest.raises(CookieError, match="in use by another running bookie"):
            lock.acquire()
        await b.crash(torn=False)
        await b.restart()  # within the lease TTL of the dead process: fine
        assert b.state is BookieState.WRITABLE
        await b.stop()
        b.fs.wipe(b.ledger_dirs[0])
        with pytest.raises(CookieError, match="has none"):
            await b.restart()
        assert not b.up
        await c.stop()

    run_sim(body)


def test_a_port_in_use_is_said_before_the_cookie() -> None:
    """Something else listens on a stopped bookie's port: starting it is refused for
    the port, not for its cookie."""
    async def body() -> None:
        c = SimCluster(5, 2)
        await c.start()
        b0, b1 = c.bookies
        await b0.stop()  # deregistered
        c.net.listeners[b0.id] = c.net.listeners[b1.id]  # another process took the port
        with pytest.raises(ConfigError, match=f"port {b0.config.port} is in use"):
            await b0.restart()
        del c.net.listeners[b0.id]
        await b0.restart()
        assert b0.state is BookieState.WRITABLE
        await c.stop()

    run_sim(body)


def test_the_worker_re_replicates_a_bookie_lost_for_good() -> None:
    """A bookie of a closed ledger is lost for good: the auditor marks the ledger
    under-replicated once the bookie has been gone for the delay, a worker copies what
    it held to a spare bookie and swaps it into the metadata; every entry is then on
    Qa bookies of its write set again."""
    async def body() -> None:
        c = SimCluster(6, 5)
        await c.start()
        ar = await c.start_autorecovery()
        bk = c.client("writer", config())
        lh = await bk.create_ledger(3, 3, 2, password=PW)
        await write(lh, 40)
        await lh.close()
        victim = c.bookie(lh.metadata.ensembles[0][1][1])
        await victim.lose()
        meta = bk.meta
        async with asyncio.timeout(60):
            while True:
                md = await meta.read_ledger(lh.id)
                if victim.id not in md.all_bookies() \
                        and not await meta.list_underreplicated():
                    break
                await asyncio.sleep(0.5)
        assert ar.status.replicated_ledgers == 1 and ar.status.replication.entries == 40
        for eid in range(40):
            ensemble = md.ensemble_at(eid)
            holders = [ensemble[p] for p in write_set(eid, 3, 3)
                       if eid in c.bookie(ensemble[p]).stored_entries(lh.id)]
            assert len(holders) == 3, (eid, holders)
        assert await read_all(bk, lh.id) == (39, [b"e%d" % i for i in range(40)])
        await c.stop()

    run_sim(body)


def test_garbage_collection_and_compaction_run_on_the_bookies() -> None:
    """A deleted ledger disappears from the bookies (garbage collection), and the
    entry logs it shared with a live ledger are compacted; the live one reads back."""
    async def body() -> None:
        c = SimCluster(7, 3)
        await c.start()
        bk = c.client("writer", config())
        doomed = await bk.create_ledger(3, 3, 3, password=PW)
        kept = await bk.create_ledger(3, 3, 3, password=PW)
        big = b"x" * 2000
        for _ in range(4):
            await asyncio.gather(*(doomed.append(big) for _ in range(10)))
            await write(kept, 2, kept.last_add_confirmed + 1)
        await doomed.close()
        await kept.close()
        await bk.delete_ledger(doomed.id)
        await until(lambda: all(doomed.id not in b.stored_ledgers() for b in c.bookies), 20)
        await until(lambda: all(b.storage is not None
                                and b.storage.statistics()["compactions"] > 0
                                for b in c.bookies), 30)
        assert await read_all(bk, kept.id) == (7, [b"e%d" % i for i in range(8)])
        await c.stop()

    run_sim(body)
