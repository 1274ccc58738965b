"""Seeded simulation runs of a writer, recoverers and readers against faulty bookies,
checked against the invariants of the architecture.

``run_simulation(seed)`` builds a random cluster (3-6 whole bookies, each with 1-3
ledger directories and the memory or the on-disk index; random E/Qw/Qa) and an
auto-recovery worker, lets a writer pipeline appends while a fault injector
crashes bookies (with or without torn writes), restarts them, partitions clients
from bookies and heals them, resets connections (loss), makes bookies refuse adds
for a while, fills a bookie's disk (it turns read-only, then writable again below
the low mark) or puts it in maintenance, fails one of its ledger directories (its
disk repaired at the next restart), loses a bookie for good (when the quorums
allow it), expires leases, possibly kills the writer, and starts concurrent
recoverers; another client writes a scratch ledger and deletes it (garbage
collection and compaction run on every bookie throughout).  At the end every fault
is healed, every bookie that is not lost restarted, and two fresh readers recover
and read the ledger.  The checkers then assert:

1. acknowledged ids are contiguous from 0, in order (and the LAC never decreases);
2. every acknowledged entry is in the closed ledger with the bytes appended
   (so no add was acknowledged to a fenced writer beyond the recovered end);
3. every reader and every recoverer agrees on the last entry id and the bytes;
4. a tailing reader saw a prefix of the final ledger, in order;
5. every entry of the closed ledger is stored on at least Qa bookies of the
   write set its fragment names (invariant 1's premise: simulated disks never
   die, so an under-replicated entry would otherwise go unnoticed);
6. ledger metadata versions only increase, states only move forward
   (OPEN -> IN_RECOVERY -> CLOSED), fragments are only appended (or the last
   one replaced at the same first entry, or a bookie of a fragment that can no
   longer grow replaced by re-replication), and a closed ledger never changes
   its end;
7. a read-only bookie (full disk, maintenance) refuses a plain add;
8. a bookie lost for good is re-replicated away: the auto-recovery worker leaves
   no fragment of the ledger on it and no under-replication mark;
9. the deleted scratch ledger is gone from every bookie (garbage collection).

Same seed, same run: everything random comes from ``random.Random(seed)`` and
time is virtual (``SimEventLoop``); the trace records the bookies' state changes
too.  ``python -m asyncbk.testing.simulation --seed N -v`` replays one run with its
event trace.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from ..bookie.state import BookieState, ReadOnlyReason
from ..client.client import BookKeeper
from ..client.ledger import LedgerHandle, ReadHandle
from ..client.quorum import write_set
from ..config import BookieConfig, ClientConfig
from ..errors import BKError
from ..log import configure as configure_logging
from ..meta.model import LedgerState
from ..proto import AddRequest, AddResponse, Status
from .sim import SIM_BOOKIE_CONFIG, SimBookie, SimCluster, SimEventLoop

RUN_TIME_S_MAX = 900.0
"""Virtual seconds a run may take before it is declared stuck."""
REREPLICATION_S_MAX = 120.0
"""Virtual seconds the auto-recovery worker gets to re-replicate a lost bookie's
fragments once the faults have ended."""
GC_S_MAX = 15.0
"""Virtual seconds garbage collection gets to remove the deleted scratch ledger."""
PROBE_LEDGER_ID = 1 << 40
"""Ledger ids of the plain adds sent to read-only bookies (never created by a client)."""

_STATE_ORDER = {LedgerState.OPEN: 0, LedgerState.IN_RECOVERY: 1, LedgerState.CLOSED: 2}


@dataclass
class SimResult:
    seed: int
    config: dict[str, Any] = field(default_factory=dict)
    acked: int = 0
    last_entry_id: int = -2
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


class _Run:
    def __init__(self, seed: int, loop: SimEventLoop) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.loop = loop
        self.result = SimResult(seed)
        self.cluster: SimCluster | None = None
        self.appended: dict[int, bytes] = {}
        self.acked: list[int] = []
        self.writer_lacs: list[int] = []
        self.recovered: list[int] = []
        self.tailed: list[tuple[int, bytes]] = []
        self.ledger_id = -1
        self.scratch_id: int | None = None
        """The scratch ledger, once deleted (garbage collection must remove it)."""
        self.lost: SimBookie | None = None
        """The bookie lost for good, if any."""
        self.may_lose = False
        self.writer_done = asyncio.Event()
        self.pace_s = 0.0
        self.prober: BookKeeper | None = None
        self.probes = 0
        self.stats = {"crashes": 0, "torn": 0, "partitions": 0, "link_resets": 0, "refusals": 0,
                      "writer_killed": 0,
                      "recovery_attempts": 0, "ensemble_changes": 0,
                      "disk_full": 0, "maintenance": 0, "read_only_probes": 0,
                      "dir_failures": 0, "bookies_lost": 0, "rereplicated": 0,
                      "gc_deleted": 0}

    def log(self, text: str) -> None:
        self.result.trace.append(f"{self.loop.time():9.4f} {text}")

    def client(self, name: str) -> BookKeeper:
        assert self.cluster is not None
        cfg = ClientConfig(
            add_timeout_s=0.5, read_timeout_s=0.5, connect_timeout_s=0.3,
            speculative_read_timeout_s=self.rng.choice([0.0, 0.05, 0.2]),
            add_quorum_timeout_s=60.0,
            explicit_lac_interval_s=self.rng.choice([0.0, 0.2]),
            metadata_timeout_s=5.0, ensemble_changes_max=200,
            reconnect_backoff_s_max=0.2).validate()
        bk: BookKeeper = self.cluster.client(name, cfg)
        return bk

    # ------------------------------------------------------------------ actors

    async def writer(self, bk: BookKeeper, lh: LedgerHandle, count: int, window: int) -> None:
        sem = asyncio.Semaphore(window)

        def on_ack(fut: asyncio.Future[int]) -> None:
            sem.release()
            if fut.cancelled() or fut.exception() is not None:
                return
            self.acked.append(fut.result())
            self.writer_lacs.append(lh.last_add_confirmed)

        outstanding: list[asyncio.Future[int]] = []
        try:
            for i in range(count):
                await sem.acquire()
                payload = b"%d:%d:" % (self.seed, i) + bytes([i % 251]) * self.rng.randint(0, 64)
                try:
                    fut = lh.append(payload)
                except BKError as exc:
                    self.log(f"writer stops: {type(exc).__name__}: {exc}")
                    return
                self.appended[i] = payload
                fut.add_done_callback(on_ack)
                outstanding.append(fut)
                if self.pace_s and self.rng.random() < 0.5:
                    await asyncio.sleep(self.rng.uniform(0, self.pace_s))
                elif self.rng.random() < 0.1:
                    await asyncio.sleep(self.rng.uniform(0, 0.05))
            if self.rng.random() < 0.7:
                try:
                    await lh.close()
                    self.log(f"writer closed the ledger at {lh.last_add_confirmed}")
                except BKError as exc:
                    self.log(f"writer close failed: {type(exc).__name__}: {exc}")
            else:
                self.log("writer leaves without closing")
                await asyncio.wait(outstanding)
        finally:
            self.stats["ensemble_changes"] += lh.ensemble_changes
            self.writer_done.set()

    async def recoverer(self, name: str, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        bk = self.client(name)
        for attempt in range(200):
            self.stats["recovery_attempts"] += 1
            try:
                rh = await bk.open_ledger(self.ledger_id, password=b"pw", recovery=True)
            except BKError as exc:
                self.log(f"{name} attempt {attempt}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(self.rng.uniform(0.1, 1.0))
                continue
            self.recovered.append(rh.metadata.last_entry_id)
            self.log(f"{name} recovered: last entry {rh.metadata.last_entry_id}")
            return
        self.result.violations.append(f"{name} could not recover in 200 attempts")

    async def tailer(self, bk: BookKeeper) -> None:
        try:
            rh = await bk.open_ledger(self.ledger_id, password=b"pw", recovery=False)
            async for entry in rh.tail(0, poll_s=0.2):
                self.tailed.append((entry.entry_id, entry.data))
        except BKError as exc:
            self.log(f"tailer stops: {type(exc).__name__}: {exc}")

    async def scratch(self, bk: BookKeeper, bookies: int, delay_s: float) -> None:
        """A second ledger, written, closed and deleted: garbage collection must remove
        it from every bookie, and compaction reclaims the entry logs it shared with the
        ledger under test (whose entries must all stay readable)."""
        await asyncio.sleep(delay_s)
        e = self.rng.randint(1, min(bookies, 3))
        try:
            lh = await bk.create_ledger(e, e, 1, password=b"scratch")
            body = bytes(self.rng.getrandbits(8) for _ in range(16)) * 32
            await asyncio.gather(*(lh.append(body) for _ in range(self.rng.randint(10, 60))))
            await lh.close()
            await asyncio.sleep(self.rng.uniform(0.0, 2.0))
            await bk.delete_ledger(lh.id)
        except BKError as exc:
            self.log(f"scratch ledger: {type(exc).__name__}: {exc}")
            return
        self.scratch_id = lh.id
        self.log(f"scratch ledger {lh.id} deleted")

    async def faults(self, bookies: list[SimBookie], writer_name: str, lh: LedgerHandle,
                     writer_task: asyncio.Task[None]) -> None:
        later: list[asyncio.Task[None]] = []
        try:
            for _ in range(self.rng.randint(0, 20)):
                await asyncio.sleep(self.rng.uniform(0.005, 0.4))
                roll = self.rng.random()
                up = [b for b in bookies if b.up]
                if roll < 0.08:
                    # A bookie that answers but refuses adds for a while (lease lost):
                    # forces ensemble changes, also in the middle of recoveries.
                    if up:
                        victim = self.rng.choice(up)
                        self.stats["refusals"] += 1
                        self.log(f"{victim.id} refuses adds")
                        await self._refuse_for(victim, self.rng.uniform(0.05, 2.0))
                elif roll < 0.33:
                    if not up:
                        continue
                    victim = self.rng.choice(up)
                    torn = self.rng.random() < 0.5
                    self.stats["crashes"] += 1
                    self.stats["torn"] += torn
                    self.log(f"crash {victim.id} torn={torn}")
                    await victim.crash(torn)
                    later.append(asyncio.create_task(
                        self._restart_later(victim, self.rng.uniform(0.05, 4.0))))
                elif roll < 0.55:
                    victim = self.rng.choice(bookies)
                    who = self.rng.choice([writer_name, "rec0", "rec1", "tail"])
                    span = self.rng.uniform(0.05, 3.0)
                    self.stats["partitions"] += 1
                    self.log(f"partition {who} | {victim.id} for {span:.2f}s")
                    self.net.partition(who, victim.id)
                    self.loop.call_later(span, self.net.heal, who, victim.id)
                elif roll < 0.58 and self.net.links:
                    # Loss, TCP-style: a connection dies mid-stream.
                    number = self.rng.choice(sorted(self.net.links))
                    link = self.net.links[number]
                    self.stats["link_resets"] += 1
                    self.log(f"reset link {link.endpoints[0]} | {link.endpoints[1]}")
                    link.reset("lost")
                elif roll < 0.64 and not writer_task.done():
                    self.stats["writer_killed"] += 1
                    self.log("writer killed")
                    writer_task.cancel()
                    await lh.close_quietly()
                    self.net.reset_links(writer_name)
                elif roll < 0.74:
                    if up:
                        later.append(asyncio.create_task(
                            self._read_only_for(self.rng.choice(up),
                                                self.rng.uniform(0.3, 3.0))))
                elif roll < 0.80:
                    if up:
                        victim = self.rng.choice(up)
                        later.append(asyncio.create_task(
                            self._fail_directory(victim, self.rng.uniform(0.1, 2.0))))
                elif roll < 0.90:
                    if self.may_lose and self.lost is None and up:
                        self.lost = victim = self.rng.choice(up)
                        self.stats["bookies_lost"] += 1
                        self.log(f"{victim.id} lost for good")
                        await victim.lose()
                else:
                    self.state.expire_leases()
        finally:
            results = await asyncio.gather(*later, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _refuse_for(self, bookie: SimBookie, span_s: float) -> None:
        server = bookie.server
        bookie.refuse_adds()

        def back() -> None:
            if bookie.server is server:
                bookie.take_adds()

        self.loop.call_later(span_s, back)

    async def _restart_later(self, bookie: SimBookie, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        if bookie.lost or bookie.up or bookie.starting or bookie.fs.failing_directories:
            return  # (a failing disk is repaired, and the bookie restarted, by its fault)
        self.log(f"restart {bookie.id}")
        await bookie.restart()

    async def _read_only_for(self, bookie: SimBookie, span_s: float) -> None:
        """A full disk (the disk watch turns the bookie read-only, and writable again
        once usage is below the low mark) or maintenance (the admin switch); while
        read-only, a plain add is probed: it must be refused."""
        server = bookie.server
        assert server is not None
        disk = self.rng.random() < 0.6
        if disk:
            self.stats["disk_full"] += 1
            self.log(f"{bookie.id} disk full")
            bookie.fs.set_usage(0.97)
        else:
            self.stats["maintenance"] += 1
            self.log(f"{bookie.id} maintenance")
            try:
                await server.set_maintenance(True)
            except BKError as exc:  # the registry could not be told (retried by the bookie)
                self.log(f"{bookie.id} maintenance: {type(exc).__name__}")
        for _ in range(30):
            if bookie.server is not server or server.state is BookieState.READ_ONLY:
                break
            await asyncio.sleep(0.1)
        if bookie.server is server and server.state is BookieState.READ_ONLY:
            await self._probe_add(bookie)
        await asyncio.sleep(span_s)
        if disk:
            bookie.fs.set_usage(None)
            self.log(f"{bookie.id} disk freed")
        elif bookie.server is server and server.state in (BookieState.READ_ONLY,
                                                          BookieState.WRITABLE):
            try:
                await server.set_maintenance(False)
            except BKError as exc:
                self.log(f"{bookie.id} maintenance end: {type(exc).__name__}")
            self.log(f"{bookie.id} maintenance ended")

    async def _probe_add(self, bookie: SimBookie) -> None:
        """Checker 7: a plain add sent to a read-only bookie must not be taken."""
        assert self.prober is not None
        self.probes += 1
        self.stats["read_only_probes"] += 1
        ch = self.prober.bookie_client.channel(bookie.id)
        req = AddRequest(ch.next_request_id(), PROBE_LEDGER_ID + self.probes, 0, b"probe",
                         0, -1, b"probe")
        try:
            resp = await ch.request(req, 1.0)
        except BKError:
            return  # no answer (a partition, a crash): nothing learned
        if isinstance(resp, AddResponse) and resp.status == Status.OK:
            self.result.violations.append(
                f"{bookie.id} took a plain add while read-only ({bookie.state.value})")

    async def _fail_directory(self, bookie: SimBookie, span_s: float) -> None:
        """One ledger directory's disk fails (writes, fsyncs, file changes: EIO); after
        ``span_s`` the machine is power-cycled with the disk repaired."""
        server = bookie.server
        directory = self.rng.choice(bookie.ledger_dirs)
        self.stats["dir_failures"] += 1
        self.log(f"{bookie.id} directory {directory} fails")
        bookie.fs.fail_directory(directory)
        await asyncio.sleep(span_s)
        if bookie.server is server and bookie.up:
            torn = self.rng.random() < 0.5
            self.log(f"crash {bookie.id} torn={torn} (failing directory)")
            await bookie.crash(torn)
        bookie.fs.heal_directories()
        await self._restart_later(bookie, self.rng.uniform(0.05, 1.0))

    # ------------------------------------------------------------------ the run

    async def run(self) -> SimResult:
        rng = self.rng
        n = rng.randint(3, 6)
        e = rng.randint(1, min(n, 5))
        w = rng.randint(1, e)
        a = rng.randint(1, w)
        count = rng.randint(1, 300)
        window = rng.choice([1, 4, 32, 128])
        self.pace_s = rng.choice([0.0, 0.002, 0.01])
        dirs = rng.choice([1, 1, 2, 3])
        index = rng.choice(["memory", "memory", "lmdb"])
        # A bookie may be lost for good only when every acknowledged entry keeps a copy
        # (Qa >= 2) and there is a spare bookie to re-replicate to.
        self.may_lose = a >= 2 and n > e
        self.result.config = {"bookies": n, "E": e, "Qw": w, "Qa": a, "entries": count,
                              "window": window, "pace_s": self.pace_s, "ledger_dirs": dirs,
                              "index": index}
        self.log(f"config {self.result.config}")
        self.cluster = cluster = SimCluster(
            rng.getrandbits(64), n, ledger_dirs=dirs, trace=self.log,
            bookie_config=BookieConfig(**{**SIM_BOOKIE_CONFIG,
                                          "index_backend": index}).validate())
        self.net = cluster.net
        self.state = cluster.state
        bookies = cluster.bookies
        await cluster.start()
        await cluster.start_autorecovery()
        self.prober = self.client("prober")
        writer_bk = self.client("writer")
        lh = await writer_bk.create_ledger(e, w, a, password=b"pw")
        self.ledger_id = lh.id
        writer_task = asyncio.create_task(self.writer(writer_bk, lh, count, window))
        tail_task = (asyncio.create_task(self.tailer(self.client("tail")))
                     if rng.random() < 0.5 else None)
        writing_s = count * self.pace_s / 4 + 0.2  # about how long the writer runs
        recoverers = [asyncio.create_task(self.recoverer(f"rec{i}", rng.uniform(0.0, writing_s)))
                      for i in range(rng.choice([0, 1, 1, 2, 3]))]
        scratch_task = (asyncio.create_task(self.scratch(self.client("scratch"), n,
                                                         rng.uniform(0.0, writing_s)))
                        if rng.random() < 0.5 else None)
        fault_task = asyncio.create_task(self.faults(bookies, "writer", lh, writer_task))
        try:
            await asyncio.wait([writer_task])
            await fault_task
            if scratch_task is not None:
                await scratch_task
            self.net.heal_all()
            for b in bookies:
                b.fs.set_usage(None)
                b.fs.heal_directories()
                if b.up and b.server is not None \
                        and ReadOnlyReason.MAINTENANCE in b.server.state_machine.reasons:
                    with contextlib.suppress(BKError):
                        await b.server.set_maintenance(False)
                if not b.up and not b.lost:
                    await b.restart()
            if recoverers:
                await asyncio.gather(*recoverers)
            final = await self.final_read(bookies)
            if tail_task is not None:
                try:
                    async with asyncio.timeout(60):
                        await tail_task
                except TimeoutError:
                    self.result.violations.append("the tailing reader never ended")
            if self.lost is not None:
                await self.wait_rereplicated(self.lost)
            if self.scratch_id is not None:
                await self.wait_collected(bookies, self.scratch_id)
            self.check(final)
        finally:
            for t in [writer_task, fault_task, *recoverers,
                      *([tail_task] if tail_task else []),
                      *([scratch_task] if scratch_task else [])]:
                t.cancel()
            await cluster.stop()
        self.result.acked = len(self.acked)
        self.result.stats = dict(self.stats)
        return self.result

    async def final_read(self, bookies: list[SimBookie]) -> list[tuple[int, list[bytes]]]:
        out = []
        for name in ("reader0", "reader1"):
            bk = self.client(name)
            rh: ReadHandle | None = None
            for _ in range(100):
                try:
                    rh = await bk.open_ledger(self.ledger_id, password=b"pw", recovery=True)
                    break
                except BKError as exc:
                    self.log(f"{name} open: {type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.5)
            if rh is None:
                self.result.violations.append(f"{name} could not open the ledger after healing")
                continue
            last = rh.metadata.last_entry_id
            data = [e.data for e in await rh.read(0, last)] if last >= 0 else []
            out.append((last, data))
        return out

    async def wait_rereplicated(self, lost: SimBookie) -> None:
        """Checker 8: the auto-recovery worker copies what the lost bookie held to
        other bookies and clears the ledger's under-replication mark."""
        assert self.cluster is not None
        meta = self.cluster.clients[0].meta
        for _ in range(int(REREPLICATION_S_MAX / 0.5)):
            md = await meta.read_ledger(self.ledger_id)
            marks = {m.ledger_id for m in await meta.list_underreplicated()}
            if lost.id not in md.all_bookies() and self.ledger_id not in marks:
                self.stats["rereplicated"] += 1
                self.log(f"ledger re-replicated off {lost.id}")
                return
            await asyncio.sleep(0.5)
        self.result.violations.append(
            f"{lost.id} was lost for good, but after {REREPLICATION_S_MAX:.0f} s the ledger "
            f"still names it or is still marked under-replicated")

    async def wait_collected(self, bookies: list[SimBookie], ledger_id: int) -> None:
        """Checker 9: garbage collection removes a deleted ledger from every bookie."""
        for _ in range(int(GC_S_MAX / 0.5)):
            holders = [b.id for b in bookies if b.up and ledger_id in b.stored_ledgers()]
            if not holders:
                self.stats["gc_deleted"] += 1
                return
            await asyncio.sleep(0.5)
        self.result.violations.append(
            f"deleted ledger {ledger_id} is still stored on {holders} after {GC_S_MAX:.0f} s")

    # ------------------------------------------------------------------ checks

    def check(self, final: list[tuple[int, list[bytes]]]) -> None:
        v = self.result.violations
        if self.acked != list(range(len(self.acked))):
            v.append(f"acknowledged ids not contiguous in order: {self.acked[:20]}...")
        if any(b < a for a, b in zip(self.writer_lacs, self.writer_lacs[1:], strict=False)):
            v.append("the writer's LAC decreased")
        if not final:
            return
        last, data = final[0]
        self.result.last_entry_id = last
        for other_last, other_data in final[1:]:
            if (other_last, other_data) != (last, data):
                v.append(f"readers disagree: last {last} vs {other_last}")
        for r in self.recovered:
            if r != last:
                v.append(f"a recoverer closed at {r}, readers see {last}")
        if self.acked and self.acked[-1] > last:
            v.append(f"entry {self.acked[-1]} was acknowledged but the ledger ends at {last}")
        for eid in range(last + 1):
            if data[eid] != self.appended.get(eid):
                v.append(f"entry {eid} reads {data[eid][:24]!r}, appended "
                         f"{self.appended.get(eid, b'<never>')[:24]!r}")
                break
        self.check_replication(last)
        for i, (eid, payload) in enumerate(self.tailed):
            if eid != i or eid > last or payload != data[eid]:
                v.append(f"tailing reader saw entry {eid} at position {i} wrongly")
                break
        self.check_metadata()

    def check_replication(self, last: int) -> None:
        """Invariant 1's premise: every entry of the closed ledger is on at least Qa
        bookies of the write set the metadata names for it (so losing any Qa-1 of
        them loses nothing).  Simulated disks never die, so without this check an
        under-replicated entry would go unnoticed."""
        assert self.cluster is not None
        md = max((m for m in self.cluster.history if m.ledger_id == self.ledger_id),
                 key=lambda m: m.version)
        for eid in range(last + 1):
            ensemble = md.ensemble_at(eid)
            holders = [ensemble[p] for p in write_set(eid, md.ensemble_size, md.write_quorum)
                       if eid in self._stored(ensemble[p])]
            if len(holders) < md.ack_quorum:
                self.result.violations.append(
                    f"entry {eid} is on {len(holders)} bookie(s) of its write set "
                    f"({holders}), fewer than Qa={md.ack_quorum}")
                return

    def _stored(self, bookie_id: str) -> set[int]:
        assert self.cluster is not None
        return self.cluster.bookie(bookie_id).stored_entries(self.ledger_id)

    def check_metadata(self) -> None:
        v = self.result.violations
        assert self.cluster is not None
        mine = [md for md in self.cluster.history if md.ledger_id == self.ledger_id]
        for prev, cur in zip(mine, mine[1:], strict=False):
            if cur.version <= prev.version:
                v.append(f"metadata version went from {prev.version} to {cur.version}")
            if _STATE_ORDER[cur.state] < _STATE_ORDER[prev.state]:
                v.append(f"metadata state went back from {prev.state} to {cur.state}")
            if prev.is_closed and (cur.last_entry_id, cur.length) != (prev.last_entry_id,
                                                                      prev.length):
                v.append("a closed ledger's end changed")
            pf, cf = prev.ensembles, cur.ensembles
            # Re-replication may replace bookies of a fragment that can no longer grow
            # (an earlier one, or any of a closed ledger): the fragments' first entries
            # and ensemble sizes stay; a writer may also replace its last fragment at
            # the same first entry, or append fragments.
            if len(cf) < len(pf) or [f for f, _ in cf[:len(pf)]] != [f for f, _ in pf] \
                    or any(len(c) != len(p) for (_, c), (_, p) in zip(cf, pf, strict=False)):
                v.append(f"fragments rewritten: {pf} -> {cf}")


def run_simulation(seed: int) -> SimResult:
    """One seeded run (see the module docstring); never raises for a finding."""
    loop = SimEventLoop()
    run = _Run(seed, loop)
    try:
        return loop.run_until_complete(asyncio.wait_for(run.run(), RUN_TIME_S_MAX))
    except Exception as exc:  # a crash or deadlock of the run is itself a finding
        run.result.violations.append(f"run failed: {type(exc).__name__}: {exc}")
        return run.result
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run seeded simulations and check invariants.")
    p.add_argument("--seed", type=int, default=None, help="replay one seed")
    p.add_argument("--seeds", type=int, default=100, help="how many seeds (from --first)")
    p.add_argument("--first", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print each seed's event trace, and the warnings the simulated "
                   "clients and bookies log (fenced writers, failed ensemble changes: "
                   "expected under the injected faults; quiet by default)")
    args = p.parse_args(argv)
    configure_logging("warning" if args.verbose else "error")
    seeds = [args.seed] if args.seed is not None else range(args.first, args.first + args.seeds)
    failed = 0
    for seed in seeds:
        r = run_simulation(seed)
        if args.verbose:
            print("\n".join(r.trace))
        status = "ok" if r.ok else "FAIL"
        print(f"seed {seed}: {status} {r.config} acked={r.acked} last={r.last_entry_id} "
              f"{r.stats}")
        for violation in r.violations:
            print(f"  violation: {violation}")
        failed += not r.ok
    print(f"{len(seeds) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
