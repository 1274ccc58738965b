"""What the Spark source stands on, against a real cluster and without Spark:
record numbers and positions (``asyncbk.spark.plan.StreamIndex``) and the adoption
of staged ledgers into a stream (``asyncbk.stream.adopt``)."""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncbk.errors import InvalidTxidError, NoSuchLedgerError, WriterFencedError
from asyncbk.meta import keys
from asyncbk.spark.plan import StreamIndex
from asyncbk.stream import Namespace, Position, StreamRecord, adopt, codec
from asyncbk.testing import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("loop_errors")]


async def _all(ns: Namespace, stream: str, expected: int) -> list[StreamRecord]:
    """The stream's records, once ``expected`` of them came (and no more within a moment)."""
    out: list[StreamRecord] = []
    async with await ns.open_reader(stream, start=Position.EARLIEST) as r:
        async with asyncio.timeout(30):
            while len(out) < expected:
                out.extend(await r.read_batch(1000, wait_s=5))
        out.extend(await r.read_batch(1000, wait_s=0.5))
    return out


async def _stage(ns: Namespace, stream: str, records: list[tuple[int, bytes]],
                 owner: str = "sink-1") -> adopt.StagedLedger:
    ctx = ns.context
    sm = await ctx.md.stream(ctx.namespace, stream)
    w = adopt.StagedWriter(ctx, stream, ctx.stream_config(sm), owner, entry_bytes=300)
    for txid, data in records:
        await w.add(txid, data)
    staged = await w.finish()
    assert staged is not None
    return staged


async def test_positions_and_record_numbers_convert_both_ways(cluster: LocalCluster) -> None:
    """Every record's position gives its number and back, across rolls and in the open
    segment; the parts of a range hold exactly its records, at most the bound each."""
    bk = await cluster.client()
    ns = await bk.namespace("idx", create=True, ensemble_size=3, write_quorum=2, ack_quorum=2)
    await ns.create_stream("s", rolling_entries=7)
    rnd = random.Random(7)
    w = await ns.open_writer("s", batch_bytes_max=2000)
    for i in range(1500):
        w.write_nowait(b"r%d-" % i + b"x" * rnd.randrange(0, 300))
        if rnd.random() < 0.05:
            await w.flush()
    await w.flush()  # the writer stays open: its segment is open
    records = await _all(ns, "s", 1500)
    assert len(records) == 1500
    idx = await StreamIndex.load(ns.context, "s")
    assert len(idx.segments) > 10 and not idx.segments[-1].completed
    for n, rec in enumerate(records):
        if n % 37 == 0 or n == len(records) - 1:
            assert await idx.sequence_of(rec.position) == n
            assert await idx.position_of(n) == rec.position
    end = await idx.end_position()
    assert await idx.sequence_of(end) == 1500 == await idx.end_sequence()
    assert await idx.position_of(1500) == end
    start = records[123].position
    parts = await idx.parts(start, end, 200)
    assert all(p.records <= 200 for p in parts) and sum(p.records for p in parts) == 1377
    got: list[Position] = []
    for part in parts:
        for sl in part.slices:
            rh = await bk.open_ledger(sl.ledger_id, recovery=False)
            for entry in await rh.read_unconfirmed(sl.first_entry, sl.last_entry):
                batch = codec.decode(entry.data)
                got += [Position(sl.segment, entry.entry_id, slot)
                        for slot in range(len(batch.records)) if sl.keeps(entry.entry_id, slot)]
    assert got == [r.position for r in records[123:]]
    await w.close()


async def test_adoption_is_atomic_once_per_batch_and_fences_the_writer(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Staged ledgers become segments in order, once per batch of a sink; a writer that
    had the stream is fenced and keeps what it had acknowledged; decreasing txids
    are refused with nothing visible; very many ledgers are merged first; staged
    ledgers nobody adopts are swept."""
    bk = await cluster.client()
    ns = await bk.namespace("adopt", create=True, ensemble_size=3, write_quorum=2,
                            ack_quorum=2)
    await ns.create_stream("out")
    w = await ns.open_writer("out")
    acked = [await w.write(b"w%d" % i, txid=i) for i in range(5)]
    s1 = await _stage(ns, "out", [(5, b"a%d" % i) for i in range(40)])
    s2 = await _stage(ns, "out", [(6, b"b%d" % i) for i in range(3)])
    done = await adopt.adopt(ns.context, "out", [s1, s2], sink_id="q", batch=0)
    assert not done.replayed and [s.records for s in done.segments] == [40, 3]
    with pytest.raises(WriterFencedError):
        await w.write(b"late")
    await w.abort()
    # an abort after a commit whose answer was lost must not delete what it adopted
    assert await adopt.discard(ns.context, "out", [s1.ledger_id, s2.ledger_id]) == 0
    recs = await _all(ns, "out", 48)
    assert [r.data for r in recs] == [b"w%d" % i for i in range(5)] + \
        [b"a%d" % i for i in range(40)] + [b"b%d" % i for i in range(3)]
    assert recs[4].position == acked[4]
    # the same batch again (Spark's replay after the commit landed): nothing added
    s3 = await _stage(ns, "out", [(7, b"again")])
    assert (await adopt.adopt(ns.context, "out", [s3], sink_id="q", batch=0)).replayed
    await adopt.discard(ns.context, "out", [s3.ledger_id])
    # decreasing txids: refused, nothing visible
    s4 = await _stage(ns, "out", [(2, b"old")])
    with pytest.raises(InvalidTxidError, match="below 6, the stream's last txid"):
        await adopt.adopt(ns.context, "out", [s4], sink_id="q", batch=1)
    assert len(await _all(ns, "out", 48)) == 48
    assert await adopt.last_batch(ns.context, "out", "q") == 0
    # many ledgers: merged into few, order kept
    monkeypatch.setattr(adopt, "ADOPT_LEDGERS_MAX", 2)
    many = [await _stage(ns, "out", [(10 + i, b"m%d-%d" % (i, j)) for j in range(4)])
            for i in range(5)]
    done = await adopt.adopt(ns.context, "out", many, sink_id="q", batch=1)
    assert len(done.segments) == 2
    assert [r.data for r in (await _all(ns, "out", 68))[48:]] == \
        [b"m%d-%d" % (i, j) for i in range(5) for j in range(4)]
    for s in many:
        with pytest.raises(NoSuchLedgerError):
            await bk.open_ledger(s.ledger_id, recovery=False)
    # what no commit adopts is swept: s4 (refused) is still staged
    assert await adopt.sweep(ns.context, "out", owner="sink-1") == 1
    with pytest.raises(NoSuchLedgerError):
        await bk.open_ledger(s4.ledger_id, recovery=False)
    # deleting the stream removes its markers and anything still staged
    await _stage(ns, "out", [(99, b"orphan")])
    await ns.delete_stream("out")
    root = ns.md.root
    assert not await bk.meta.kv_range(keys.sinks_prefix(root, "adopt", "out"))
    assert not await bk.meta.kv_range(keys.staging_prefix(root, "adopt", "out"))


async def test_adoption_across_streams_is_one_transaction(
        cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several streams' staged ledgers commit in one transaction under the sink's
    namespace-wide marker: all or none (a stream changed meanwhile: the retry commits
    all, never a part); a replay adds nothing whatever streams it names; an older
    per-stream marker still counts; too many ledgers are merged, too many streams
    refused before anything changes; the owner's leftovers are swept in every stream."""
    bk = await cluster.client()
    ns = await bk.namespace("multi", create=True, ensemble_size=3, write_quorum=2,
                            ack_quorum=2)
    ctx = ns.context
    for s in ("a", "b", "c"):
        await ns.create_stream(s)
    w = await ns.open_writer("b")  # a writer holds b: fenced by the commit
    await w.write(b"w0", txid=0)
    staged = {s: [await _stage(ns, s, [(5, b"%s%d" % (s.encode(), i)) for i in range(3)])]
              for s in ("a", "b", "c")}
    # Another writer changes c between the read and the transaction once: retried whole.
    real = ctx.md.apply
    raced = []

    async def racing_apply(ops: object) -> int:
        if not raced:
            raced.append(1)
            async with await ns.open_writer("c") as other:
                await other.write(b"c-early", txid=1)
        return await real(ops)  # type: ignore[arg-type]

    monkeypatch.setattr(ctx.md, "apply", racing_apply)
    done = await adopt.adopt_streams(ctx, staged, sink_id="q", batch=0)
    monkeypatch.setattr(ctx.md, "apply", real)
    assert not done.replayed and sorted(done.segments) == ["a", "b", "c"]
    assert [r.data for r in await _all(ns, "c", 4)] == [b"c-early", b"c0", b"c1", b"c2"]
    assert [r.data for r in await _all(ns, "b", 4)] == [b"w0", b"b0", b"b1", b"b2"]
    with pytest.raises(WriterFencedError):
        await w.write(b"late")
    await w.abort()
    # A replay of batch 0 routed elsewhere: nothing added anywhere.
    replay = {"c": [await _stage(ns, "c", [(9, b"again")])]}
    assert (await adopt.adopt_streams(ctx, replay, sink_id="q", batch=0)).replayed
    assert (await adopt.committed_batch(ctx, "q")).batch == 0
    # A sink whose last batch an older asyncbk recorded on its one stream.
    s_old = await _stage(ns, "a", [(20, b"old")])
    await adopt.adopt(ctx, "a", [s_old], sink_id="legacy", batch=7)
    again = {"a": [await _stage(ns, "a", [(21, b"dup")])]}
    assert (await adopt.adopt_streams(ctx, again, sink_id="legacy", batch=7)).replayed
    # Many ledgers in two streams: merged to what one transaction holds, order kept.
    monkeypatch.setattr(adopt, "TXN_OPS_MAX", 13)  # 1 + 2 x (2 + 2 x 2): two each
    many = {s: [await _stage(ns, s, [(30 + i, b"%s-m%d" % (s.encode(), i))]) for i in range(5)]
            for s in ("a", "b")}
    done = await adopt.adopt_streams(ctx, many, sink_id="q", batch=1)
    assert {s: len(v) for s, v in done.segments.items()} == {"a": 2, "b": 2}
    tail = [r.data for r in await _all(ns, "b", 9)][4:]
    assert tail == [b"b-m%d" % i for i in range(5)]
    monkeypatch.undo()
    # Too many streams: refused before anything is committed.
    monkeypatch.setattr(adopt, "STREAMS_PER_BATCH_MAX", 2)
    before = [len(await _all(ns, s, 1)) for s in ("a", "b", "c")]
    with pytest.raises(ValueError, match="at most 2 streams"):
        await adopt.adopt_streams(ctx, {s: [await _stage(ns, s, [(50, b"x")])]
                                        for s in ("a", "b", "c")}, sink_id="q", batch=2)
    assert [len(await _all(ns, s, 1)) for s in ("a", "b", "c")] == before
    assert (await adopt.committed_batch(ctx, "q")).batch == 1
    # What the owner left staged, in every stream (the refused batch, the replays): swept.
    assert await adopt.sweep_owner(ctx, "sink-1") == 5
    assert await ctx.md.staged_in_namespace("multi") == []
