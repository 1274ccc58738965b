"""Seeded simulation runs of a writer, recoverers and readers against faulty bookies,
checked against the invariants of the architecture.

``run_simulation(seed)`` builds a random cluster (3-6 bookies, random E/Qw/Qa),
lets a writer pipeline appends while a fault injector crashes bookies (with or
without torn writes), restarts them, partitions clients from bookies and heals
them, resets connections (loss), possibly kills the writer, and starts
concurrent recoverers.  At the end
every fault is healed, every bookie restarted, and two fresh readers recover
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
   one replaced at the same first entry), and a closed ledger never changes.

Same seed, same run: everything random comes from ``random.Random(seed)`` and
time is virtual (``SimEventLoop``).  ``python -m asyncbk.testing.simulation
--seed N -v`` replays one run with its event trace.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
from dataclasses import dataclass, field
from typing import Any

from ..client.client import BookKeeper
from ..client.ledger import LedgerHandle, ReadHandle
from ..client.quorum import write_set
from ..config import ClientConfig
from ..errors import BKError
from ..meta.model import LedgerState
from .sim import SimBookie, SimCluster, SimEventLoop

RUN_TIME_S_MAX = 900.0
"""Virtual seconds a run may take before it is declared stuck."""

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
        self.writer_done = asyncio.Event()
        self.pace_s = 0.0
        self.stats = {"crashes": 0, "torn": 0, "partitions": 0, "link_resets": 0, "refusals": 0,
                      "writer_killed": 0,
                      "recovery_attempts": 0, "ensemble_changes": 0}

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

    async def faults(self, bookies: list[SimBookie], writer_name: str, lh: LedgerHandle,
                     writer_task: asyncio.Task[None]) -> None:
        restarts: list[asyncio.Task[None]] = []
        try:
            for _ in range(self.rng.randint(0, 20)):
                await asyncio.sleep(self.rng.uniform(0.005, 0.4))
                roll = self.rng.random()
                if roll < 0.1:
                    # A bookie that answers but refuses adds for a while (lease lost):
                    # forces ensemble changes, also in the middle of recoveries.
                    up = [b for b in bookies if b.up and b.processor is not None]
                    if up:
                        victim = self.rng.choice(up)
                        self.stats["refusals"] += 1
                        self.log(f"{victim.id} refuses adds")
                        await self._refuse_for(victim, self.rng.uniform(0.05, 2.0))
                elif roll < 0.4:
                    up = [b for b in bookies if b.up]
                    if not up:
                        continue
                    victim = self.rng.choice(up)
                    torn = self.rng.random() < 0.5
                    self.stats["crashes"] += 1
                    self.stats["torn"] += torn
                    self.log(f"crash {victim.id} torn={torn}")
                    await victim.crash(torn)
                    restarts.append(asyncio.create_task(
                        self._restart_later(victim, self.rng.uniform(0.05, 4.0))))
                elif roll < 0.65:
                    victim = self.rng.choice(bookies)
                    who = self.rng.choice([writer_name, "rec0", "rec1", "tail"])
                    span = self.rng.uniform(0.05, 3.0)
                    self.stats["partitions"] += 1
                    self.log(f"partition {who} | {victim.id} for {span:.2f}s")
                    self.net.partition(who, victim.id)
                    self.loop.call_later(span, self.net.heal, who, victim.id)
                elif roll < 0.68 and self.net.links:
                    # Loss, TCP-style: a connection dies mid-stream.
                    number = self.rng.choice(sorted(self.net.links))
                    link = self.net.links[number]
                    self.stats["link_resets"] += 1
                    self.log(f"reset link {link.endpoints[0]} | {link.endpoints[1]}")
                    link.reset("lost")
                elif roll < 0.75 and not writer_task.done():
                    self.stats["writer_killed"] += 1
                    self.log("writer killed")
                    writer_task.cancel()
                    await lh.close_quietly()
                    self.net.reset_links(writer_name)
                else:
                    self.state.expire_leases()
        finally:
            for t in restarts:
                await t

    async def _refuse_for(self, bookie: SimBookie, span_s: float) -> None:
        server = bookie.server
        bookie.refuse_adds()

        def back() -> None:
            if bookie.server is server:
                bookie.take_adds()

        self.loop.call_later(span_s, back)

    async def _restart_later(self, bookie: SimBookie, delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        self.log(f"restart {bookie.id}")
        await bookie.restart()

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
        self.result.config = {"bookies": n, "E": e, "Qw": w, "Qa": a, "entries": count,
                              "window": window, "pace_s": self.pace_s}
        self.log(f"config {self.result.config}")
        self.cluster = cluster = SimCluster(rng.getrandbits(64), n)
        self.net = cluster.net
        self.state = cluster.state
        bookies = cluster.bookies
        await cluster.start()
        writer_bk = self.client("writer")
        lh = await writer_bk.create_ledger(e, w, a, password=b"pw")
        self.ledger_id = lh.id
        writer_task = asyncio.create_task(self.writer(writer_bk, lh, count, window))
        tail_task = (asyncio.create_task(self.tailer(self.client("tail")))
                     if rng.random() < 0.5 else None)
        writing_s = count * self.pace_s / 4 + 0.2  # about how long the writer runs
        recoverers = [asyncio.create_task(self.recoverer(f"rec{i}", rng.uniform(0.0, writing_s)))
                      for i in range(rng.choice([0, 1, 1, 2, 3]))]
        fault_task = asyncio.create_task(self.faults(bookies, "writer", lh, writer_task))
        try:
            await asyncio.wait([writer_task])
            await fault_task
            self.net.heal_all()
            for b in bookies:
                if not b.up:
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
            self.check(final)
        finally:
            for t in [writer_task, fault_task, *recoverers, *([tail_task] if tail_task else [])]:
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
            if len(cf) < len(pf) or cf[: len(pf) - 1] != pf[:-1] or cf[len(pf) - 1][0] != pf[-1][0]:
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
    p.add_argument("-v", "--verbose", action="store_true", help="print the event trace")
    args = p.parse_args(argv)
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
