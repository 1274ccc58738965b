"""Ledgers written apart from a stream, then made part of it in one transaction.

This is how a parallel writer (Spark's tasks) appends to a stream, which has one
writer at a time, exactly once:

1. Each worker writes its records into a *staged* ledger of its own
   (:class:`StagedWriter`): a ledger with the stream's shape, in the stream's entry
   format, registered under ``<root>/streams/staging/...`` so that a ledger whose
   batch never commits can be found and deleted.  Readers never see it.
2. One committer :func:`adopt`\\ s the staged ledgers: one metadata transaction fences
   and completes the stream's open segment (if another writer has one), appends the
   ledgers as completed segments, records the batch under the committer's *sink id*,
   and removes their staging keys.  It applies whole or not at all, and a batch
   whose number the sink has recorded already is not applied again.
3. :func:`sweep` deletes staged ledgers that no commit will adopt.

:func:`adopt_streams` does step 2 for several streams at once, in one
transaction, under a batch marker per sink and namespace (a Spark batch whose
rows name their streams); :func:`sweep_owner` sweeps a sink's leftovers in every
stream of the namespace.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import (
    BKError,
    EndOfStreamError,
    InvalidTxidError,
    MetadataVersionError,
    NoSuchLedgerError,
    WriterFencedError,
)
from .codec import RECORD_OVERHEAD_BYTES_MAX, decode, encode
from .context import StreamContext
from .meta import COMPLETED, Segment, SinkMark, StreamConfig, TxnOps
from .segment_ledger import (
    create_staged_ledger,
    delete_ledger,
    discard_ledger,
    durable_end,
    open_for_read,
    recover_segment,
)

if TYPE_CHECKING:
    from ..client.ledger import LedgerHandle

ADOPT_ATTEMPTS = 20
ADOPT_LEDGERS_MAX = 40
"""Staged ledgers one transaction adopts at most (each costs two of etcd's operations
per transaction, 128 by default); more are first copied into this many."""
ENTRY_BYTES = 1024 * 1024
"""Bytes of records packed into one entry of a staged ledger at most."""
INFLIGHT_ENTRIES = 64


@dataclass(frozen=True)
class StagedLedger:
    """A staged ledger, closed, and what it holds."""

    ledger_id: int
    records: int
    first_txid: int
    last_txid: int
    last_entry: int
    last_slot: int
    size_bytes: int
    owner: str
    first_ts_ms: int = -1
    last_ts_ms: int = -1


class StagedWriter:
    """Writes records into a new staged ledger of ``stream`` (see the module docstring)."""

    def __init__(self, ctx: StreamContext, stream: str, config: StreamConfig, owner: str,
                 entry_bytes: int = ENTRY_BYTES, inflight_entries: int = INFLIGHT_ENTRIES
                 ) -> None:
        self.ctx = ctx
        self.stream = stream
        self.config = config
        self.owner = owner
        self.entry_bytes = entry_bytes
        self.inflight_entries = max(1, inflight_entries)
        """Entries sent and not yet acknowledged at most (with ``entry_bytes``, what the
        writer holds in memory)."""
        self._lh: LedgerHandle | None = None
        self._txids: list[int] = []
        self._datas: list[bytes] = []
        self._tss: list[int] = []
        self._extras: list[bytes] = []
        self._pending_bytes = 0
        self._first_ts = -1
        self._last_ts = -1
        self._records = 0
        self._first_txid = -1
        self._last_txid = -1
        self._last_entry = -1
        self._last_count = 0
        self._inflight: set[asyncio.Future[int]] = set()

    async def _open(self) -> None:
        ctx = self.ctx
        lh = await create_staged_ledger(ctx, self.stream, self.config, self.owner)
        try:
            await ctx.md.stage(ctx.namespace, self.stream, lh.id, self.owner)
        except BaseException:
            await discard_ledger(ctx, lh)
            raise
        self._lh = lh

    async def add(self, txid: int, data: bytes, timestamp_ms: int | None = None,
                  extras: bytes = b"") -> None:
        """One record; ``txid`` must not be below the previous one.  ``timestamp_ms``
        (default: the clock now) is raised to the previous record's if lower;
        ``extras``: its key and headers (:func:`asyncbk.stream.codec.pack_extras`)."""
        if txid < self._last_txid:
            raise InvalidTxidError(f"txid {txid} is below the previous record's "
                                   f"{self._last_txid}; txids must not decrease")
        ts = self.ctx.now_ms() if timestamp_ms is None else timestamp_ms
        ts = max(ts, self._last_ts)
        if self._records == 0:
            self._first_txid = txid
            self._first_ts = ts
        self._last_txid = txid
        self._last_ts = ts
        self._records += 1
        size = len(data) + len(extras) + RECORD_OVERHEAD_BYTES_MAX
        if self._datas and self._pending_bytes + size > self.entry_bytes:
            await self._send()
        self._txids.append(txid)
        self._datas.append(data)
        self._tss.append(ts)
        self._extras.append(extras)
        self._pending_bytes += size

    async def _send(self) -> None:
        if self._lh is None:
            await self._open()
        lh = self._lh
        assert lh is not None
        while len(self._inflight) >= self.inflight_entries:
            done, _ = await asyncio.wait(self._inflight, return_when=asyncio.FIRST_COMPLETED)
            for fut in done:
                self._inflight.discard(fut)
                fut.result()
        before = self._records - len(self._datas)
        fut = lh.append(encode(before, self._txids, self._datas, self._tss, self._extras))
        self._inflight.add(fut)
        self._last_entry += 1
        self._last_count = len(self._datas)
        self._txids, self._datas, self._pending_bytes = [], [], 0
        self._tss, self._extras = [], []

    async def finish(self) -> StagedLedger | None:
        """Flush, close the ledger and describe it (None if no record was added)."""
        if self._datas:
            await self._send()
        if self._lh is None:
            return None
        if self._inflight:
            await asyncio.gather(*self._inflight)
            self._inflight.clear()
        await self._lh.close()
        return StagedLedger(self._lh.id, self._records, self._first_txid, self._last_txid,
                            self._last_entry, self._last_count - 1, self._lh.metadata.length,
                            self.owner, self._first_ts, self._last_ts)

    async def abort(self) -> None:
        """Give up: close and delete the ledger and its staging key."""
        for fut in self._inflight:
            fut.cancel()
        self._inflight.clear()
        if self._lh is not None:
            await self._lh.close_quietly()
            await discard(self.ctx, self.stream, [self._lh.id])


async def discard(ctx: StreamContext, stream: str, ledger_ids: Iterable[int]) -> int:
    """Delete staged ledgers that are still staged; returns how many.

    A ledger counts as staged while its staging key exists: the key is removed
    first, in a transaction that requires it, and only then the ledger.  A ledger
    that a commit adopted lost its key in that commit's transaction, so it is never
    deleted here, even when the caller cannot know whether the commit landed (an
    ``abort`` after a commit whose answer was lost)."""
    gone = 0
    for ledger_id in ledger_ids:
        if not await ctx.md.unstage(ctx.namespace, stream, ledger_id):
            continue  # adopted (maybe meanwhile), or discarded before
        await delete_ledger(ctx, ledger_id)
        gone += 1
    return gone


UNCONFIRMED_PROBE_MAX = 16
"""Entries past an open segment's LAC that :func:`_durable_last_txid` looks for."""


async def _durable_last_txid(ctx: StreamContext, seg: Segment) -> int:
    """The last txid of an open segment, without fencing its writer: from the last
    entry the bookies have, also past the LAC (the writer's latest acknowledged
    entries are confirmed only by its next add or its explicit LAC)."""
    try:
        rh = await open_for_read(ctx, seg.ledger_id)
    except NoSuchLedgerError:
        return -1
    entry = durable_end(rh)
    if not rh.metadata.is_closed:
        for _ in range(UNCONFIRMED_PROBE_MAX):
            try:
                await rh.read_unconfirmed(entry + 1, entry + 1)
            except BKError:  # no such entry (or no bookie has it yet): the end
                break
            entry += 1
    while entry >= 0:
        batch = decode((await rh.read_unconfirmed(entry, entry))[0].data,
                       f"stream {ctx.namespace} segment {seg.seq} entry {entry}")
        if batch.count:
            return batch.txids[-1]
        entry -= 1
    return -1


async def last_txid(ctx: StreamContext, stream: str) -> int:
    """The highest txid in ``stream`` now, the open segment's durable records included
    (-1: none): a parallel writer's records take txids above it."""
    sm = await ctx.md.stream(ctx.namespace, stream)
    last = await ctx.md.segments(ctx.namespace, stream, from_seq=sm.max_seq)
    txid = max([sm.last_txid, *(s.last_txid for s in last)])
    if last and not last[-1].completed:
        txid = max(txid, await _durable_last_txid(ctx, last[-1]))
    return txid


def _check_txids(ctx: StreamContext, stream: str, staged: Sequence[StagedLedger],
                 prev_txid: int) -> None:
    for s in staged:
        if s.records and s.first_txid < prev_txid:
            raise InvalidTxidError(
                f"stream {ctx.namespace}/{stream}: this batch's txids start at {s.first_txid}, below "
                f"{prev_txid}, the stream's last txid (txids never decrease); another writer "
                "may have written meanwhile (run the batch again), or a txid column goes "
                "down (sort the rows by it, or leave it out)")
        if s.records:
            prev_txid = s.last_txid


@dataclass(frozen=True)
class Adopted:
    """What :func:`adopt` did: the segments it added, or that the batch was committed
    before (``replayed``)."""

    segments: list[Segment]
    replayed: bool
    last_batch: int | None


async def last_batch(ctx: StreamContext, stream: str, sink_id: str) -> int | None:
    """The last batch the sink ``sink_id`` committed to ``stream`` with :func:`adopt`
    (None: none yet)."""
    return (await ctx.md.sink_mark(ctx.namespace, stream, sink_id)).batch


@dataclass
class _Share:
    """One stream's part of an adoption: its new segments and the operations that add
    them (and complete a fenced writer's segment) if nothing changed meanwhile."""

    stream: str
    new: list[Segment]
    ops: TxnOps


async def _prepare(ctx: StreamContext, stream: str, staged: Sequence[StagedLedger],
                   sink: SinkMark | None = None) -> _Share | None:
    """The share of ``stream`` in a transaction adopting ``staged`` (in order) as its
    next completed segments; None if the stream changed while it was read (read again)."""
    md, ns = ctx.md, ctx.namespace
    sm = await md.stream(ns, stream)
    if sm.ended:
        raise EndOfStreamError(f"stream {ns}/{stream} was ended: it takes no more writes")
    segs = await md.segments(ns, stream, from_seq=sm.max_seq)  # the last one
    put: list[Segment] = []
    last = segs[-1] if segs else None
    if last is not None and not last.completed:
        # Another writer has the stream.  If its records already rule this batch out,
        # say so without fencing it; else fence it (its next change of the segments
        # fails), then complete its segment in our transaction.
        _check_txids(ctx, stream, staged, max(
            sm.last_txid, last.last_txid, await _durable_last_txid(ctx, last)))
        try:
            sm, _ = await md.commit(sm, epoch=sm.epoch + 1)
        except MetadataVersionError:
            return None
        last, ended = await recover_segment(ctx, last)
        put.append(last)
        if ended:
            raise EndOfStreamError(f"stream {ns}/{stream} was ended")
    _check_txids(ctx, stream, staged, max(
        [sm.last_txid, *(s.last_txid for s in segs), *(s.last_txid for s in put)]))
    start_sequence = last.start_sequence + last.records if last is not None else 0
    start_bytes = last.start_bytes + last.size_bytes if last is not None else 0
    seq = max([sm.max_seq, *(s.seq for s in segs)]) + 1
    # Stream times never decrease: records staged before the stream's latest read as
    # that time (each adopted segment's floor).
    floor = max([sm.last_ts_ms, *(s.last_ts for s in segs if s.records),
                 *(s.last_ts for s in put if s.records), 0])
    now_ms = ctx.now_ms()
    new: list[Segment] = []
    for s in staged:
        if not s.records:
            continue
        first_ts = s.first_ts_ms if s.first_ts_ms >= 0 else now_ms
        last_ts = s.last_ts_ms if s.last_ts_ms >= 0 else now_ms
        new.append(Segment(seq=seq, ledger_id=s.ledger_id, state=COMPLETED,
                           records=s.records, start_sequence=start_sequence,
                           start_bytes=start_bytes,
                           first_txid=s.first_txid, last_txid=s.last_txid,
                           last_entry=s.last_entry, last_slot=s.last_slot,
                           size_bytes=s.size_bytes, ctime_ms=now_ms, completion_ms=now_ms,
                           first_ts_ms=first_ts, last_ts_ms=last_ts,
                           ts_floor_ms=floor if floor > first_ts else 0))
        floor = max(floor, last_ts)
        seq += 1
        start_sequence += s.records
        start_bytes += s.size_bytes
    _, ops = md.commit_ops(sm, put=[*put, *new], sink=sink,
                           unstage=[s.ledger_id for s in staged])
    return _Share(stream, new, ops)


async def adopt(ctx: StreamContext, stream: str, staged: Sequence[StagedLedger], *,
                sink_id: str | None = None, batch: int | None = None) -> Adopted:
    """Make ``staged`` (in order) the next completed segments of ``stream`` in one
    transaction; with ``sink_id`` and ``batch``, only if that sink has not committed
    ``batch`` (or a later one) before, and record that it has."""
    md, ns = ctx.md, ctx.namespace
    if sum(1 for s in staged if s.records) > ADOPT_LEDGERS_MAX:
        if sink_id is not None and batch is not None:
            done = await last_batch(ctx, stream, sink_id)
            if done is not None and done >= batch:
                return Adopted([], True, done)
        staged = await merge(ctx, stream, staged)
    for _attempt in range(ADOPT_ATTEMPTS):
        mark = None
        if sink_id is not None and batch is not None:
            mark = await md.sink_mark(ns, stream, sink_id)
            if mark.batch is not None and mark.batch >= batch:
                return Adopted([], True, mark.batch)
            mark = SinkMark(sink_id, batch, mark.version)  # recorded if still as read
        share = await _prepare(ctx, stream, staged, mark)
        if share is None:
            continue
        try:
            revision = await md.apply(share.ops)
        except MetadataVersionError:
            continue
        ctx.log(stream=stream).info("ledgers adopted", segments=[s.seq for s in share.new],
                                    sink=sink_id, batch=batch)
        return Adopted([dataclasses.replace(s, version=revision) for s in share.new], False,
                       batch)
    raise _lost(ns, stream)


def _lost(ns: str, stream: str) -> WriterFencedError:
    return WriterFencedError(f"stream {ns}/{stream}: {ADOPT_ATTEMPTS} attempts to commit lost "
                             "to other writers changing the stream; are several writers "
                             "fighting over it?")


TXN_OPS_MAX = 128
"""etcd's default ``--max-txn-ops``: operations one transaction may hold."""
STREAMS_PER_BATCH_MAX = (TXN_OPS_MAX - 1) // 4
"""Streams one :func:`adopt_streams` transaction may add to (31): each costs at most
four operations with one ledger (its record, a fenced writer's segment, the new segment
and its staging key), and the batch's record one more."""


def _ops_needed(ledgers: Mapping[str, int]) -> int:
    """The operations :func:`adopt_streams` needs at most for these counts of non-empty
    staged ledgers per stream."""
    return 1 + sum(2 + 2 * n for n in ledgers.values())


@dataclass(frozen=True)
class AdoptedStreams:
    """What :func:`adopt_streams` did: the segments it added to each stream, or that
    the batch was committed before (``replayed``)."""

    segments: dict[str, list[Segment]]
    replayed: bool
    last_batch: int | None


async def committed_batch(ctx: StreamContext, sink_id: str,
                          streams: Iterable[str] = ()) -> SinkMark:
    """The last batch the sink committed to the namespace (:func:`adopt_streams`), with
    its record's version; while it has none, the highest batch that sink recorded on one
    of ``streams`` with :func:`adopt` (what asyncbk wrote before streams were routed),
    version 0."""
    mark = await ctx.md.batch_mark(ctx.namespace, sink_id)
    if mark.version:
        return mark
    older = [(await ctx.md.sink_mark(ctx.namespace, s, sink_id)).batch for s in streams]
    done = max((b for b in older if b is not None), default=None)
    return SinkMark(sink_id, done, 0)


async def adopt_streams(ctx: StreamContext, staged: Mapping[str, Sequence[StagedLedger]], *,
                        sink_id: str | None = None, batch: int | None = None
                        ) -> AdoptedStreams:
    """Make each stream's ``staged`` ledgers (in order) its next completed segments, all
    streams in **one** transaction; with ``sink_id`` and ``batch``, only if that sink has
    not committed ``batch`` (or a later one) to this namespace before, and record that
    it has.  At most :data:`STREAMS_PER_BATCH_MAX` streams (ValueError beyond, before
    anything changes); streams with more ledgers than fit are first merged
    (:func:`merge`)."""
    md, ns = ctx.md, ctx.namespace
    full = {name: [s for s in ledgers if s.records] for name, ledgers in staged.items()}
    streams = sorted(name for name, ledgers in full.items() if ledgers)
    if len(streams) > STREAMS_PER_BATCH_MAX:
        raise ValueError(
            f"a batch may write to at most {STREAMS_PER_BATCH_MAX} streams (one etcd "
            f"transaction of at most {TXN_OPS_MAX} operations commits it); this one writes "
            f"to {len(streams)}: split the DataFrame by stream and write the parts apart")
    async def mark() -> tuple[bool, SinkMark | None]:
        """Whether the batch was committed before; else the record to write with it."""
        if sink_id is None or batch is None:
            return False, None
        done = await committed_batch(ctx, sink_id, streams)
        if done.batch is not None and done.batch >= batch:
            return True, done
        return False, SinkMark(sink_id, batch, done.version)  # recorded if still as read

    if _ops_needed({n: len(full[n]) for n in streams}) > TXN_OPS_MAX:
        replayed, done = await mark()
        if replayed:
            assert done is not None
            return AdoptedStreams({}, True, done.batch)
        groups = max(1, (TXN_OPS_MAX - 1 - 2 * len(streams)) // (2 * len(streams)))
        for name in streams:
            full[name] = await merge(ctx, name, full[name], groups)
    for _attempt in range(ADOPT_ATTEMPTS):
        ops = TxnOps()
        replayed, done = await mark()
        if done is not None:
            if replayed:
                return AdoptedStreams({}, True, done.batch)
            ops.extend(md.batch_mark_ops(ns, done))
        shares = []
        for name in streams:
            share = await _prepare(ctx, name, full[name])
            if share is None:
                break
            shares.append(share)
            ops.extend(share.ops)
        else:
            try:
                revision = await md.apply(ops)
            except MetadataVersionError:
                continue
            added = {sh.stream: [dataclasses.replace(s, version=revision) for s in sh.new]
                     for sh in shares}
            ctx.log().info("ledgers adopted", streams={k: [s.seq for s in v]
                                                       for k, v in added.items()},
                           sink=sink_id, batch=batch)
            return AdoptedStreams(added, False, batch)
    raise _lost(ns, ", ".join(streams))


async def merge(ctx: StreamContext, stream: str, staged: Sequence[StagedLedger],
                groups: int | None = None) -> list[StagedLedger]:
    """``staged`` copied, in order, into at most ``groups`` (default ADOPT_LEDGERS_MAX)
    new staged ledgers (the originals are deleted).  The slow path of a batch with
    very many tasks."""
    groups = groups or ADOPT_LEDGERS_MAX
    full = [s for s in staged if s.records]
    if len(full) <= groups:
        return full
    sm = await ctx.md.stream(ctx.namespace, stream)
    config = ctx.stream_config(sm)
    size = -(-len(full) // groups)
    out: list[StagedLedger] = []
    for i in range(0, len(full), size):
        writer = StagedWriter(ctx, stream, config, full[i].owner)
        try:
            for s in full[i:i + size]:
                rh = await open_for_read(ctx, s.ledger_id)
                for lo in range(0, s.last_entry + 1, INFLIGHT_ENTRIES):
                    for entry in await rh.read(lo, min(s.last_entry, lo + INFLIGHT_ENTRIES - 1)):
                        batch = decode(entry.data, f"staged ledger {s.ledger_id}")
                        extras = batch.extras or [b""] * batch.count
                        for txid, data, ts, extra in zip(batch.txids, batch.datas,
                                                         batch.timestamps, extras, strict=True):
                            await writer.add(txid, data, ts, extra)
            done = await writer.finish()
        except BaseException:
            await writer.abort()
            raise
        assert done is not None
        out.append(done)
    await discard(ctx, stream, [s.ledger_id for s in staged])
    return out


async def sweep(ctx: StreamContext, stream: str, owner: str | None = None,
                keep: Iterable[int] = ()) -> int:
    """Delete the staged ledgers of ``stream`` (of ``owner`` only, if given) except
    ``keep``; returns how many.  Only safe while no worker of ``owner`` is writing."""
    spared = set(keep)
    doomed = [ledger_id for ledger_id, who in await ctx.md.staged(ctx.namespace, stream)
              if ledger_id not in spared and (owner is None or who == owner)]
    try:
        return await discard(ctx, stream, doomed)
    except BKError as exc:
        ctx.log(stream=stream).warning(
            "could not delete staged ledgers; the next commit tries again", error=str(exc))
        return 0


async def sweep_owner(ctx: StreamContext, owner: str) -> int:
    """Delete the staged ledgers of ``owner`` in every stream of the namespace; returns
    how many.  Only safe while no worker of ``owner`` is writing."""
    doomed: dict[str, list[int]] = {}
    for stream, ledger_id, who in await ctx.md.staged_in_namespace(ctx.namespace):
        if who == owner:
            doomed.setdefault(stream, []).append(ledger_id)
    gone = 0
    for stream, ledger_ids in doomed.items():
        try:
            gone += await discard(ctx, stream, ledger_ids)
        except BKError as exc:
            ctx.log(stream=stream).warning(
                "could not delete staged ledgers; the next commit tries again", error=str(exc))
    return gone


def staged_from(d: dict[str, Any]) -> StagedLedger:
    return StagedLedger(**d)


def staged_to(s: StagedLedger) -> dict[str, Any]:
    return dataclasses.asdict(s)
