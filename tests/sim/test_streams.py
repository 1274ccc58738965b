"""Streams on the simulator: takeovers, rolls and readers under bookie faults.

The real stream client (``asyncbk.stream``: writer, reader, segment metadata
transactions) and the real ledger client and bookies run on virtual time
(``run_sim``) over the simulated network and disks.  Each randomized run drives
pipelined writers (some flushing, some with a small ``batch_bytes_max``) that
are taken over again and again by new clients, or die first, while bookies
crash and restart (one at a time) or are cut off from the writer, on a random
ledger shape; then a last opener seals the stream, and the run checks
invariant 7 of ARCHITECTURE.md:

* every record acknowledged to any writer is read back from EARLIEST by a fresh
  client exactly once, at the position it was acknowledged with, in txid order;
* every writer that was taken over got ``WriterFencedError``;
* the segments are numbered 1, 2, ... without gaps, at most the last is open,
  each starts where the previous ended (``start_sequence``), and what each says
  about itself (records, txids, last position) is what is read from it;
* a reader tailing the stream all along saw exactly what the fresh reader saw;
* readers opened at a record's position or txid start at that record.

The scripted tests freeze one side of a race at a metadata transaction (every
change to a stream's segments is one ``kv_txn``, which ``TxnGateStore`` can
hold) or at a ledger close.  A failure names its seed (``STREAM_SIM_SEEDS=1,2,3``,
the default, chooses the seeds of the randomized tests), and a seed replays the
same run: everything random, the writers' takeover back-off included, comes from
the seed (``test_a_seed_replays_the_same_run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import pytest

from asyncbk.config import ClientConfig
from asyncbk.errors import BKError, EndOfStreamError, LedgerFencedError, WriterFencedError
from asyncbk.meta.model import LedgerState
from asyncbk.stream.client import BookKeeper
from asyncbk.stream.namespace import Namespace, StreamInfo
from asyncbk.stream.position import Position
from asyncbk.stream.reader import StreamRecord
from asyncbk.stream.writer import StreamWriter
from asyncbk.testing.sim import BlockableStore, SimCluster, run_sim

from . import client_config

NS = "ns"
STREAM = "orders/eu"
SHAPES = [(3, 3, 2), (3, 2, 2), (4, 3, 2), (3, 3, 3), (2, 2, 1)]
"""Ledger shapes (E, Qw, Qa) of the randomized runs, on 5 bookies."""
SEEDS = [int(s) for s in os.environ.get("STREAM_SIM_SEEDS", "1,2,3").split(",")]
TAIL_SEEDS_THAT_FOUND_BUGS = [377]
"""Run by the tailing test whatever the seeds: 377, a reader with a stale ensemble
(test_tailing_reader_follows_an_ensemble_change_it_did_not_see)."""


# --------------------------------------------------------------------------- harness


def config(**kw: object) -> ClientConfig:
    """The simulator tests' client settings, with an explicit-LAC timer for the tailers."""
    kw.setdefault("explicit_lac_interval_s", 0.2)
    return client_config.config(**kw)


class TxnGateStore(BlockableStore):
    """BlockableStore whose generic transactions (``kv_txn``: every change to a
    stream's segments) can be held too: while ``txn_gate`` is set and
    ``txn_gate_if(puts)`` is true for a transaction, it waits for the gate
    (``txn_waiting`` tells it got there).  ``puts`` are the decoded segment
    records the transaction writes, as dicts."""

    def __init__(self, history: list[Any], **kwargs: Any) -> None:
        super().__init__(history, **kwargs)
        self.txn_gate: asyncio.Event | None = None
        self.txn_gate_if: Callable[[list[dict[str, Any]]], bool] = lambda puts: True
        self.txn_waiting = asyncio.Event()

    async def kv_txn(self, compare: Sequence[tuple[str, int]],
                     put: Sequence[tuple[str, bytes]] = (), delete: Sequence[str] = (),
                     delete_prefix: Sequence[str] = ()) -> int:
        if self.txn_gate is not None:
            puts = [msgpack.unpackb(v, raw=False) for k, v in put if "/streams/seg/" in k]
            if self.txn_gate_if(puts):
                self.txn_waiting.set()
                await self.txn_gate.wait()
        return await super().kv_txn(compare, put, delete, delete_prefix)


def stream_client(c: SimCluster, name: str, cfg: ClientConfig | None = None,
                  rng: random.Random | None = None) -> BookKeeper:
    """The stream-enabled client, built the way ``SimCluster.client`` builds the ledger
    client (closed by ``c.stop()``); ``rng``: its random generator (default: one
    seeded from the cluster's)."""
    store = TxnGateStore(c.history, state=c.state)
    bk = BookKeeper(store, cfg or config(), connector=c.net.connector(name),
                    rng=rng if rng is not None else random.Random(c.rng.getrandbits(64)),
                    clock=c.clock)
    bk.bookies.start()
    c.clients.append(bk)
    return bk


def store_of(ns: Namespace) -> TxnGateStore:
    store = ns.bk.meta
    assert isinstance(store, TxnGateStore)
    return store


def is_roll(puts: list[dict[str, Any]]) -> bool:
    """A transaction completing one segment and starting the next."""
    return [p["state"] for p in puts] == ["completed", "open"]


def is_claim(puts: list[dict[str, Any]]) -> bool:
    """A transaction changing the stream record only (an opener claiming the stream)."""
    return not puts


def data_for(txid: int) -> bytes:
    return b"t%d|" % txid + bytes([txid % 251]) * (txid % 37)


@contextlib.contextmanager
def seed_note(seed: int) -> Iterator[None]:
    """Name the seed in whatever fails inside."""
    try:
        yield
    except BaseException as exc:
        exc.add_note(f"stream simulation seed {seed}")
        raise


_clusters: list[SimCluster] = []
"""The clusters of the run under way (torn down by run_seeded if the run fails)."""


def run_seeded(seed: int, body: Callable[[], Awaitable[None]]) -> None:
    """``run_sim(body)``; a failure names the seed, and everything the run left
    behind (held gates, clusters, tasks) is wound down on the simulated loop so that
    nothing outlives it."""
    async def main() -> None:
        _clusters.clear()
        try:
            await body()
        except BaseException:
            await _teardown()
            raise
        finally:
            await _cancel_leftovers()

    with seed_note(seed):
        try:
            run_sim(main)
        finally:
            # Collect what the run left behind now, not while pytest reports.
            gc.collect()


async def _teardown() -> None:
    for c in _clusters:
        for bk in c.clients:
            store = bk.meta
            if isinstance(store, TxnGateStore):
                for gate in (store.gate, store.txn_gate):
                    if gate is not None:
                        gate.set()
        c.net.heal_all()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(c.stop(), 30)
    _clusters.clear()


async def _cancel_leftovers() -> None:
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not me]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=10)


@dataclass
class Book:
    """What the writers were told."""

    acked: dict[int, Position] = field(default_factory=dict)
    """txid -> the position its write resolved to."""
    failed: dict[int, BaseException] = field(default_factory=dict)
    txids: Iterator[int] = field(default_factory=itertools.count)


async def pump(w: StreamWriter, book: Book, rng: random.Random,
               pause_s: tuple[float, float] = (0.0, 0.05)) -> BaseException:
    """Pipelined batches of 1-8 records with increasing txids, sometimes flushed,
    until the writer fails; returns its error."""
    while True:
        batch: list[tuple[int, asyncio.Future[Position]]] = []
        try:
            for _ in range(rng.randint(1, 8)):
                t = next(book.txids)
                batch.append((t, w.write_nowait(data_for(t), txid=t)))
        except BKError as exc:
            error: BaseException | None = exc
        else:
            error = None
        if error is None and rng.random() < 0.2:
            try:
                await w.flush()  # every record written so far is durable after it
            except BKError as exc:
                error = exc
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                error = AssertionError("flush() raised CancelledError, but nobody had "
                                       "cancelled its caller")
            else:
                assert all(f.done() for _, f in batch), "flush returned before the records"
        results = await asyncio.gather(*(f for _, f in batch), return_exceptions=True)
        for (t, _), r in zip(batch, results, strict=True):
            if isinstance(r, Position):
                book.acked[t] = r
            else:
                assert isinstance(r, BaseException)
                book.failed[t] = r
                error = error or r
        if error is not None:
            return error
        await asyncio.sleep(rng.uniform(*pause_s))


async def new_cluster(seed: int, bookies: int = 5, **ns_defaults: Any) -> tuple[SimCluster, Namespace]:
    c = SimCluster(seed, bookies)
    _clusters.append(c)
    await c.start()
    admin = stream_client(c, "admin")
    defaults: dict[str, Any] = dict(ensemble_size=3, write_quorum=3, ack_quorum=2)
    defaults.update(ns_defaults)
    ns = await admin.namespace(NS, create=True, **defaults)
    await ns.create_stream(STREAM)
    return c, ns


async def namespace_of(c: SimCluster, client_name: str) -> Namespace:
    return await stream_client(c, client_name).namespace(NS)


async def open_writer(ns: Namespace, attempts: int = 40, **options: Any) -> StreamWriter:
    """Take the stream over, trying again while faults make the recovery of its open
    segment impossible for now (a bookie down: "retry later").  Losing the opening
    race twenty times over (WriterFencedError) is not retried."""
    for attempt in range(attempts):
        try:
            return await ns.open_writer(STREAM, **options)
        except WriterFencedError:
            raise
        except BKError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def read_back(c: SimCluster, name: str = "final-reader") -> tuple[list[StreamRecord], StreamInfo]:
    """Every record of the stream from EARLIEST, by a fresh client, once no segment is
    open; then nothing more comes."""
    ns = await namespace_of(c, name)
    info = await ns.stream_info(STREAM)
    assert all(s.state == "completed" for s in info.segments), info.segments
    total = info.segments[-1].start_sequence + info.segments[-1].records if info.segments else 0
    records: list[StreamRecord] = []
    async with await ns.open_reader(STREAM, Position.EARLIEST) as reader:
        while len(records) < total:
            records.extend(await asyncio.wait_for(reader.read_batch(500, wait_s=5), 60))
        assert len(records) == total, f"read {len(records)} records, the segments say {total}"
        assert await reader.read_batch(10, wait_s=3) == [], "records past the last segment's end"
    return records, info


async def check_start_positions(c: SimCluster, records: list[StreamRecord],
                                rng: random.Random, samples: int = 6) -> None:
    """Readers opened at a record's position, or at a txid (one present, or one that
    no record has), start at the right record."""
    if not records:
        return
    ns = await namespace_of(c, "positioned-reader")
    txids = [r.txid for r in records]
    for _ in range(samples):
        i = rng.randrange(len(records))
        want = records[i]
        async with await ns.open_reader(STREAM, want.position) as r:
            assert await asyncio.wait_for(r.read_next(), 30) == want
        async with await ns.open_reader(STREAM, txid=want.txid) as r:
            assert await asyncio.wait_for(r.read_next(), 30) == want, f"txid={want.txid}"
        gap = next((t + 1 for t, u in zip(txids[i:], txids[i + 1:], strict=False)
                    if u > t + 1), None)
        if gap is not None:  # a txid no record has: the first record after it
            after = next(rec for rec in records if rec.txid > gap)
            async with await ns.open_reader(STREAM, txid=gap) as r:
                assert await asyncio.wait_for(r.read_next(), 30) == after, f"txid={gap}"


def check_segments(info: StreamInfo) -> None:
    segs = info.segments
    assert [s.seq for s in segs] == list(range(1, len(segs) + 1)), \
        f"segment numbers not contiguous from 1: {[s.seq for s in segs]}"
    open_ = [s.seq for s in segs if s.state != "completed"]
    assert len(open_) <= 1 and (not open_ or open_[0] == segs[-1].seq), \
        f"open segments {open_} of {[s.seq for s in segs]}"
    for prev, seg in itertools.pairwise(segs):
        assert seg.start_sequence == prev.start_sequence + prev.records, \
            f"segment {seg.seq} starts at {seg.start_sequence}, segment {prev.seq} " \
            f"started at {prev.start_sequence} with {prev.records} records"
    if segs:
        assert segs[0].start_sequence == 0


def check_stream(records: list[StreamRecord], info: StreamInfo, book: Book) -> None:
    """Invariant 7 on the read-back (see the module docstring)."""
    check_segments(info)
    txids = [r.txid for r in records]
    assert all(a < b for a, b in itertools.pairwise(txids)), \
        f"txids not strictly increasing: {first_disorder(txids)}"
    positions = [r.position for r in records]
    assert all(a < b for a, b in itertools.pairwise(positions)), \
        f"positions not strictly increasing: {first_disorder(positions)}"
    for r in records:
        assert r.stream == STREAM and r.data == data_for(r.txid), r
    where = {r.txid: r.position for r in records}
    missing = sorted(set(book.acked) - set(where))
    assert not missing, f"{len(missing)} acknowledged records lost, first {missing[:10]}"
    moved = [(t, p, where[t]) for t, p in sorted(book.acked.items()) if where[t] != p]
    assert not moved, f"records read elsewhere than acknowledged (txid, acked, read): {moved[:5]}"
    # Each segment describes what is in it.
    by_seg: dict[int, list[StreamRecord]] = {}
    for r in records:
        by_seg.setdefault(r.position.segment, []).append(r)
    assert set(by_seg) <= {s.seq for s in info.segments}
    seqno = 0
    for seg in info.segments:
        recs = by_seg.get(seg.seq, [])
        assert seg.records == len(recs), f"segment {seg.seq}: says {seg.records}, has {len(recs)}"
        assert seg.start_sequence == seqno
        seqno += len(recs)
        if recs:
            assert (seg.first_txid, seg.last_txid) == (recs[0].txid, recs[-1].txid), seg
            assert seg.last_position == recs[-1].position, seg
            assert recs[0].position == Position(seg.seq, 0, 0), seg
        elif seg.state == "completed":
            assert seg.last_position is None, seg


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> Any:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def first_disorder(xs: Sequence[Any]) -> Any:
    return next(((i, a, b) for i, (a, b) in enumerate(itertools.pairwise(xs)) if not a < b), None)


async def wait_all(tasks: Sequence[asyncio.Task[Any]], timeout_s: float, what: str) -> None:
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    assert not pending, f"{len(pending)} {what} still running after {timeout_s}s (virtual)"


# --------------------------------------------------------------------------- faults


class Faults:
    """One fault at a time, until stopped: a bookie crashes (maybe tearing its last
    write) and restarts, or the current writer is cut off from one bookie and healed."""

    def __init__(self, c: SimCluster, rng: random.Random, kinds: Sequence[str],
                 writer_name: Callable[[], str]) -> None:
        self.c = c
        self.rng = rng
        self.kinds = kinds
        self.writer_name = writer_name
        self.count = {k: 0 for k in kinds}
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        c, rng = self.c, self.rng
        while not self._stop.is_set():
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            victim = rng.choice(c.bookies)
            kind = self.kinds[sum(self.count.values()) % len(self.kinds)]
            self.count[kind] += 1
            if kind == "crash":
                await victim.crash(torn=rng.random() < 0.5)
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                await victim.restart()
            else:
                name = self.writer_name()
                c.net.partition(name, victim.id)
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                c.net.heal(name, victim.id)

    async def stop(self) -> None:
        self._stop.set()
        await self._task
        self.c.net.heal_all()


# --------------------------------------------------------------------------- randomized runs


@dataclass
class Outcome:
    book: Book
    errors: list[BaseException]
    """What each writer that was taken over ended with, oldest first."""
    killed: list[int]
    """The writers (indexes in ``errors``) that died (abort) instead."""
    records: list[StreamRecord]
    info: StreamInfo
    tailed: list[StreamRecord] | None
    faults: dict[str, int]


async def workload(seed: int, *, rounds: int, rolling_entries: int, fault_kinds: Sequence[str],
                   tail: bool, kill_p: float = 0.2) -> Outcome:
    """``rounds`` takeovers, each by a new client while the previous writer pumps
    records (or after it died: ``kill_p``), under faults; then a final takeover that
    closes the stream's last segment, and the read-back."""
    rng = random.Random(seed)
    e, qw, qa = rng.choice(SHAPES)
    c, ns = await new_cluster(seed, rolling_entries=rolling_entries, ensemble_size=e,
                              write_quorum=qw, ack_quorum=qa)
    book = Book()
    current = ["w0"]
    faults = Faults(c, rng, fault_kinds, lambda: current[0])
    tailed: list[StreamRecord] = []
    tail_error: list[BaseException] = []

    async def tail_reader() -> None:
        rns = await namespace_of(c, "tail")
        async with await rns.open_reader(STREAM, Position.EARLIEST) as reader:
            while True:
                try:
                    tailed.append(await reader.read_next())
                except BKError as exc:
                    tail_error.append(exc)
                    return

    tail_task = asyncio.create_task(tail_reader()) if tail else None
    pumps: list[asyncio.Task[BaseException]] = []
    writers: list[StreamWriter] = []
    killed: list[int] = []
    for r in range(rounds):
        if writers and rng.random() < kill_p:  # the writer dies before it is taken over
            killed.append(r - 1)
            await writers[-1].abort()
        current[0] = f"w{r}"
        options = rng.choice([{}, {"batch_bytes_max": 64}])  # 64: few records an entry
        w = await open_writer(await namespace_of(c, current[0]), **options)
        writers.append(w)
        pumps.append(asyncio.create_task(pump(w, book, rng)))
        await asyncio.sleep(rng.uniform(0.5, 2.5))
    await faults.stop()
    for b in c.bookies:
        if not b.up:
            await b.restart()
    final = await open_writer(await namespace_of(c, "final"))
    await wait_all(pumps, 60, "writers that were taken over")
    await final.close()
    records, info = await read_back(c)
    await check_start_positions(c, records, rng)
    if tail_task is not None:
        for _ in range(600):
            if len(tailed) >= len(records) or tail_error:
                break
            await asyncio.sleep(0.1)
        tail_task.cancel()
        await asyncio.wait([tail_task])
        assert not tail_error, f"the tailing reader failed: {tail_error[0]!r}"
    out = Outcome(book, [p.result() for p in pumps], killed, records, info,
                  tailed if tail else None, dict(faults.count))
    await c.stop()
    return out


def check_outcome(out: Outcome, *, min_acked: int = 200) -> None:
    check_stream(out.records, out.info, out.book)
    wrong = [(i, e) for i, e in enumerate(out.errors)
             if not isinstance(e, BKError if i in out.killed else WriterFencedError)]
    assert not wrong, ("taken-over writers that did not get WriterFencedError (or, if "
                       f"they died, another BKError): {wrong}")
    assert len(out.book.acked) >= min_acked, f"only {len(out.book.acked)} records acknowledged"
    if out.tailed is not None:
        assert out.tailed == out.records, (
            f"the tailing reader saw {len(out.tailed)} records, the fresh one "
            f"{len(out.records)}; first difference at "
            f"{first_difference(out.tailed, out.records)}")


@pytest.mark.parametrize("seed", SEEDS)
def test_takeovers_with_bookie_crashes(seed: int) -> None:
    """Eight takeovers of a pipelining writer while bookies crash and restart."""
    async def body() -> None:
        out = await workload(seed, rounds=8, rolling_entries=0, fault_kinds=["crash"],
                             tail=False)
        check_outcome(out)
        assert out.faults["crash"] >= 3, out.faults
        assert len(out.info.segments) == 9  # one per writer, and the final one

    run_seeded(seed, body)


@pytest.mark.parametrize("seed", SEEDS)
def test_rolls_and_takeovers_with_crashes_and_partitions(seed: int) -> None:
    """A writer rolling every few records (``rolling_entries``) taken over five times,
    with bookie crashes and the writer cut off from bookies during rolls."""
    async def body() -> None:
        out = await workload(seed, rounds=5, rolling_entries=12,
                             fault_kinds=["crash", "partition"], tail=False)
        check_outcome(out)
        assert len(out.info.segments) >= 20, f"too few rolls: {len(out.info.segments)} segments"
        assert all(out.faults.values()), out.faults

    run_seeded(seed, body)


@pytest.mark.parametrize("seed", SEEDS + [s for s in TAIL_SEEDS_THAT_FOUND_BUGS if s not in SEEDS])
def test_tailing_reader_during_takeovers_and_rolls(seed: int) -> None:
    """A reader tailing from EARLIEST all along sees each acknowledged record once, in
    order: exactly what a fresh reader sees at the end."""
    async def body() -> None:
        out = await workload(seed, rounds=5, rolling_entries=20,
                             fault_kinds=["crash", "partition"], tail=True)
        check_outcome(out)

    run_seeded(seed, body)


# --------------------------------------------------------------------------- two openers


@pytest.mark.parametrize("seed", SEEDS)
def test_two_openers_race(seed: int) -> None:
    """Two clients open a writer at the same virtual instant (or one a few
    milliseconds after the other, so that it lands somewhere in the first one's
    recovery and commit) while a third writes: exactly one of them ends up the
    stream's writer; the other (and the third) get WriterFencedError; nothing
    acknowledged is lost."""
    async def body() -> None:
        rng = random.Random(seed)
        c, _ = await new_cluster(seed, rolling_entries=rng.choice([0, 10]))
        book = Book()
        w0 = await (await namespace_of(c, "w0")).open_writer(STREAM)
        p0 = asyncio.create_task(pump(w0, book, rng))
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        na, nb = await namespace_of(c, "a"), await namespace_of(c, "b")
        offset_s = rng.choice([0.0, 0.0, rng.uniform(0, 0.01), rng.uniform(0, 0.05)])

        async def later() -> StreamWriter:
            await asyncio.sleep(offset_s)
            return await nb.open_writer(STREAM)

        wa, wb = await asyncio.gather(na.open_writer(STREAM), later())
        results: dict[str, Any] = {}
        for name, w in (("a", wa), ("b", wb)):
            t = next(book.txids)
            try:
                book.acked[t] = await w.write(data_for(t), txid=t)
                results[name] = w
            except WriterFencedError as exc:
                results[name] = exc
        winners = [n for n, r in results.items() if isinstance(r, StreamWriter)]
        assert len(winners) == 1, f"writers that could write: {winners} ({results})"
        winner = results[winners[0]]
        assert isinstance(await asyncio.wait_for(p0, 30), WriterFencedError)
        info = await na.stream_info(STREAM)
        assert info.segments[-1].state == "open" and info.segments[-1].seq == winner.segment
        p = asyncio.create_task(pump(winner, book, rng))
        await asyncio.sleep(0.5)
        final = await (await namespace_of(c, "final")).open_writer(STREAM)
        assert isinstance(await asyncio.wait_for(p, 30), WriterFencedError)
        await final.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(seed, body)


class CountingRandom(random.Random):
    """A random generator that counts the draws of ``random()`` (back-off jitter)."""

    draws = 0

    def random(self) -> float:
        self.draws += 1
        return super().random()


async def openers_race(seed: int, openers: int = 4) -> list[Any]:
    """Several clients open a writer at the same virtual instant while another writes:
    those that lose the race back off (jitter from their client's generator) and
    open again, each fencing the one before.  Returns what happened, with virtual
    times: the trace that the same seed must reproduce."""
    rng = random.Random(seed)
    c, _ = await new_cluster(seed, rolling_entries=rng.choice([0, 10]))
    loop = asyncio.get_running_loop()
    book = Book()
    w0 = await (await namespace_of(c, "w0")).open_writer(STREAM)
    p0 = asyncio.create_task(pump(w0, book, rng))
    await asyncio.sleep(rng.uniform(0.2, 1.0))
    rngs = [CountingRandom(c.rng.getrandbits(64)) for _ in range(openers)]
    spaces = [await stream_client(c, f"o{i}", rng=r).namespace(NS) for i, r in enumerate(rngs)]

    async def open_one(ns: Namespace) -> tuple[StreamWriter, float]:
        w = await ns.open_writer(STREAM)
        return w, loop.time()

    opened = await asyncio.gather(*(open_one(ns) for ns in spaces))
    assert sum(r.draws for r in rngs) > 0, "no opener lost the race and backed off"
    outcome: list[Any] = []
    for w, at_s in opened:
        t = next(book.txids)
        try:
            book.acked[t] = await w.write(data_for(t), txid=t)
            outcome.append((w.segment, at_s, "wrote", book.acked[t]))
        except WriterFencedError:
            outcome.append((w.segment, at_s, "fenced"))
    assert [o[2] for o in outcome].count("wrote") == 1, outcome
    assert isinstance(await asyncio.wait_for(p0, 30), WriterFencedError)
    final = await (await namespace_of(c, "final")).open_writer(STREAM)
    await final.close()
    records, info = await read_back(c)
    check_stream(records, info, book)
    await c.stop()
    segments = [(s.seq, s.ledger_id, s.state, s.records, s.start_sequence, s.first_txid,
                 s.last_txid, s.last_position) for s in info.segments]
    return [outcome, [r.draws for r in rngs], sorted(book.acked.items()), segments,
            [(r.position, r.txid, r.data) for r in records], loop.time()]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_seed_replays_the_same_run(seed: int) -> None:
    """The same seed twice gives the same run, to the virtual microsecond, also where
    writers race to open a stream and back off, whatever state the process's global
    random generator is in."""
    def run() -> list[Any]:
        trace: list[Any] = []

        async def body() -> None:
            trace.extend(await openers_race(seed))

        run_seeded(seed, body)
        return trace

    random.seed(seed)
    first = run()
    random.seed(seed + 1)  # the global generator's state must not matter
    second = run()
    assert first == second


def test_two_openers_race_with_the_first_commit_held() -> None:
    """Both openers fence the same segment; the commit of one is held until the other
    has committed, so it loses the transaction, tries again, and fences the winner."""
    async def body() -> None:
        c, _ = await new_cluster(11)
        book = Book()
        w0 = await (await namespace_of(c, "w0")).open_writer(STREAM)
        p0 = asyncio.create_task(pump(w0, book, random.Random(11)))
        await asyncio.sleep(0.5)
        na, nb = await namespace_of(c, "a"), await namespace_of(c, "b")
        sa = store_of(na)
        sa.txn_gate = asyncio.Event()
        sa.txn_gate_if = is_roll
        ta = asyncio.create_task(na.open_writer(STREAM))
        await asyncio.wait_for(sa.txn_waiting.wait(), 30)  # a fenced segment 1, holds
        wb = await nb.open_writer(STREAM)                   # b fences it too and commits
        assert wb.segment == 2
        sa.txn_gate_if = lambda puts: False
        sa.txn_gate.set()
        wa = await ta                                       # a lost, retried: segment 3
        assert wa.segment == 3
        assert isinstance(await asyncio.wait_for(p0, 30), WriterFencedError)
        with pytest.raises(WriterFencedError):
            await wb.write(b"late")
        t = next(book.txids)
        book.acked[t] = await wa.write(data_for(t), txid=t)
        await wa.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        assert [s.records for s in info.segments][1] == 0
        await c.stop()

    run_seeded(11, body)


# --------------------------------------------------------------------------- takeover vs roll


async def writer_at_roll(seed: int, rolling_entries: int = 10) -> tuple[
        SimCluster, Book, StreamWriter, Namespace, list[asyncio.Future[Position]]]:
    """A writer whose next roll's commit is held at the gate, with records written
    meanwhile waiting in its buffer."""
    c, _ = await new_cluster(seed, rolling_entries=rolling_entries)
    book = Book()
    wns = await namespace_of(c, "w")
    w = await wns.open_writer(STREAM)
    store = store_of(wns)
    store.txn_gate = asyncio.Event()
    store.txn_gate_if = is_roll
    first = []
    for _ in range(rolling_entries):  # one entry: the roll starts after it
        t = next(book.txids)
        first.append((t, w.write_nowait(data_for(t), txid=t)))
    for t, f in first:
        book.acked[t] = await f
    await asyncio.wait_for(store.txn_waiting.wait(), 30)
    held = []
    for _ in range(5):
        t = next(book.txids)
        held.append(w.write_nowait(data_for(t), txid=t))
    await asyncio.sleep(1)
    assert not any(f.done() for f in held), "records wait while the roll commits"
    return c, book, w, wns, held


def test_takeover_wins_while_the_roll_commit_is_held() -> None:
    async def body() -> None:
        c, book, w, wns, held = await writer_at_roll(21)
        o = await (await namespace_of(c, "o")).open_writer(STREAM)
        assert o.segment == 2
        store_of(wns).txn_gate.set()  # type: ignore[union-attr]
        for f in held:
            with pytest.raises(WriterFencedError):
                await f
        with pytest.raises(WriterFencedError):
            w.write_nowait(b"more")
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        assert [s.records for s in info.segments] == [10, 1]
        # The writer's unused ledger for its lost segment is gone.
        ids = [s.ledger_id for s in info.segments]
        lost = [md.ledger_id for md in c.history
                if md.ledger_id not in ids and md.state is LedgerState.OPEN]
        for lid in lost:
            with pytest.raises(BKError):
                await wns.bk.ledger_metadata(lid)
        await c.stop()

    run_seeded(21, body)


def test_roll_commit_lands_before_the_opener_claims_the_stream() -> None:
    """The opener is held at its first transaction (claiming the stream: the writer
    epoch); the roll commits first and the writer writes to segment 2; the opener's
    claim then fails, it tries again and fences segment 2, keeping what the writer
    got acknowledged there."""
    async def body() -> None:
        c, book, w, wns, held = await writer_at_roll(22)
        ons = await namespace_of(c, "o")
        so = store_of(ons)
        so.txn_gate = asyncio.Event()
        so.txn_gate_if = is_claim
        topen = asyncio.create_task(ons.open_writer(STREAM))
        await asyncio.wait_for(so.txn_waiting.wait(), 30)
        store_of(wns).txn_gate.set()  # type: ignore[union-attr]
        for t, f in zip(range(10, 15), held, strict=True):
            book.acked[t] = await f
            assert book.acked[t].segment == 2
        so.txn_gate_if = lambda puts: False
        so.txn_gate.set()
        o = await topen
        assert o.segment == 3
        with pytest.raises(WriterFencedError):
            await w.write(b"late")
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        assert [s.records for s in info.segments] == [10, 5, 1]
        await c.stop()

    run_seeded(22, body)


def test_roll_fails_once_the_opener_has_claimed_the_stream() -> None:
    """Both the roll's commit and the opener's (after its claim and the recovery of
    segment 1) are held; the roll's is released first and fails: the writer is
    fenced, its buffered records fail, and its unused ledger is removed."""
    async def body() -> None:
        c, book, w, wns, held = await writer_at_roll(25)
        ons = await namespace_of(c, "o")
        so = store_of(ons)
        so.txn_gate = asyncio.Event()
        so.txn_gate_if = is_roll
        topen = asyncio.create_task(ons.open_writer(STREAM))
        await asyncio.wait_for(so.txn_waiting.wait(), 30)
        store_of(wns).txn_gate.set()  # type: ignore[union-attr]
        for f in held:
            with pytest.raises(WriterFencedError):
                await f
        so.txn_gate.set()
        o = await topen
        assert o.segment == 2
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        assert [s.records for s in info.segments] == [10, 1]
        await c.stop()

    run_seeded(25, body)


def test_takeover_while_the_roll_closes_its_ledger() -> None:
    """The rolling writer is held at its ledger's close; the opener recovers (fences and
    closes) that ledger and commits.  The writer then finds its segment taken."""
    async def body() -> None:
        c, _ = await new_cluster(23, rolling_entries=10)
        book = Book()
        wns = await namespace_of(c, "w")
        w = await wns.open_writer(STREAM)
        store = store_of(wns)
        store.gate = asyncio.Event()
        store.gate_if = lambda md: md.state is LedgerState.CLOSED
        futs = [(t, w.write_nowait(data_for(t), txid=t))
                for t in (next(book.txids) for _ in range(10))]
        for t, f in futs:
            book.acked[t] = await f
        await asyncio.wait_for(store.waiting.wait(), 30)
        held = [w.write_nowait(data_for(t), txid=t) for t in (next(book.txids) for _ in range(3))]
        o = await (await namespace_of(c, "o")).open_writer(STREAM)
        assert o.segment == 2
        store.gate.set()
        for f in held:
            with pytest.raises(WriterFencedError):
                await f
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        assert [s.records for s in info.segments] == [10, 1]
        await c.stop()

    run_seeded(23, body)


def test_roll_with_its_close_released_before_the_takeover_commits() -> None:
    """The opener recovered the segment while the writer was held at its close, and is
    itself held at its commit; the writer's close then finds the ledger closed at its
    own last entry and its roll commits first.  The opener tries again and fences the
    writer's new segment; what the writer got acknowledged there stays."""
    async def body() -> None:
        c, _ = await new_cluster(24, rolling_entries=10)
        book = Book()
        wns = await namespace_of(c, "w")
        w = await wns.open_writer(STREAM)
        store = store_of(wns)
        store.gate = asyncio.Event()
        store.gate_if = lambda md: md.state is LedgerState.CLOSED
        futs = [(t, w.write_nowait(data_for(t), txid=t))
                for t in (next(book.txids) for _ in range(10))]
        for t, f in futs:
            book.acked[t] = await f
        await asyncio.wait_for(store.waiting.wait(), 30)
        held = [(t, w.write_nowait(data_for(t), txid=t))
                for t in (next(book.txids) for _ in range(3))]
        ons = await namespace_of(c, "o")
        so = store_of(ons)
        so.txn_gate = asyncio.Event()
        so.txn_gate_if = is_roll
        topen = asyncio.create_task(ons.open_writer(STREAM))
        await asyncio.wait_for(so.txn_waiting.wait(), 30)
        store.gate.set()
        outcome = await asyncio.gather(*(f for _, f in held), return_exceptions=True)
        for (t, _), r in zip(held, outcome, strict=True):
            if isinstance(r, Position):
                book.acked[t] = r
        so.txn_gate_if = lambda puts: False
        so.txn_gate.set()
        o = await topen
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        await o.close()
        with pytest.raises(WriterFencedError):
            await w.write(b"late")
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(24, body)


# --------------------------------------------------------------------------- fenced writer


def test_old_writer_learning_of_the_takeover_in_an_ensemble_change_is_fenced() -> None:
    """The old writer's ledger loses a bookie; its ensemble change is held at the
    metadata CAS while another client takes the stream over (recovery closes the
    ledger).  The CAS then meets a CLOSED ledger: the old writer's records, and its
    next write, must fail with WriterFencedError like any taken-over writer's."""
    async def body() -> None:
        c, _ = await new_cluster(31)
        book = Book()
        wns = await namespace_of(c, "w")
        w = await wns.open_writer(STREAM)
        for t in (next(book.txids) for _ in range(5)):
            book.acked[t] = await w.write(data_for(t), txid=t)
        store = store_of(wns)
        store.gate = asyncio.Event()
        store.gate_if = lambda md: md.state is LedgerState.OPEN  # the ensemble change
        lid = (await wns.stream_info(STREAM)).segments[-1].ledger_id
        md = await wns.bk.ledger_metadata(lid)
        await c.bookie(md.ensembles[-1][1][0]).crash(torn=False)
        pending = [(t, w.write_nowait(data_for(t), txid=t))
                   for t in (next(book.txids) for _ in range(5))]
        await asyncio.wait_for(store.waiting.wait(), 30)
        o = await (await namespace_of(c, "o")).open_writer(STREAM)
        store.gate.set()
        outcome = await asyncio.gather(*(f for _, f in pending), return_exceptions=True)
        errors = [r for r in outcome if not isinstance(r, Position)]
        assert errors and all(isinstance(r, WriterFencedError) for r in errors), outcome
        with pytest.raises(WriterFencedError):
            await w.write(b"late")
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(31, body)


# --------------------------------------------------------------------------- end of stream


def single_completion(puts: list[dict[str, Any]]) -> bool:
    """A transaction completing one segment and starting none (close, end, or a
    takeover that found the stream ended)."""
    return [p["state"] for p in puts] == ["completed"]


async def end_stream_held_at_commit(c: SimCluster, records: int
                                    ) -> tuple[TxnGateStore, asyncio.Task[int]]:
    """A writer (client "w") writes ``records`` records (txids 0..records-1) and ends the
    stream: its end-of-stream entry is durable and its ledger closed, and it is held at
    the commit recording that.  Returns its store (``txn_gate.set()`` lets the commit
    go) and the task of ``mark_end_of_stream`` (cancel it: the writer dies)."""
    wns = await namespace_of(c, "w")
    w = await wns.open_writer(STREAM)
    for t in range(records):
        await w.write(data_for(t), txid=t)
    sw = store_of(wns)
    sw.txn_gate = asyncio.Event()
    sw.txn_gate_if = single_completion
    ending = asyncio.create_task(w.mark_end_of_stream())
    await asyncio.wait_for(sw.txn_waiting.wait(), 30)
    return sw, ending


def test_opening_a_writer_while_the_stream_is_being_ended() -> None:
    """The writer ends the stream (its end-of-stream entry is durable, its ledger
    closed) and is held at its commit; an opener finds the end-of-stream entry while
    recovering.  The opener gets EndOfStreamError; whatever the writer is told, the
    stream is ended, takes no writer, and readers get every record, then the end."""
    async def body() -> None:
        c, _ = await new_cluster(41)
        sw, ending = await end_stream_held_at_commit(c, 7)
        ons = await namespace_of(c, "o")
        with pytest.raises(EndOfStreamError):
            await ons.open_writer(STREAM)
        sw.txn_gate.set()
        await asyncio.wait([ending])
        assert ending.exception() is None or isinstance(ending.exception(), WriterFencedError)
        with pytest.raises(EndOfStreamError):
            await ons.open_writer(STREAM)
        rns = await namespace_of(c, "r")
        got = [rec async for rec in rns.read(STREAM, Position.EARLIEST)]
        assert [r.txid for r in got] == list(range(7))
        assert (await rns.stream_info(STREAM)).ended
        await c.stop()

    run_seeded(41, body)


def test_two_openers_finding_the_end_of_stream_entry_both_get_end_of_stream() -> None:
    """The writer dies after its end-of-stream entry is durable, before its commit.
    Two openers recover the segment and find the end; the first is held at the
    commit that records it, the second records it first.  The first's commit then
    conflicts: it must still answer EndOfStreamError (the stream is ended), not leak
    the metadata conflict."""
    async def body() -> None:
        c, _ = await new_cluster(43)
        sw, ending = await end_stream_held_at_commit(c, 5)
        ending.cancel()  # the writer dies
        await asyncio.wait([ending])
        na, nb = await namespace_of(c, "a"), await namespace_of(c, "b")
        sa = store_of(na)
        sa.txn_gate = asyncio.Event()
        sa.txn_gate_if = single_completion
        opening = asyncio.create_task(na.open_writer(STREAM))
        await asyncio.wait_for(sa.txn_waiting.wait(), 30)  # a found the end, holds
        with pytest.raises(EndOfStreamError):
            await nb.open_writer(STREAM)
        sa.txn_gate.set()
        await asyncio.wait([opening])
        assert isinstance(opening.exception(), EndOfStreamError), repr(opening.exception())
        info = await na.stream_info(STREAM)
        assert info.ended and [s.records for s in info.segments] == [5]
        await c.stop()

    run_seeded(43, body)


def test_a_takeover_that_finds_the_end_of_stream_entry_ends_the_stream() -> None:
    """The writer dies right after its end-of-stream entry is durable (before its
    commit): the next opener recovers the segment, sees the end, records it and
    refuses with EndOfStreamError; readers stop after the last record."""
    async def body() -> None:
        c, _ = await new_cluster(42)
        sw, ending = await end_stream_held_at_commit(c, 4)
        ending.cancel()  # the writer dies
        await asyncio.wait([ending])
        ons = await namespace_of(c, "o")
        with pytest.raises(EndOfStreamError):
            await ons.open_writer(STREAM)
        info = await ons.stream_info(STREAM)
        assert info.ended and [s.state for s in info.segments] == ["completed"]
        assert info.segments[0].records == 4 and info.segments[0].last_txid == 3
        got = [rec async for rec in ons.read(STREAM, Position.EARLIEST)]
        assert [r.txid for r in got] == list(range(4))
        await c.stop()

    run_seeded(42, body)


# --------------------------------------------------------------------------- writer failures


def test_a_record_written_as_the_writer_fails_is_failed_not_orphaned() -> None:
    """A bookie has answered FENCED: the writer's ledger handle has failed, and the
    writer hears of it one loop turn later (the ledger futures' callbacks).  A record
    written in that turn that makes the buffer overflow ``batch_bytes_max`` sends the
    buffered records first; that send fails the writer.  The new record must fail
    too (or be refused), not wait forever in the buffer of a failed writer.
    (Found by the randomized runs with ``batch_bytes_max=64``.)"""
    async def body() -> None:
        c, _ = await new_cluster(51)
        book = Book()
        w = await (await namespace_of(c, "w")).open_writer(STREAM, batch_bytes_max=64)
        for t in (next(book.txids) for _ in range(3)):
            book.acked[t] = await w.write(data_for(t), txid=t)
        o = await (await namespace_of(c, "o")).open_writer(STREAM)
        # What the FENCED answer does to the handle (LedgerHandle._on_add_response);
        # the writer's own callbacks have not run yet.
        w._lh._fail(LedgerFencedError("sim: the bookie answered FENCED"))
        f1 = w.write_nowait(b"x" * 40, txid=100)
        try:
            f2 = w.write_nowait(b"y" * 40, txid=101)  # overflows: f1 leaves, and fails
        except WriterFencedError:
            f2 = None
        with pytest.raises(WriterFencedError):
            await f1
        if f2 is not None:
            done, _ = await asyncio.wait([f2], timeout=30)
            assert done, "a record of the failed writer waits forever"
            assert isinstance(f2.exception(), WriterFencedError), f2.exception()
        with pytest.raises(WriterFencedError):
            w.write_nowait(b"z")
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(51, body)


def test_abort_during_a_roll_fails_flush_and_close_without_cancelling_them() -> None:
    """``abort()`` while a roll is under way (its commit held) cancels the roll; a
    ``flush()`` and a ``close()`` waiting for that roll in other tasks must fail with
    a BKError, not raise CancelledError into callers nobody cancelled.
    (Found by the randomized runs: a killed writer's flush.)"""
    async def body() -> None:
        c, book, w, wns, held = await writer_at_roll(52)
        flushing = asyncio.create_task(w.flush())
        await asyncio.sleep(0.5)
        closing = asyncio.create_task(w.close())
        await asyncio.sleep(0.5)
        assert not flushing.done() and not closing.done()
        await w.abort()
        await asyncio.wait([flushing, closing], timeout=30)
        for name, task in (("flush", flushing), ("close", closing)):
            assert task.done(), f"{name}() still waits after abort()"
            assert not task.cancelled(), f"{name}() raised CancelledError after abort()"
            assert isinstance(task.exception(), BKError), (name, task.exception())
        for f in held:
            assert f.done() and isinstance(f.exception(), BKError)
        store_of(wns).txn_gate.set()  # type: ignore[union-attr]
        o = await (await namespace_of(c, "o")).open_writer(STREAM)
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(52, body)


# --------------------------------------------------------------------------- readers


def test_reader_at_latest_sees_only_later_records_across_a_takeover() -> None:
    """A reader opened at LATEST while the writer is idle sees exactly the records
    written after; one opened while a takeover has closed the segment's ledger but
    not yet committed the change starts at the next segment: it sees only the new
    writer's records."""
    async def body() -> None:
        c, _ = await new_cluster(61)
        book = Book()
        w = await (await namespace_of(c, "w")).open_writer(STREAM)
        for t in (next(book.txids) for _ in range(10)):
            book.acked[t] = await w.write(data_for(t), txid=t)
        await asyncio.sleep(1)  # the explicit LAC has reached the bookies
        rns = await namespace_of(c, "r")
        r1 = await rns.open_reader(STREAM, Position.LATEST)
        later = [next(book.txids) for _ in range(5)]
        for t in later:
            book.acked[t] = await w.write(data_for(t), txid=t)
        got = [await asyncio.wait_for(r1.read_next(), 30) for _ in later]
        assert [r.txid for r in got] == later
        ons = await namespace_of(c, "o")
        so = store_of(ons)
        so.txn_gate = asyncio.Event()
        so.txn_gate_if = is_roll
        opening = asyncio.create_task(ons.open_writer(STREAM))
        await asyncio.wait_for(so.txn_waiting.wait(), 30)  # segment 1's ledger is closed
        r2 = await rns.open_reader(STREAM, Position.LATEST)
        assert r2.start == Position(2, 0, 0), r2.start
        so.txn_gate.set()
        o = await opening
        t = next(book.txids)
        book.acked[t] = await o.write(data_for(t), txid=t)
        assert (await asyncio.wait_for(r2.read_next(), 30)).txid == t
        assert (await asyncio.wait_for(r1.read_next(), 30)).txid == t
        assert await r1.read_batch(10, wait_s=2) == [] and await r2.read_batch(10, wait_s=2) == []
        await r1.close()
        await r2.close()
        await o.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(61, body)


def test_tailing_reader_follows_an_ensemble_change_it_did_not_see() -> None:
    """The reader opened the open segment's ledger before the writer's first entry;
    the writer then replaced a bookie (b) of that first fragment (no entry had
    completed, so the fragment starting at 0 is rewritten in place).  The reader's
    view still names b: for entries whose write set is (b, c) in its view, b
    answers NO_ENTRY and c is cut off from the reader for a while.  The records are
    durable (on the replacement and on c): the reader must deliver them, not fail.
    (Found by the randomized tailing run with seed 377.)"""
    async def body() -> None:
        c, _ = await new_cluster(71, ensemble_size=3, write_quorum=2, ack_quorum=2)
        book = Book()
        rns = await namespace_of(c, "tail")
        reader = await rns.open_reader(STREAM, Position.EARLIEST)
        wns = await namespace_of(c, "w")
        w = await wns.open_writer(STREAM)
        await asyncio.sleep(2)  # the reader has opened segment 1's ledger and polls it
        lid = (await wns.stream_info(STREAM)).segments[-1].ledger_id
        a, b, cc = (await wns.bk.ledger_metadata(lid)).ensembles[0][1]
        await c.bookie(b).crash(torn=False)
        futs = [(t, w.write_nowait(data_for(t), txid=t))
                for t in (next(book.txids) for _ in range(3))]
        for t, f in futs:
            book.acked[t] = await f
        md = await wns.bk.ledger_metadata(lid)
        assert len(md.ensembles) == 1 and b not in md.ensembles[0][1], md.ensembles
        await c.bookie(b).restart()
        c.net.partition("tail", cc)  # the reader's reads to c hang (and time out)
        for t in (next(book.txids) for _ in range(6)):
            book.acked[t] = await w.write(data_for(t), txid=t)
        await asyncio.sleep(3)
        c.net.heal("tail", cc)
        got = [await asyncio.wait_for(reader.read_next(), 30) for _ in range(len(book.acked))]
        assert [r.txid for r in got] == sorted(book.acked)
        await reader.close()
        await w.close()
        records, info = await read_back(c)
        check_stream(records, info, book)
        await c.stop()

    run_seeded(71, body)
