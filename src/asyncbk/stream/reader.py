"""Stream readers: every durable record from a start position on, in order, each
once, following the writer across segments.

A reader reads a segment's ledger up to what its writer has had acknowledged
(the LAC), long-polling the bookies while it is caught up; once the ledger is
closed (the writer rolled, closed, or was taken over) and read to its end, it
moves to the next segment, waiting for it to appear if need be.  A read-ahead
task keeps up to ``readahead_entries`` entries decoded ahead of the caller.

A position in a segment that truncation or retention dropped raises
``TruncatedError``, never a silent skip; after the last record of an ended
stream, ``EndOfStreamError``.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from typing import Any

from ..backoff import Backoff
from ..errors import (
    BKError,
    CorruptRecordError,
    EndOfStreamError,
    NoSuchLedgerError,
    TruncatedError,
)
from .codec import Batch, timestamp_bounds, unpack_extras
from .context import StreamContext
from .meta import Segment
from .position import Position, make_position
from .segment_ledger import decode_entry, open_for_read, open_segment, reread_segment

SEGMENT_POLL_S = 0.02
"""First pause between two looks for a segment that does not exist yet (it doubles)."""
SEGMENT_POLL_S_MAX = 0.5
"""Longest pause between two looks for a segment that does not exist yet."""

LAC_POLL_S = 0.25
"""Long-poll round on an open segment; a round with no news re-reads its ledger's
metadata, so a roll or takeover is noticed within about this long."""


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """One record read from a stream: where it is, its txid and bytes, its key
    (None: none), headers and timestamp (ms since the epoch)."""

    stream: str
    position: Position
    txid: int
    data: bytes
    key: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict, hash=False)
    timestamp_ms: int = 0


def _slot_setters(cls: type, names: str) -> list[Any]:
    return [cls.__dict__[name].__set__ for name in names.split()]


_new = object.__new__
(_set_stream, _set_position, _set_txid, _set_data, _set_key, _set_headers,
 _set_ts) = _slot_setters(StreamRecord, "stream position txid data key headers timestamp_ms")


def _record(stream: str, seq: int, entry_id: int, slot: int, txid: int, data: bytes,
            key: bytes | None, headers: dict[str, bytes], ts: int) -> StreamRecord:
    """``StreamRecord(stream, Position(seq, entry_id, slot), ...)``, made the way the
    frozen dataclasses' own ``__init__`` would, without their per-field
    ``object.__setattr__`` calls (a reader makes one per record)."""
    rec = _new(StreamRecord)
    _set_stream(rec, stream)
    _set_position(rec, make_position(seq, entry_id, slot))
    _set_txid(rec, txid)
    _set_data(rec, data)
    _set_key(rec, key)
    _set_headers(rec, headers)
    _set_ts(rec, ts)
    return rec


def batch_records(stream: str, seq: int, entry_id: int, batch: Batch, first_slot: int,
                  where: str) -> list[StreamRecord]:
    """The records of a decoded entry from ``first_slot`` on."""
    txids, datas, tss = batch.txids, batch.datas, batch.timestamps
    extras = batch.extras
    if extras is None:
        return [_record(stream, seq, entry_id, i, txids[i], datas[i], None, {}, tss[i])
                for i in range(first_slot, len(datas))]
    out = []
    for i in range(first_slot, len(datas)):
        key, headers = unpack_extras(extras[i], where)
        out.append(_record(stream, seq, entry_id, i, txids[i], datas[i], key, headers,
                           tss[i]))
    return out


_END = object()


class StreamReader:
    """Reads a stream from ``start`` (see the module docstring).  Get one with
    ``await ns.open_reader(name, start)``; close it (or use ``async with``)."""

    def __init__(self, ctx: StreamContext, name: str, start: Position,
                 readahead_entries: int = 32) -> None:
        if readahead_entries < 1:
            raise ValueError("readahead_entries must be >= 1")
        self._ctx = ctx
        self.namespace = ctx.namespace
        self.stream = name
        self._start = start
        self._queue: asyncio.Queue[Any] = asyncio.Queue(readahead_entries)
        self._ready: collections.deque[StreamRecord] = collections.deque()
        self._error: BaseException | None = None
        self._log = ctx.log(stream=name)
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._closed = False

    @property
    def start(self) -> Position:
        return self._start

    # ------------------------------------------------------------------ public

    def take_ready(self) -> StreamRecord | None:
        """The next record if one is decoded and waiting, else None (never waits)."""
        return self._ready.popleft() if self._ready else None

    async def read_next(self) -> StreamRecord:
        """The next record, waiting for it as long as it takes."""
        while not self._ready:
            await self._fill(None)
        return self._ready.popleft()

    async def read_batch(self, n: int, wait_s: float) -> list[StreamRecord]:
        """Up to ``n`` records: those ready now, else the first to come within
        ``wait_s`` seconds (and those that came with it); ``[]`` if none came."""
        if n < 1:
            raise ValueError("n must be >= 1")
        if not self._ready:
            try:
                async with asyncio.timeout(wait_s):
                    await self._fill(None)
            except TimeoutError:
                if self._ready:
                    pass
                else:
                    return []
        while len(self._ready) < n and not self._queue.empty():
            try:
                await self._fill(0)
            except BKError:
                if not self._ready:
                    raise
                break  # hand out what came first; the error is raised by the next call
        out: list[StreamRecord] = []
        while self._ready and len(out) < n:
            out.append(self._ready.popleft())
        return out

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._task.cancel()
            await asyncio.wait([self._task])

    async def __aenter__(self) -> StreamReader:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __aiter__(self) -> StreamReader:
        return self

    async def __anext__(self) -> StreamRecord:
        try:
            return await self.read_next()
        except EndOfStreamError:
            raise StopAsyncIteration from None

    # ------------------------------------------------------------------ internals

    async def _fill(self, timeout_s: float | None) -> None:
        """Move one decoded entry (or the end, or an error) from the read-ahead queue."""
        if self._error is not None:
            raise self._error
        if self._closed:
            raise BKError(f"reader of {self.namespace}/{self.stream} is closed")
        item = await self._queue.get() if timeout_s is None else self._queue.get_nowait()
        if isinstance(item, BaseException):
            self._error = item
            raise item
        self._ready.extend(item)
        if self._ready:
            stats = self._ctx.stats
            stats.read(self.namespace, len(item), sum(len(r.data) for r in item))

    async def _run(self) -> None:
        try:
            await self._read_from(self._start)
        except asyncio.CancelledError:
            raise
        except BKError as exc:
            await self._queue.put(exc)
        except Exception as exc:  # a bug: hand it to the caller rather than hang it
            self._log.error("stream reader failed", error=repr(exc))
            await self._queue.put(exc)

    async def _read_from(self, pos: Position) -> None:
        ctx, name = self._ctx, self.stream
        first_entry, first_slot = pos.entry, pos.slot
        seq = pos.segment
        while True:
            seg = await self._wait_for_segment(seq)
            if seg.seq != seq:
                first_entry = first_slot = 0
            seq = seg.seq
            try:
                rh = await open_segment(ctx, seg)
            except NoSuchLedgerError:
                now = await reread_segment(ctx, name, seg.seq)
                if now is not None and now.offload is not None:
                    continue  # offloaded and its ledger deleted since it was read: again
                if now is None:
                    raise TruncatedError(
                        f"stream {self.namespace}/{name}: segment {seg.seq} was removed "
                        "while being read (truncated or deleted)") from None
                if now.completed and now.records == 0:
                    seq += 1  # an empty segment whose unused ledger is gone: nothing lost
                    first_entry = first_slot = 0
                    continue
                raise CorruptRecordError(
                    f"stream {self.namespace}/{name}: the ledger {seg.ledger_id} of segment "
                    f"{seg.seq} does not exist") from None
            try:
                async for entry in rh.tail(first_entry, poll_s=LAC_POLL_S):
                    where = f"stream {self.namespace}/{name} segment {seq} entry {entry.entry_id}"
                    batch = decode_entry(seg, entry.data, where)
                    if batch.end_of_stream:
                        await self._queue.put(EndOfStreamError(
                            f"stream {self.namespace}/{name} was ended after its last record"))
                        return
                    records = batch_records(name, seq, entry.entry_id, batch,
                                            first_slot if entry.entry_id == first_entry else 0,
                                            where)
                    if records:
                        await self._queue.put(records)
                    first_entry, first_slot = entry.entry_id + 1, 0
            except NoSuchLedgerError:
                now = await reread_segment(ctx, name, seq)
                if now is None or now.offload is None:
                    raise
                continue  # its ledger was deleted once offloaded: read on from the object
            seq += 1
            first_entry = first_slot = 0

    async def _wait_for_segment(self, seq: int) -> Segment:
        """Segment ``seq``, or the first after it (``seq`` itself may be one a writer
        opened and lost before it existed), waiting until one exists."""
        ctx, name = self._ctx, self.stream
        md, ns = ctx.md, ctx.namespace
        pause = Backoff(SEGMENT_POLL_S, SEGMENT_POLL_S_MAX)
        while True:
            later = await md.segments(ns, name, from_seq=seq, limit=1)
            if later and later[0].seq == seq:
                return later[0]  # (it exists: not truncated; one read, the usual case)
            sm = await md.stream(ns, name)
            first = await md.segments(ns, name, limit=1)
            if first and seq < first[0].seq:
                raise TruncatedError(
                    f"stream {ns}/{name}: segment {seq} was truncated; the stream now "
                    f"starts at {first[0].first_position}")
            if later:
                return later[0]
            if sm.ended:
                raise EndOfStreamError(f"stream {ns}/{name} was ended after its last record")
            await ctx.clock.sleep(pause.next_s())


async def resolve_start(ctx: StreamContext, name: str, start: Position | None,
                        txid: int | None, timestamp_ms: int | None = None) -> Position:
    """A real position for EARLIEST, LATEST, a position, a txid or a time."""
    md, ns = ctx.md, ctx.namespace
    if sum(x is not None for x in (txid, timestamp_ms)) + (start is not None) > 1:
        raise ValueError("give one of start, txid and timestamp_ms")
    sm = await md.stream(ns, name)
    if txid is not None:
        return await _position_of_txid(ctx, await md.segments(ns, name), sm.max_seq, txid)
    if timestamp_ms is not None:
        return await position_of_time(ctx, await md.segments(ns, name), sm.max_seq,
                                      timestamp_ms)
    # Only the first segment or the last (numbered max_seq) matters: read just that one.
    if start == Position.LATEST:
        segs = await md.segments(ns, name, from_seq=sm.max_seq)
    else:
        segs = await md.segments(ns, name, limit=1)
    if start is None or start == Position.EARLIEST:
        return segs[0].first_position if segs else Position(sm.max_seq + 1, 0, 0)
    if start == Position.LATEST:
        if segs and not segs[-1].completed:
            last = segs[-1]
            rh = await open_for_read(ctx, last.ledger_id)
            if rh.metadata.is_closed:  # taken over, not yet recorded: after its end
                return Position(last.seq + 1, 0, 0)
            return Position(last.seq, rh.last_add_confirmed + 1, 0)
        return Position(sm.max_seq + 1, 0, 0)
    if not isinstance(start, Position):
        raise TypeError(f"start must be a Position, not {type(start).__name__}")
    if segs and start < segs[0].first_position:
        raise TruncatedError(f"stream {ns}/{name}: position {start} was truncated; the "
                             f"stream now starts at {segs[0].first_position}")
    return start


async def _position_of_txid(ctx: StreamContext, segs: list[Segment], max_seq: int,
                            txid: int) -> Position:
    """The first record with a txid >= ``txid``: the segment by its txid range, then
    a binary search over its entries."""
    if txid < 0:
        raise ValueError("txid must be >= 0")
    target = next((s for s in segs if not s.completed or (s.records and s.last_txid >= txid)),
                  None)
    if target is None:
        return Position(max_seq + 1, 0, 0)
    rh = await open_segment(ctx, target) if target.completed else await open_for_read(
        ctx, target.ledger_id)
    last = target.last_entry if target.completed else rh.last_add_confirmed
    where = f"stream {ctx.namespace} segment {target.seq}"

    async def batch_at(entry_id: int) -> Batch:
        data = (await rh.read_unconfirmed(entry_id, entry_id))[0].data
        return decode_entry(target, data, f"{where} entry {entry_id}")

    lo, hi = 0, last + 1  # the first entry whose last txid >= txid is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        b = await batch_at(mid)
        if not b.count or b.txids[-1] >= txid:
            hi = mid
        else:
            lo = mid + 1
    if lo > last:
        return Position(target.seq, last + 1, 0)
    b = await batch_at(lo)
    slot = next((i for i, t in enumerate(b.txids) if t >= txid), 0)
    return Position(target.seq, lo, slot)


async def position_of_time(ctx: StreamContext, segs: list[Segment], max_seq: int,
                           timestamp_ms: int) -> Position:
    """The first record with a timestamp >= ``timestamp_ms`` (or, when there is none
    yet, where the next record will be): the segment by its time range (from its
    metadata), then a search over its entries reading only their headers and time
    columns, O(log entries) reads.  Exact, as a stream's times never decrease."""
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise TypeError(f"timestamp_ms must be an int (ms since the epoch), not "
                        f"{type(timestamp_ms).__name__}")
    target = next((s for s in segs if not s.completed or (s.records and
                                                          s.last_ts >= timestamp_ms)), None)
    if target is None:
        return Position(max_seq + 1, 0, 0)
    if target.completed and target.first_ts >= timestamp_ms:
        return target.first_position
    rh = await open_segment(ctx, target) if target.completed else await open_for_read(
        ctx, target.ledger_id)
    last = target.last_entry if target.completed else rh.last_add_confirmed
    where = f"stream {ctx.namespace} segment {target.seq}"
    floor = target.ts_floor_ms
    read: dict[int, bytes] = {}

    async def bounds_at(entry_id: int) -> tuple[int, int, int]:
        data = read[entry_id] = (await rh.read_unconfirmed(entry_id, entry_id))[0].data
        count, first_ts, last_ts = timestamp_bounds(data, f"{where} entry {entry_id}",
                                                    target.ctime_ms)
        return count, max(first_ts, floor), max(last_ts, floor)

    # The first entry whose last time >= timestamp_ms is in [lo, hi].  Probes alternate
    # between interpolating on the times known at lo and hi (streams written at a
    # steady rate find it in one or two reads) and halving (so never more than
    # 2 log2(entries) reads, whatever the times).
    lo, hi = 0, last + 1
    t_lo = target.first_ts if target.completed else -1  # a time at or before entry lo
    t_hi = target.last_ts if target.completed else -1   # the last time of entry hi - 1
    found = -1
    step = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if step % 2 == 0 and 0 <= t_lo < timestamp_ms <= t_hi and t_hi > t_lo:
            guess = lo + (timestamp_ms - t_lo) * (hi - lo) // (t_hi - t_lo + 1)
            mid = min(max(guess, lo), hi - 1)
        step += 1
        count, first_ts, last_ts = await bounds_at(mid)
        if count and first_ts < timestamp_ms <= last_ts:
            found = mid  # it is in this entry
            break
        if not count or last_ts >= timestamp_ms:
            hi = mid
            t_hi = first_ts if count else t_hi
        else:
            lo = mid + 1
            t_lo = last_ts
    if found < 0:
        found = lo
    if found > last:
        return Position(target.seq, last + 1, 0)
    data = read.get(found)
    if data is None:
        data = (await rh.read_unconfirmed(found, found))[0].data
    b = decode_entry(target, data, f"{where} entry {found}")
    slot = next((i for i, t in enumerate(b.timestamps) if t >= timestamp_ms), 0)
    return Position(target.seq, found, slot)
