"""Records with keys, headers and times, time seeks, and subscriptions, against a
real cluster (etcd + three bookie processes).

Time seeks are checked against a linear scan across rolls, after truncation and
on segments of the old record format; subscriptions resume after the last
persisted ack when their consumer process is SIGKILLed at random points; a
takeover under load fences the old consumer and none of its acks moves the
cursor; retention keeps what a stalled subscription has not acknowledged until
its backlog quota, then drops, counts and tells; bad input changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
from pathlib import Path

import pytest

from asyncbk.client.client import BookKeeper as LedgerClient
from asyncbk.errors import (
    InvalidAckError,
    InvalidNameError,
    NoSuchStreamError,
    NoSuchSubscriptionError,
    SubscriptionFencedError,
    TruncatedError,
)
from asyncbk.stream import Namespace, Position, StreamRecord, StreamWriter, codec
from asyncbk.stream.meta import COMPLETED, Segment
from asyncbk.stream.subscription import read_cursor
from asyncbk.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

CONSUMER = Path(__file__).with_name("subscription_consumer_proc.py")
SHAPE = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}


async def namespace(cluster: LocalCluster, name: str = "t", **defaults: object) -> Namespace:
    bk = await cluster.client()
    return await bk.namespace(name, create=True, **SHAPE, **defaults)


async def write_timed(w: StreamWriter, times: list[int | None], per_round: int = 10,
                      prefix: str = "r") -> list[Position]:
    """One record per time (None: the wall clock), ``per_round`` pipelined at a time."""
    out: list[Position] = []
    for start in range(0, len(times), per_round):
        futs = [w.write_nowait(f"{prefix}{i}".encode(), timestamp_ms=times[i])
                for i in range(start, min(len(times), start + per_round))]
        out += [await f for f in futs]
    return out


async def read_all(ns: Namespace, stream: str, n: int, **start: object) -> list[StreamRecord]:
    out: list[StreamRecord] = []
    async with await ns.open_reader(stream, **start) as r:  # type: ignore[arg-type]
        async with asyncio.timeout(60):
            while len(out) < n:
                out += await r.read_batch(n - len(out), wait_s=1.0)
    return out


def first_at_or_after(recs: list[StreamRecord], t: int) -> StreamRecord | None:
    return next((r for r in recs if r.timestamp_ms >= t), None)


async def seek_first(ns: Namespace, stream: str, t: int) -> StreamRecord | None:
    async with await ns.open_reader(stream, timestamp_ms=t) as r:
        got = await r.read_batch(1, wait_s=0.3)
    return got[0] if got else None


# ---------------------------------------------------------------------- records


async def test_records_carry_keys_headers_and_times_that_never_decrease(
        cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=7)
    await ns.create_stream("s")
    async with await ns.open_writer("s") as w:
        p0 = await w.write(b"plain")
        p1 = await w.write(b"keyed", key=b"user-42", headers={"content-type": b"json",
                                                              "empty": b""})
        p2 = await w.write(b"early", timestamp_ms=5_000)  # below the previous: raised
        futs = []
        for i in range(40):  # rounds of 4: an entry each
            futs.append(w.write_nowait(b"x%d" % i, key=b"k%d" % (i % 3) if i % 2 else None,
                                       timestamp_ms=10_000_000_000_000 + i // 4))
            if i % 4 == 3:
                await w.flush()
        assert w.last_timestamp_ms == 10_000_000_000_000 + 39 // 4
        with pytest.raises(TypeError):
            w.write_nowait(b"x", key="text")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            w.write_nowait(b"x", headers={"h": "text"})  # type: ignore[dict-item]
        with pytest.raises(ValueError):
            w.write_nowait(b"x", timestamp_ms=-1)
        with pytest.raises(ValueError):
            w.write_nowait(b"x", timestamp_ms=1 << 48)
    recs = await read_all(ns, "s", 43)
    assert [r.position for r in recs[:3]] == [p0, p1, p2]
    assert [r.position for r in recs[3:]] == [await f for f in futs]
    now_ms = cluster_now_ms()
    assert recs[0].key is None and recs[0].headers == {}
    assert now_ms - 60_000 < recs[0].timestamp_ms <= now_ms
    assert recs[1].key == b"user-42"
    assert recs[1].headers == {"content-type": b"json", "empty": b""}
    assert recs[2].timestamp_ms == recs[1].timestamp_ms  # raised to the previous record's
    stamps = [r.timestamp_ms for r in recs]
    assert stamps == sorted(stamps)
    assert [r.key for r in recs[3:]] == [b"k%d" % (i % 3) if i % 2 else None for i in range(40)]
    info = await ns.stream_info("s")
    assert len(info.segments) >= 6  # rolls every 7 records

    # A new writer (after a takeover) never goes below the stream's last time.
    async with await ns.open_writer("s") as w2:
        await w2.write(b"later", timestamp_ms=1)
    last = (await read_all(ns, "s", 44))[-1]
    assert last.data == b"later" and last.timestamp_ms == stamps[-1]


def cluster_now_ms() -> int:
    import time

    return int(time.time() * 1000)


async def test_time_seek_equals_a_linear_scan_across_rolls_and_truncation(
        cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=40)
    await ns.create_stream("s")
    rng = random.Random(7)
    base = 1_800_000_000_000
    times, t = [], base
    for _ in range(600):
        t += rng.choice([0, 0, 1, 2, 50, 1_000])
        times.append(t)
    async with await ns.open_writer("s") as w:
        await write_timed(w, times, per_round=rng.choice([1, 5, 13]))
        recs = await read_all(ns, "s", 600)
        assert len((await ns.stream_info("s")).segments) >= 15
        probes = [base - 1, base, times[-1], times[-1] + 1, *rng.sample(times, 30),
                  *(rng.randint(base, times[-1] + 5) for _ in range(30))]
        for probe in probes:
            want = first_at_or_after(recs, probe)
            got = await seek_first(ns, "s", probe)
            assert (got.position if got else None) == (want.position if want else None), probe
        async for rec in ns.read("s", timestamp_ms=times[300]):
            assert rec.position == first_at_or_after(recs, times[300]).position  # type: ignore[union-attr]
            break

        # After truncation: the same, over what is left (earlier times: its first record).
        cut = recs[250].position
        assert await ns.truncate("s", cut) > 0
        first = (await ns.stream_info("s")).first_position
        left = [r for r in recs if r.position >= first]
        for probe in [base - 1, *rng.sample(times, 25)]:
            want = first_at_or_after(left, probe)
            got = await seek_first(ns, "s", probe)
            assert (got.position if got else None) == (want.position if want else None), probe
        # Past the last record: the next record written is the first one found.
        async with await ns.open_reader("s", timestamp_ms=times[-1] + 10) as r:
            await w.write(b"new", timestamp_ms=times[-1] + 10)
            async with asyncio.timeout(20):
                assert (await r.read_next()).data == b"new"


async def test_old_format_segments_read_with_their_creation_time(cluster: LocalCluster) -> None:
    """A segment whose ledger holds record format 1 entries and whose metadata has
    no times (as older versions wrote them) reads with no keys or headers and its
    creation time, and time seeks work across it and newer segments."""
    ns = await namespace(cluster, retention_s=0.0)  # (its times are from 2023)
    await ns.create_stream("old")
    ctx = ns.context
    bk: LedgerClient = ns.bk
    lh = await bk.create_ledger(3, 2, 2)
    await lh.append(codec.encode_v1(0, [1, 2, 3], [b"a", b"b", b"c"]))
    await lh.append(codec.encode_v1(3, [4], [b"d"]))
    await lh.close()
    ctime = 1_700_000_000_000
    seg = Segment(seq=1, ledger_id=lh.id, state=COMPLETED, records=4, first_txid=1,
                  last_txid=4, last_entry=1, last_slot=0, size_bytes=4, ctime_ms=ctime,
                  completion_ms=ctime + 1000)
    sm = await ctx.md.stream(ns.name, "old")
    await ctx.md.commit(sm, put=[seg])
    async with await ns.open_writer("old") as w:
        new = await write_timed(w, [ctime + 5_000, ctime + 6_000])
    recs = await read_all(ns, "old", 6)
    assert [(r.txid, r.data, r.key, r.headers, r.timestamp_ms) for r in recs[:4]] == \
        [(1, b"a", None, {}, ctime), (2, b"b", None, {}, ctime), (3, b"c", None, {}, ctime),
         (4, b"d", None, {}, ctime)]
    assert [r.position for r in recs[4:]] == new
    assert (await seek_first(ns, "old", ctime)).position == Position(1, 0, 0)  # type: ignore[union-attr]
    assert (await seek_first(ns, "old", ctime + 1)).position == new[0]  # type: ignore[union-attr]
    assert (await seek_first(ns, "old", ctime + 5_500)).position == new[1]  # type: ignore[union-attr]


# ---------------------------------------------------------------------- subscriptions


async def test_a_subscription_resumes_after_its_last_persisted_ack(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=50, subscription_ack_interval_s=30.0)
    await ns.create_stream("s")
    async with await ns.open_writer("s") as w:
        written = await write_timed(w, [None] * 300, per_round=20)
    sub = await ns.subscribe("s", "billing", Position.EARLIEST)
    got = []
    async for rec in sub:
        got.append(rec.position)
        await sub.ack(rec.position)
        if len(got) == 120:
            break
    # Nothing is persisted before the interval, a flush or a close.
    assert (await read_cursor(ns.context, "s", "billing")).position == written[0]  # type: ignore[union-attr]
    await sub.flush()
    stored = (await read_cursor(ns.context, "s", "billing")).position  # type: ignore[union-attr]
    assert stored > written[119] and stored <= written[120]
    [info] = await ns.subscriptions("s")
    assert (info.name, info.lag_records, info.truncated) == ("billing", 180, False)
    assert info.lag_bytes > 0 and info.lag_s > 0 and info.epoch == 1
    # More acks, then a crash: no close, so only what was flushed counts.
    for _ in range(30):
        rec = await sub.read_next()
        await sub.ack(rec.position)
    sub2 = await ns.subscribe("s", "billing")  # takes over (in this process: fenced now)
    assert sub.fenced
    with pytest.raises(SubscriptionFencedError):
        await sub.ack(rec.position)
    await sub.close()  # persists nothing: it was fenced
    assert (await sub2.read_next()).position == written[120]
    await sub2.close()
    assert got == written[:120]


async def test_bad_input_gets_one_clear_error_and_changes_nothing(cluster: LocalCluster) -> None:
    ns = await namespace(cluster)
    await ns.create_stream("s")
    async with await ns.open_writer("s") as w:
        written = await write_timed(w, [None] * 20)
    sub = await ns.subscribe("s", "a")
    recs = [await sub.read_next() for _ in range(5)]
    await sub.ack(recs[3].position)
    await sub.flush()
    before = await read_cursor(ns.context, "s", "a")
    with pytest.raises(InvalidAckError, match="no record there was delivered"):
        await sub.ack(written[10])  # not delivered yet
    with pytest.raises(InvalidAckError, match="no record there was delivered"):
        await sub.ack(Position(9, 0, 0))
    with pytest.raises(InvalidAckError, match="backwards"):
        await sub.ack(recs[1].position)
    await sub.flush()
    assert await read_cursor(ns.context, "s", "a") == before
    assert sub.position == Position(recs[3].position.segment, recs[3].position.entry,
                                    recs[3].position.slot + 1)
    await sub.close()
    with pytest.raises(NoSuchSubscriptionError):
        await ns.seek_subscription("s", "nobody", Position.EARLIEST)
    with pytest.raises(NoSuchSubscriptionError):
        await ns.delete_subscription("s", "nobody")
    for bad in ["", " ", "a\nb", "x" * 200]:
        with pytest.raises(InvalidNameError):
            await ns.subscribe("s", bad)
    with pytest.raises(NoSuchStreamError):
        await ns.subscribe("missing", "a")
    with pytest.raises(ValueError):
        await ns.seek_subscription("s", "a")
    assert await read_cursor(ns.context, "s", "a") == before
    assert [i.name for i in await ns.subscriptions("s")] == ["a"]


async def test_seek_moves_a_subscription_either_way_and_fences_its_consumer(
        cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=30)
    await ns.create_stream("s")
    base = 1_900_000_000_000
    async with await ns.open_writer("s") as w:
        written = await write_timed(w, [base + 10 * i for i in range(100)])
    sub = await ns.subscribe("s", "a", Position.LATEST)
    assert sub.persisted_position > written[-1]
    assert await ns.seek_subscription("s", "a", timestamp_ms=base + 505) == written[51]
    with pytest.raises(SubscriptionFencedError):
        await sub.flush()
    await sub.close()
    async with await ns.subscribe("s", "a") as sub2:
        assert (await sub2.read_next()).position == written[51]
    assert await ns.seek_subscription("s", "a", Position.EARLIEST) == written[0]
    [info] = await ns.subscriptions("s")
    assert info.lag_records == 100 and info.epoch == 4


async def test_takeover_under_load_fences_the_old_consumer(cluster: LocalCluster) -> None:
    """A consumer process acks every record while records keep coming; this process
    takes the subscription over.  The other learns it at its next persistence (its
    ack raises SubscriptionFencedError) and none of its acks after the takeover
    moves the stored cursor."""
    ns = await namespace(cluster, rolling_entries=300, subscription_ack_interval_s=0.1)
    await ns.create_stream("s")
    w = await ns.open_writer("s")
    stop = asyncio.Event()

    async def produce() -> None:
        i = 0
        while not stop.is_set():
            await asyncio.gather(*(w.write_nowait(b"%d" % (i + k)) for k in range(20)))
            i += 20
            await asyncio.sleep(0.01)

    producer = asyncio.create_task(produce())
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(CONSUMER), cluster.metadata_uri, ns.name, "s", "shared", "never",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        async with asyncio.timeout(30):
            while sum(1 for line in lines if line.startswith("R ")) < 300:
                lines.append((await proc.stdout.readline()).decode().strip())
        taker = await ns.subscribe("s", "shared")
        at_takeover = taker.persisted_position
        async with asyncio.timeout(20):
            out, err = await proc.communicate()
        lines += out.decode().splitlines()
        assert proc.returncode == 0 and lines[-1] == "F", err.decode()[-2000:]
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    delivered = [Position.parse(line.split()[1]) for line in lines if line.startswith("R ")]
    assert delivered[-1] >= at_takeover  # it went on acking after the takeover ...
    # ... and none of those acks moved the cursor.
    assert (await read_cursor(ns.context, "s", "shared")).position == at_takeover  # type: ignore[union-attr]
    async with await ns.open_reader("s", at_takeover) as r:
        expected = await r.read_next()
    got = [await taker.read_next() for _ in range(50)]
    assert got[0].position == expected.position  # resumed where the store said
    await taker.ack(got[-1].position)
    await taker.flush()
    stored = (await read_cursor(ns.context, "s", "shared")).position  # type: ignore[union-attr]
    assert stored == Position(got[-1].position.segment, got[-1].position.entry,
                              got[-1].position.slot + 1)
    stop.set()
    await producer
    await w.close()
    await taker.close()


async def test_retention_waits_for_a_stalled_subscription_until_its_backlog_quota(
        cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=20, retention_s=0.001,
                         backlog_quota_bytes=4_000)
    await ns.create_stream("s")
    await (await ns.subscribe("s", "stalled", Position.EARLIEST)).close()  # and never back
    keeper = await ns.subscribe("s", "keeper", Position.EARLIEST)
    async with await ns.open_writer("s") as w:
        # 100-byte records, 20 to a segment: 2,000 bytes each; retention wants every
        # completed segment gone at once, the stalled subscription holds them.
        kept = await write_timed(w, [None] * 40, per_round=20, prefix="x" * 98)
        info = await ns.stream_info("s")
        assert info.first_position == Position(1, 0, 0)  # 2 segments, 4,000 bytes: kept
        # The keeper consumes everything: it holds nothing back.
        for _ in range(40):
            rec = await keeper.read_next()
            await keeper.ack(rec.position)
        await keeper.flush()
        assert await ns.truncate("s", Position(99, 0, 0)) == 0  # held by "stalled"
        # A third segment puts the stalled backlog over 4,000 bytes: the oldest go.
        for _ in range(3):
            await write_timed(w, [None] * 20, per_round=20, prefix="y" * 98)
            for _ in range(20):  # the keeper keeps up
                rec = await keeper.read_next()
                await keeper.ack(rec.position)
            await keeper.flush()
        await ns.apply_retention("s")
        info = await ns.stream_info("s")
        assert info.first_position is not None and info.first_position > kept[-1]
    stats = ns.stats
    assert stats.evictions[("t", "s", "stalled")] >= 2
    assert ("t", "s", "keeper") not in stats.evictions
    infos = {i.name: i for i in await ns.subscriptions("s")}
    assert infos["stalled"].truncated and not infos["keeper"].truncated
    stalled = await ns.subscribe("s", "stalled")
    with pytest.raises(TruncatedError):
        await stalled.read_next()
    await stalled.close()
    await keeper.close()
    # Seeking it back to the earliest record still there resumes it.
    await ns.seek_subscription("s", "stalled", Position.EARLIEST)
    async with await ns.subscribe("s", "stalled") as again:
        assert (await again.read_next()).position == info.first_position


async def test_truncate_waits_for_subscriptions_unless_forced(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=10, retention_s=0.0)
    await ns.create_stream("s")
    sub = await ns.subscribe("s", "slow")
    async with await ns.open_writer("s") as w:
        written = await write_timed(w, [None] * 50)
    for _ in range(25):
        rec = await sub.read_next()
        await sub.ack(rec.position)
    await sub.flush()
    # Segments 1 and 2 are acknowledged; 3 (records 20-29) is not, wholly.
    assert await ns.truncate("s", written[45]) == 2
    assert (await ns.stream_info("s")).first_position == Position(3, 0, 0)
    await sub.close()
    assert await ns.truncate("s", written[45], force=True) == 2
    async with await ns.subscribe("s", "slow") as again:
        with pytest.raises(TruncatedError):
            await again.read_next()
    await ns.delete_stream("s")
    await ns.create_stream("s")
    assert await ns.subscriptions("s") == []  # deleting a stream deleted its subscriptions


async def test_a_sigkilled_consumer_gets_every_record_at_least_once(cluster: LocalCluster) -> None:
    """A consumer process acking every record is SIGKILLed at random points; each
    new one resumes exactly at the position stored, every record is delivered, and
    a record is delivered twice only if it came after the last persisted ack."""
    ns = await namespace(cluster, rolling_entries=400, subscription_ack_interval_s=0.05)
    await ns.create_stream("s")
    total = 4_000
    async with await ns.open_writer("s") as w:
        written = []
        for start in range(0, total, 100):
            written += await asyncio.gather(*(w.write_nowait(b"%d" % i)
                                              for i in range(start, start + 100)))
    rng = random.Random(11)
    deliveries: list[list[int]] = []
    starts: list[Position] = []
    stored_before: list[Position] = []
    finished = False
    for run in range(25):
        cur = await read_cursor(ns.context, "s", "c")
        stored_before.append(cur.position if cur is not None else written[0])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(CONSUMER), cluster.metadata_uri, ns.name, "s", "c",
            str(total - 1), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        kill = run < 6
        try:
            if kill:
                await asyncio.sleep(rng.uniform(0.8, 2.5))
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
            async with asyncio.timeout(90):
                out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        lines = out.decode().splitlines()
        seen = [int(line.split()[2]) for line in lines if line.startswith("R ")]
        subscribed = [Position.parse(line.split()[1]) for line in lines if line.startswith("S ")]
        if subscribed:
            starts.append(subscribed[0])
            # It resumed exactly where the store said before it started.
            assert subscribed[0] == stored_before[-1], run
        if seen:
            deliveries.append(seen)
        if lines and lines[-1] == "E":
            # A kill may land after the consumer read the end but before it exited.
            assert proc.returncode == 0 or (kill and proc.returncode == -signal.SIGKILL), \
                err.decode()[-2000:]
            finished = True
            break
    assert finished, "the consumer never got to the end"
    assert sum(1 for s in stored_before if s > written[0]) >= 2  # kills came mid-stream
    everything = sorted({i for run in deliveries for i in run})
    assert everything == list(range(total))  # nothing skipped
    index = {p: i for i, p in enumerate(written)}
    for k, run in enumerate(deliveries):
        assert run == list(range(run[0], run[0] + len(run))), "in order, no gaps"
        # Each run starts at the record the store named: duplicates only after the last
        # persisted ack.
        start = stored_before[len(stored_before) - len(deliveries) + k]
        first_index = next(i for i, p in enumerate(written) if p >= start)
        assert run[0] == first_index
        if k:
            assert run[0] <= deliveries[k - 1][-1] + 1  # the cursor never passed a delivery
    assert index[written[0]] == 0
    # The stored position only grew, run after run.
    assert stored_before == sorted(stored_before)
