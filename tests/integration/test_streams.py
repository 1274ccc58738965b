"""Streams and namespaces against a real cluster (etcd + three bookie processes).

Writer takeover by fencing between processes, readers that tail across many
rolls and resume from positions and txids, truncation and retention (with
their ledgers), a SIGKILLed writer, bad input, and deleting a stream.  Small
rolling thresholds give many segments quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asyncbk.client.client import BookKeeper as LedgerClient
from asyncbk.errors import (
    BKError,
    ConfigError,
    EndOfStreamError,
    EntryTooLargeError,
    InvalidNameError,
    InvalidTxidError,
    NamespaceNotEmptyError,
    NoSuchLedgerError,
    NoSuchNamespaceError,
    NoSuchStreamError,
    StreamExistsError,
    TruncatedError,
    WriterFencedError,
)
from asyncbk.stream import Namespace, Position, StreamRecord, StreamWriter
from asyncbk.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]

WRITER = Path(__file__).with_name("stream_writer_proc.py")
SHAPE = {"ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2}
MiB = 1024 * 1024


# ---------------------------------------------------------------------- helpers


async def namespace(cluster: LocalCluster, name: str = "t", **defaults: object) -> Namespace:
    bk = await cluster.client()
    return await bk.namespace(name, create=True, **SHAPE, **defaults)


async def write_rounds(w: StreamWriter, count: int, per_round: int = 10,
                       txid_step: int | None = None, prefix: str = "rec") -> list[StreamRecord]:
    """Write ``count`` records, ``per_round`` pipelined at a time (one entry each
    round), awaiting every round; record i holds ``<prefix><i>`` and, with
    ``txid_step``, txid ``i * txid_step``.  Returns what was written, as records."""
    out: list[StreamRecord] = []
    for start in range(0, count, per_round):
        batch = []
        for i in range(start, min(count, start + per_round)):
            txid = None if txid_step is None else i * txid_step
            expected = w.last_txid + 1 if txid is None else txid
            batch.append((expected, f"{prefix}{i}".encode(), w.write_nowait(
                f"{prefix}{i}".encode(), txid)))
        for txid, data, fut in batch:
            out.append(StreamRecord(w.stream, await fut, txid, data))
    return out


async def read_n(ns: Namespace, stream: str, n: int, timeout_s: float = 30.0,
                 **start: object) -> list[StreamRecord]:
    """Exactly ``n`` records from a new reader (then checks nothing more is ready)."""
    out: list[StreamRecord] = []
    async with await ns.open_reader(stream, **start) as r:  # type: ignore[arg-type]
        async with asyncio.timeout(timeout_s):
            while len(out) < n:
                out += await r.read_batch(n - len(out), wait_s=1.0)
        try:
            more = await r.read_batch(100, wait_s=0.3)
        except EndOfStreamError:  # an ended stream says so after its last record
            more = []
        assert more == [], "more records than expected"
    return out


async def read_completed(ns: Namespace, stream: str) -> list[StreamRecord]:
    """Every record of a stream whose segments are all completed (except perhaps
    an empty open last one), checked against the segments' record counts."""
    info = await ns.stream_info(stream)
    total = sum(s.records for s in info.segments if s.state == "completed")
    recs = await read_n(ns, stream, total, timeout_s=60.0)
    by_segment = Counter(r.position.segment for r in recs)
    for s in info.segments:
        assert by_segment.get(s.seq, 0) == s.records, (s, by_segment.get(s.seq, 0))
    return recs


def triples(recs: list[StreamRecord]) -> list[tuple[Position, int, bytes]]:
    return [(r.position, r.txid, r.data) for r in recs]


def assert_increasing_positions(recs: list[StreamRecord]) -> None:
    bad = [(a.position, b.position) for a, b in zip(recs, recs[1:], strict=False)
           if not a.position < b.position]
    assert not bad, f"positions not strictly increasing: {bad[:5]}"


async def ledger_exists(bk: LedgerClient, ledger_id: int) -> bool:
    try:
        await bk.ledger_metadata(ledger_id)
    except NoSuchLedgerError:
        return False
    return True


async def all_ledgers(bk: LedgerClient) -> set[int]:
    return {lid async for lid in bk.list_ledgers()}


async def stream_ledgers(bk: LedgerClient, ns: str, stream: str) -> set[int]:
    """Ledgers whose custom metadata names them a segment of ``ns/stream``."""
    out = set()
    for lid in await all_ledgers(bk):
        try:
            md = await bk.ledger_metadata(lid)
        except NoSuchLedgerError:
            continue
        if md.custom.get("asyncbk.stream") == f"{ns}/{stream}".encode():
            out.add(lid)
    return out


# ---------------------------------------------------------------------- 1. fight


@dataclass
class FightReport:
    name: str
    opens: list[tuple[int, int]] = field(default_factory=list)
    acked: list[tuple[int, bytes]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    open_errors: list[str] = field(default_factory=list)
    close: str | None = None
    done: bool = False


def parse_report(name: str, out: bytes) -> FightReport:
    rep = FightReport(name)
    for line in out.decode().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "O":
            gen, last = rest.split()
            rep.opens.append((int(gen), int(last)))
        elif kind == "A":
            txid, data = rest.split(" ", 1)
            rep.acked.append((int(txid), data.encode()))
        elif kind == "F":
            rep.failures.append(rest.split()[1])
        elif kind == "X":
            rep.open_errors.append(rest)
        elif kind == "C":
            rep.close = rest
        elif kind == "D":
            rep.done = True
    return rep


async def test_two_writer_processes_fight_over_a_stream(cluster: LocalCluster) -> None:
    fight_s = 15.0
    ns = await namespace(cluster, rolling_entries=50)
    await ns.create_stream("contested")
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), "fight", cluster.metadata_uri, ns.name, "contested",
        f"p{i}", str(fight_s), str(1000 + i),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE) for i in range(2)]
    try:
        async with asyncio.timeout(fight_s + 45):
            outputs = await asyncio.gather(*(p.communicate() for p in procs))
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
                await p.wait()
    reports = [parse_report(f"p{i}", out) for i, (out, _) in enumerate(outputs)]
    for p, rep, (_, err) in zip(procs, reports, outputs, strict=True):
        assert p.returncode == 0 and rep.done, \
            f"{rep.name} exited {p.returncode}: {err.decode()[-2000:]}"

    # It was a fight: both wrote, and the stream changed hands about once a second.
    opens = sum(len(r.opens) for r in reports)
    assert all(r.acked for r in reports), [(r.name, len(r.acked)) for r in reports]
    assert opens >= 8, f"only {opens} takeovers in {fight_s}s"

    # Seal the stream (a takeover completes whatever segment is left open), then read it.
    w = await ns.open_writer("contested")
    last_txid = w.last_txid
    await w.close()
    recs = await read_completed(ns, "contested")
    acked = [a for r in reports for a in r.acked]
    assert recs, "nothing read back"

    # Every acknowledged record is there, exactly once, with its txid.
    seen = Counter((r.txid, r.data) for r in recs)
    missing = [a for a in acked if seen[a] == 0]
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
    dup = [d for d, n in Counter(r.data for r in recs).items() if n > 1]
    assert not dup, f"records read more than once: {dup[:5]}"
    # In txid order (each writer only used txids above the last it found), positions grow.
    txids = [r.txid for r in recs]
    assert all(a < b for a, b in zip(txids, txids[1:], strict=False)), "txids out of order"
    assert txids[-1] == last_txid
    assert_increasing_positions(recs)
    # A writer's records form one run: once a newer writer's record is in the
    # stream, nothing of an older writer (fenced) follows it.
    runs = [rec.data.rsplit(b":", 1)[0] for rec in recs]
    order = [g for i, g in enumerate(runs) if i == 0 or runs[i - 1] != g]
    assert len(order) == len(set(order)), f"writers interleaved: {order}"
    # Each writer generation's acknowledged records are a prefix of what it got in.
    for rep in reports:
        for gen, _ in rep.opens:
            tag = f"{rep.name}:{gen}:".encode()
            got = [int(r.data[len(tag):]) for r in recs if r.data.startswith(tag)]
            assert got == list(range(len(got))), f"{rep.name} gen {gen}: gaps in {got[:20]}"

    # A fenced writer is told so, with the documented error; opening always worked.
    kinds = {k for r in reports for k in r.failures}
    assert kinds <= {"WriterFencedError"}, kinds
    assert not [e for r in reports for e in r.open_errors]


async def test_taking_over_from_a_writer_that_rolls_all_the_time(cluster: LocalCluster) -> None:
    """The race of the fight above, made frequent: the current writer rolls after every
    record (a metadata commit every few milliseconds) while another client opens the
    stream.  Opening must win (fencing the old writer), never fail."""
    ns_a = await namespace(cluster, rolling_entries=1)
    ns_b = await (await cluster.client()).namespace(ns_a.name)
    await ns_a.create_stream("hot")
    acked: list[tuple[int, bytes]] = []
    open_errors: list[str] = []
    for round_ in range(4):
        a = await ns_a.open_writer("hot")

        async def keep_writing(a: StreamWriter = a, round_: int = round_) -> None:
            for i in range(40):  # a bound on the segments made (one a record)
                data = b"a%d:%d" % (round_, i)
                await a.write(data)
                acked.append((a.last_txid, data))

        task = asyncio.create_task(keep_writing())
        await asyncio.sleep(0.2)
        try:
            b: StreamWriter | None = await ns_b.open_writer("hot")
        except BKError as exc:
            open_errors.append(f"round {round_}: {type(exc).__name__}: {exc}")
            b = None
        await asyncio.wait([task], timeout=3)
        task.cancel()
        (outcome,) = await asyncio.gather(task, return_exceptions=True)
        if b is not None:
            # The old writer was fenced: its write failed, or its next one does.
            if outcome is None:
                with pytest.raises(WriterFencedError):
                    await a.write(b"late")
            else:
                assert isinstance(outcome, WriterFencedError), outcome
            await a.abort()
            data = b"b%d" % round_
            await b.write(data)
            acked.append((b.last_txid, data))
            await b.close()
        else:
            with contextlib.suppress(BKError):
                await a.close()  # (not abort() while it may roll: see the next test)
    w = await ns_a.open_writer("hot")
    await w.close()
    recs = await read_completed(ns_a, "hot")
    seen = Counter((r.txid, r.data) for r in recs)
    assert not [a for a in acked if seen[a] != 1], "acknowledged records lost or repeated"
    assert not open_errors, open_errors


async def test_aborting_a_writer_while_it_rolls_leaves_a_readable_stream(
        cluster: LocalCluster) -> None:
    """``abort()`` (what ``async with`` does on an error) while the writer is in the
    middle of a roll: the stream stays readable from end to end afterwards."""
    ns = await namespace(cluster, rolling_entries=1)
    await ns.create_stream("aborted")
    acked: list[tuple[int, bytes]] = []
    for round_ in range(16):
        w = await ns.open_writer("aborted")

        async def keep_writing(w: StreamWriter = w, round_: int = round_) -> None:
            for i in range(10**6):
                data = b"%d:%d" % (round_, i)
                await w.write(data)
                acked.append((w.last_txid, data))

        task = asyncio.create_task(keep_writing())
        await asyncio.sleep(0.1)  # it rolls after every record: mostly rolling
        await w.abort()
        outcome = await asyncio.gather(task, return_exceptions=True)
        assert isinstance(outcome[0], BKError), outcome
    w = await ns.open_writer("aborted")
    pos = await w.write(b"the end")
    await w.close()
    assert acked
    recs = await read_completed(ns, "aborted")
    # Every acknowledged record once (others, in flight at an abort, may be there too).
    seen = Counter((r.txid, r.data) for r in recs)
    assert not [a for a in acked if seen[a] != 1], "acknowledged records lost or repeated"
    assert len({r.data for r in recs}) == len(recs)
    assert (recs[-1].position, recs[-1].data) == (pos, b"the end")


# ---------------------------------------------------------------------- 2. readers


async def collect(reader_kind: str, ns: Namespace, n: int) -> list[StreamRecord]:
    out: list[StreamRecord] = []
    if reader_kind == "iterator":
        async with contextlib.aclosing(  # type: ignore[type-var]
                ns.read("tail", start=Position.EARLIEST)) as it:
            async for rec in it:
                out.append(rec)
                if len(out) == n:
                    break
        return out
    start = Position.LATEST if reader_kind == "latest" else Position.EARLIEST
    async with await ns.open_reader("tail", start) as r:
        while len(out) < n:
            if reader_kind == "batch":
                batch = await r.read_batch(7, wait_s=0.5)
                assert len(batch) <= 7
                out += batch
            else:
                out.append(await r.read_next())
    return out


async def test_readers_tail_across_rolls_resume_and_agree(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=40)
    await ns.create_stream("tail")
    total = 1000
    kinds = ["next", "batch", "iterator", "latest"]
    readers = {k: asyncio.create_task(collect(k, ns, total)) for k in kinds}
    await asyncio.sleep(0.5)  # the readers wait on an empty stream
    async with asyncio.timeout(90):
        w = await ns.open_writer("tail")
        written = await write_rounds(w, total, per_round=10, txid_step=10)
        got = {k: await t for k, t in readers.items()}

    # Concurrent readers agree, with each other and with the writer.
    for k in kinds:
        assert triples(got[k]) == triples(written), f"reader {k} differs from the writer"
    recs = got["next"]
    assert_increasing_positions(recs)
    segment_changes = sum(a.position.segment != b.position.segment
                          for a, b in zip(recs, recs[1:], strict=False))
    assert segment_changes >= 20, segment_changes
    assert w.segment >= 21

    # Resume from a saved position (its str round-trips): that record and what follows.
    mid = next(i for i in range(500, total) if written[i].position.slot > 0)
    saved = Position.parse(str(written[mid].position))
    assert saved == written[mid].position
    assert triples(await read_n(ns, "tail", total - mid, start=saved)) == \
        triples(written[mid:])
    # Just after a saved position: exactly the records after it (here across a roll).
    end_of_seg = next(i for i in range(300, total - 1)
                      if written[i + 1].position.segment != written[i].position.segment)
    p = written[end_of_seg].position
    after = Position(p.segment, p.entry, p.slot + 1)
    assert triples(await read_n(ns, "tail", total - end_of_seg - 1, start=after)) == \
        triples(written[end_of_seg + 1:])
    # The first record of a segment.
    first = end_of_seg + 1
    assert written[first].position == Position(written[first].position.segment, 0, 0)
    assert triples(await read_n(ns, "tail", total - first, start=written[first].position)) == \
        triples(written[first:])

    # From a txid: the first record with a txid >= it.
    for txid, index in [(0, 0), (10 * 777, 777), (10 * 777 + 1, 778), (10 * 50, 50),
                        (10 * 49 + 9, 50), (10 * (total - 1), total - 1)]:
        recs_t = await read_n(ns, "tail", total - index, txid=txid)
        assert triples(recs_t) == triples(written[index:]), f"txid {txid}"

    # Past the last txid and at LATEST: nothing yet, then exactly the next record.
    async with await ns.open_reader("tail", txid=10 * total) as rt, \
            await ns.open_reader("tail", Position.LATEST) as rl:
        assert await rt.read_batch(10, wait_s=0.3) == []
        assert await rl.read_batch(10, wait_s=0.3) == []
        pos = await w.write(b"one more", txid=10 * total + 5)
        for r in (rt, rl):
            rec = await asyncio.wait_for(r.read_next(), 10)
            assert (rec.position, rec.txid, rec.data) == (pos, 10 * total + 5, b"one more")
    await w.close()


# ---------------------------------------------------------------------- 3. truncation


async def test_truncation_drops_whole_segments_and_their_ledgers(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=50)
    bk = ns.bk
    await ns.create_stream("trunc")
    w = await ns.open_writer("trunc")
    written = await write_rounds(w, 500, per_round=10)
    await w.flush()  # the roll after the 500th record is done
    info = await ns.stream_info("trunc")
    segs = info.segments
    assert [s.seq for s in segs] == list(range(1, 12))
    assert [s.state for s in segs] == ["completed"] * 10 + ["open"]
    assert all(s.records == 50 for s in segs[:10])
    ledgers = {s.seq: s.ledger_id for s in segs}
    assert set(ledgers.values()) <= await all_ledgers(bk)

    # A slow reader positioned in segment 2 before the truncation.
    slow = await ns.open_reader("trunc", written[60].position, readahead_entries=1)
    await asyncio.sleep(0.3)

    # Truncating before record 230 (segment 5) drops segments 1-4, nothing else.
    assert await ns.truncate("trunc", before=written[230].position) == 4
    info = await ns.stream_info("trunc")
    assert [s.seq for s in info.segments] == list(range(5, 12))
    assert info.first_position == Position(5, 0, 0)
    assert info.last_position == written[499].position
    left = await all_ledgers(bk)
    for seq in range(1, 5):
        assert ledgers[seq] not in left
        with pytest.raises(NoSuchLedgerError):
            await bk.ledger_metadata(ledgers[seq])
    for seq in range(5, 12):
        assert ledgers[seq] in left

    # Reading a truncated position is an error; EARLIEST starts at the new first record.
    with pytest.raises(TruncatedError):
        await ns.open_reader("trunc", written[10].position)
    with pytest.raises(TruncatedError):
        await ns.open_reader("trunc", Position(1, 0, 0))
    assert triples(await read_n(ns, "trunc", 300)) == triples(written[200:])
    # The slow reader gets records in order with no gap, then TruncatedError.
    seen: list[StreamRecord] = []
    with pytest.raises(TruncatedError):
        async with asyncio.timeout(20):
            while True:
                seen += await slow.read_batch(10, wait_s=1.0)
    await slow.close()
    assert triples(seen) == triples(written[60:60 + len(seen)])
    assert 60 + len(seen) < 200

    # A truncation point past the end drops every completed segment, never the open one.
    with pytest.raises(TypeError):
        await ns.truncate("trunc", before=Position.LATEST)
    assert await ns.truncate("trunc", before=Position(10**6, 0, 0)) == 6
    info = await ns.stream_info("trunc")
    assert [(s.seq, s.state) for s in info.segments] == [(11, "open")]
    assert ledgers[11] in await all_ledgers(bk)
    for seq in range(5, 11):
        assert not await ledger_exists(bk, ledgers[seq])
    # The writer goes on (its next roll sees the changed stream record).
    more = await write_rounds(w, 60, per_round=10, prefix="more")
    assert more[0].position.segment == 11 and more[-1].position.segment == 12
    assert more[0].txid == written[-1].txid + 1
    await w.close()
    assert triples(await read_completed(ns, "trunc")) == triples(more)


async def test_retention_drops_old_segments_at_roll_and_open(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=50)
    bk = ns.bk
    await ns.create_stream("ret", retention_s=1.0)
    await ns.create_stream("keep")  # namespace default retention (72 h): untouched
    keep = await ns.open_writer("keep")
    await write_rounds(keep, 100)
    await keep.flush()
    w = await ns.open_writer("ret")
    old = await write_rounds(w, 200)  # segments 1-4 completed, 5 open
    await w.flush()
    ledgers = {s.seq: s.ledger_id for s in (await ns.stream_info("ret")).segments}
    assert len(ledgers) == 5
    await asyncio.sleep(1.5)

    # The next roll drops the segments completed more than retention_s ago.
    new = await write_rounds(w, 50, prefix="new")  # fills segment 5: a roll
    async with asyncio.timeout(10):
        while (await ns.stream_info("ret")).segments[0].seq != 5:  # noqa: ASYNC110 - polling etcd
            await asyncio.sleep(0.05)
    info = await ns.stream_info("ret")
    assert [(s.seq, s.state) for s in info.segments] == [(5, "completed"), (6, "open")]
    for seq in range(1, 5):
        assert not await ledger_exists(bk, ledgers[seq])
    assert await ledger_exists(bk, ledgers[5])
    with pytest.raises(TruncatedError):
        await ns.open_reader("ret", old[0].position)
    assert triples(await read_n(ns, "ret", 50)) == triples(new)
    assert [s.seq for s in (await ns.stream_info("keep")).segments] == [1, 2, 3]

    # At a writer's opening too: after a close and retention_s, only the new segment is left.
    await w.close()
    await asyncio.sleep(1.5)
    w2 = await ns.open_writer("ret")
    info = await ns.stream_info("ret")
    assert [(s.seq, s.state) for s in info.segments] == [(7, "open")]
    assert not await ledger_exists(bk, ledgers[5])
    assert w2.last_txid == new[-1].txid  # retention never makes txids go back
    pos = await w2.write(b"fresh")
    rec = (await read_n(ns, "ret", 1))[0]
    assert (rec.position, rec.txid, rec.data) == (pos, new[-1].txid + 1, b"fresh")
    await w2.close()
    await keep.close()


async def test_txids_continue_after_every_record_was_dropped(cluster: LocalCluster) -> None:
    """Truncation and retention drop records, never the txid sequence: a writer that
    opens after them continues above the last txid the stream ever had."""
    ns = await namespace(cluster, rolling_entries=50)
    await ns.create_stream("seq")
    w = await ns.open_writer("seq")
    written = await write_rounds(w, 120)
    await w.close()
    last = written[-1].txid
    # A writer that writes nothing leaves an empty segment after the records.
    w = await ns.open_writer("seq")
    assert w.last_txid == last
    await w.close()
    assert await ns.truncate("seq", before=Position(10**6, 0, 0)) == 3
    info = await ns.stream_info("seq")
    assert [(s.records, s.state) for s in info.segments] == [(0, "completed")]
    w = await ns.open_writer("seq")
    assert w.last_txid == last, "the txid sequence restarted after truncation"
    pos = await w.write(b"next")
    await w.close()
    rec = (await read_completed(ns, "seq"))[0]
    assert (rec.position, rec.txid) == (pos, last + 1)


# ---------------------------------------------------------------------- 4. SIGKILL


async def test_sigkilled_writer_process_loses_nothing_acknowledged(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=50)
    await ns.create_stream("victim")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WRITER), "write", cluster.metadata_uri, ns.name, "victim",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    acked: list[tuple[int, bytes]] = []
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(60):
            while len(acked) < 400:
                line = await proc.stdout.readline()
                assert line, f"the writer died: {(await proc.stderr.read()).decode()[-2000:]}"  # type: ignore[union-attr]
                kind, _, rest = line.decode().strip().partition(" ")
                assert kind in ("O", "A"), line
                if kind == "A":
                    txid, data = rest.split(" ", 1)
                    acked.append((int(txid), data.encode()))
        proc.send_signal(signal.SIGKILL)  # mid-round: records in flight
        # What it printed before dying is acknowledged too.
        for text in (await proc.stdout.read()).decode().splitlines():
            kind, _, rest = text.partition(" ")
            if kind == "A":
                txid, data = rest.split(" ", 1)
                acked.append((int(txid), data.encode()))
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    assert [t for t, _ in acked] == list(range(len(acked)))

    # A new writer takes over: every acknowledged record survives, and it goes on
    # from the last txid that survived.
    w = await ns.open_writer("victim")
    recs = await read_completed(ns, "victim")
    assert len({r.position.segment for r in recs}) >= 6
    assert_increasing_positions(recs)
    assert [r.txid for r in recs] == list(range(len(recs))), "txids not contiguous from 0"
    assert all(r.data == f"r{r.txid}".encode() for r in recs)
    assert len(recs) >= len(acked)
    assert [(r.txid, r.data) for r in recs[:len(acked)]] == acked
    assert w.last_txid == recs[-1].txid
    pos = await w.write(b"after the crash")
    await w.close()
    tail = await read_n(ns, "victim", 1, start=pos)
    assert (tail[0].txid, tail[0].data) == (recs[-1].txid + 1, b"after the crash")


# ---------------------------------------------------------------------- 5. bad input


BAD_STREAM_NAMES = ["", "/", "//", "a" * 256, "é" * 128, "a\nb", "nul\x00", "tab\there",
                    "del\x7f", "a//b", "/lead", "trail/", ".", "..", "a/../b"]
BAD_NAMESPACE_NAMES = ["", "a/b", "x" * 129, "-dash", "sp ace", "new\nline", "é"]


async def test_bad_input_gets_typed_errors_and_writes_nothing(cluster: LocalCluster) -> None:
    bk = await cluster.client()
    with pytest.raises(NoSuchNamespaceError):
        await bk.namespace("absent")
    with pytest.raises(NoSuchNamespaceError):
        await bk.delete_namespace("absent")
    for bad in BAD_NAMESPACE_NAMES:
        with pytest.raises(InvalidNameError):
            await bk.namespace(bad, create=True)
    ns = await namespace(cluster, "bad")
    assert [n async for n in bk.list_namespaces()] == ["bad"]

    # Unknown streams.
    for call in (lambda: ns.open_writer("absent"), lambda: ns.open_reader("absent"),
                 lambda: ns.stream_info("absent"), lambda: ns.delete_stream("absent"),
                 lambda: ns.truncate("absent", Position(1, 0, 0))):
        with pytest.raises(NoSuchStreamError):
            await call()
    assert not await ns.stream_exists("absent")

    # Bad stream names, everywhere a name is taken.
    for bad in BAD_STREAM_NAMES:
        for op in (ns.create_stream, ns.open_writer, ns.open_reader, ns.stream_exists,
                   ns.stream_info, ns.delete_stream):
            with pytest.raises(InvalidNameError):
                await op(bad)
    # Bad settings.
    with pytest.raises(ConfigError):
        await ns.create_stream("s", no_such_setting=1)
    with pytest.raises(ConfigError):
        await ns.create_stream("s", write_quorum=5)
    assert [n async for n in ns.list_streams()] == []

    # Long and path-like names that are fine.
    longest = "a" * 255
    for good in (longest, "orders/eu", "ünï/ストリーム"):
        await ns.create_stream(good)
        with pytest.raises(StreamExistsError):
            await ns.create_stream(good)
        async with await ns.open_writer(good) as w:
            await w.write(good.encode())
        assert [r.data for r in await read_completed(ns, good)] == [good.encode()]
    assert sorted([n async for n in ns.list_streams()]) == sorted(
        [longest, "orders/eu", "ünï/ストリーム"])
    assert [n async for n in ns.list_streams("orders/")] == ["orders/eu"]

    # Decreasing, negative, too large and non-int txids; records over record_bytes_max.
    await ns.create_stream("s")
    w = await ns.open_writer("s")
    p1 = await w.write(b"first", txid=10)
    for bad_txid in (9, -1, 1 << 63, True, 11.0):
        with pytest.raises(InvalidTxidError):
            await w.write(b"bad txid", txid=bad_txid)  # type: ignore[arg-type]
        with pytest.raises(InvalidTxidError):
            w.write_nowait(b"bad txid", txid=bad_txid)  # type: ignore[arg-type]
    assert w.last_txid == 10
    p2 = await w.write(b"same txid", txid=10)  # non-decreasing: equal is fine
    with pytest.raises(EntryTooLargeError):
        await w.write(b"x" * (4 * MiB + 1))
    with pytest.raises(EntryTooLargeError):
        w.write_nowait(b"x" * (4 * MiB + 1), txid=11)
    assert w.last_txid == 10
    p3 = await w.write(b"y" * (4 * MiB))  # exactly record_bytes_max
    p4 = await w.write(b"last")
    await w.close()
    recs = await read_completed(ns, "s")
    assert [(r.position, r.txid, r.data) for r in recs] == [
        (p1, 10, b"first"), (p2, 10, b"same txid"), (p3, 11, b"y" * (4 * MiB)),
        (p4, 12, b"last")]
    small = await ns.open_writer("s", record_bytes_max=1000)
    with pytest.raises(EntryTooLargeError):
        await small.write(b"z" * 1001)
    await small.write(b"z" * 1000)
    await small.close()
    assert [len(r.data) for r in (await read_completed(ns, "s"))[4:]] == [1000]

    # A namespace with streams is deleted only with force (and its ledgers with it).
    with pytest.raises(NamespaceNotEmptyError):
        await bk.delete_namespace("bad")
    assert await ns.stream_exists("s")
    seg_ledgers = set()
    async for name in ns.list_streams():
        seg_ledgers |= {s.ledger_id for s in (await ns.stream_info(name)).segments}
    assert len(seg_ledgers) == 5  # one segment for each stream, two for "s"
    await bk.delete_namespace("bad", force=True)
    assert [n async for n in bk.list_namespaces()] == []
    assert not seg_ledgers & await all_ledgers(bk)
    with pytest.raises(NoSuchNamespaceError):
        await ns.open_writer("s")
    with pytest.raises(NoSuchNamespaceError):
        await ns.create_stream("s")


async def test_end_of_stream(cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=50)
    await ns.create_stream("ending")
    # A reader tailing before the end is marked.
    tailer = await ns.open_reader("ending", Position.EARLIEST)
    w = await ns.open_writer("ending")
    written = await write_rounds(w, 120)
    assert await w.mark_end_of_stream() == written[-1].txid
    info = await ns.stream_info("ending")
    assert info.ended

    async with asyncio.timeout(30):
        got = [await tailer.read_next() for _ in range(120)]
        with pytest.raises(EndOfStreamError):
            await tailer.read_next()
        with pytest.raises(EndOfStreamError):  # and it stays so
            await tailer.read_next()
        await tailer.close()
        assert triples(got) == triples(written)
        # read_next: every record, then EndOfStreamError.
        async with await ns.open_reader("ending") as r:
            got = [await r.read_next() for _ in range(120)]
            with pytest.raises(EndOfStreamError):
                await r.read_next()
        assert triples(got) == triples(written)
        # read_batch: every record (none held back behind the error), then the error.
        async with await ns.open_reader("ending", written[100].position) as r:
            await asyncio.sleep(0.5)  # the read-ahead reaches the end
            batches: list[StreamRecord] = []
            with pytest.raises(EndOfStreamError):
                while True:
                    batches += await r.read_batch(1000, wait_s=1.0)
        assert triples(batches) == triples(written[100:])
        # The iterator ends after the last record; so does one from LATEST.
        assert triples([rec async for rec in ns.read("ending")]) == triples(written)
        async with await ns.open_reader("ending", Position.LATEST) as r:
            with pytest.raises(EndOfStreamError):
                await r.read_next()
    with pytest.raises(EndOfStreamError):
        await ns.open_writer("ending")
    assert triples(await read_completed(ns, "ending")) == triples(written)


# ---------------------------------------------------------------------- 6. deletion


async def test_deleting_a_stream_fences_its_writer_and_deletes_its_ledgers(
        cluster: LocalCluster) -> None:
    ns = await namespace(cluster, rolling_entries=50)
    bk = ns.bk
    await ns.create_stream("doomed")
    await ns.create_stream("neighbour")
    nb = await ns.open_writer("neighbour")
    await write_rounds(nb, 100)
    w = await ns.open_writer("doomed")
    await write_rounds(w, 230)
    await w.flush()
    ledgers = {s.ledger_id for s in (await ns.stream_info("doomed")).segments}
    assert len(ledgers) == 5
    assert ledgers == await stream_ledgers(bk, ns.name, "doomed")
    tailer = await ns.open_reader("doomed", Position.EARLIEST)

    await ns.delete_stream("doomed")
    with pytest.raises(WriterFencedError):
        await w.write(b"too late")
    await w.abort()
    assert not await ns.stream_exists("doomed")
    for op in (ns.stream_info, ns.open_reader, ns.open_writer):
        with pytest.raises(NoSuchStreamError):
            await op("doomed")
    left = await all_ledgers(bk)
    assert not ledgers & left
    for lid in ledgers:
        with pytest.raises(NoSuchLedgerError):
            await bk.ledger_metadata(lid)
    # A reader that was tailing it ends with an error rather than waiting forever.
    with pytest.raises(BKError):
        async with asyncio.timeout(15):
            while True:
                await tailer.read_batch(100, wait_s=1.0)
    await tailer.close()
    # The neighbour is untouched; the name can be used again, for a new empty stream.
    assert len(await read_n(ns, "neighbour", 100)) == 100
    await nb.close()
    await ns.create_stream("doomed")
    assert (await ns.stream_info("doomed")).segments == []
    async with await ns.open_writer("doomed") as w2:
        assert w2.last_txid == -1 and w2.segment == 1
        pos = await w2.write(b"reborn")
    assert triples(await read_completed(ns, "doomed")) == [(pos, 0, b"reborn")]


async def test_deleting_a_stream_under_load(cluster: LocalCluster) -> None:
    """Deleting while the writer writes and rolls: the writer fails, and no ledger
    of the stream is left behind."""
    ns = await namespace(cluster, rolling_entries=20)
    bk = ns.bk
    await ns.create_stream("busy")
    w = await ns.open_writer("busy")
    acked = 0

    async def keep_writing() -> None:
        nonlocal acked
        while True:
            futs = [w.write_nowait(b"load %d" % i) for i in range(10)]
            for f in futs:
                await f
                acked += 1

    task = asyncio.create_task(keep_writing())
    try:
        async with asyncio.timeout(20):
            while acked < 300:  # noqa: ASYNC110 - the writer task counts
                await asyncio.sleep(0.05)
        await ns.delete_stream("busy")
        async with asyncio.timeout(15):
            with pytest.raises(BKError):
                await task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await w.abort()
    assert not await ns.stream_exists("busy")
    leftover = await stream_ledgers(bk, ns.name, "busy")
    assert not leftover, f"ledgers of the deleted stream left behind: {sorted(leftover)}"
