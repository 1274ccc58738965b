"""Planning reads of streams: record numbers, positions, slices, admission control.

Every record of a stream has a **sequence number**: the records before it in the
stream since it began (a segment records its first record's number,
``start_sequence``, and each entry the records before it in its segment,
``records_before``).  Positions and sequence numbers convert both ways
(:meth:`StreamIndex.sequence_of`, :meth:`StreamIndex.position_of`) from the
segment list and a few entry headers, found by binary search.  Both depend only
on entries at or below a ledger's LAC, which never change, so every plan made
from the same offsets is the same plan: a batch that Spark replays reads the very
records it read the first time.

A range ``[start, end)`` of a stream is cut into **slices**, runs of entries of one
segment, grouped into partitions of at most ``max_records`` records each (a huge
segment spreads over many partitions, many tiny segments share one).

No pyspark here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..client.client import BookKeeper
from ..client.ledger import ReadHandle
from ..errors import NoSuchLedgerError, TruncatedError
from ..stream.codec import decode
from ..stream.context import StreamContext
from ..stream.meta import Offload, Segment
from ..stream.position import Position
from ..stream.segment_ledger import SegmentEntries, durable_end, open_segment
from ..tiered.reader import open_offloaded

HEADER_CACHE_MAX = 4096


@dataclass(frozen=True, slots=True)
class Slice:
    """Entries ``first_entry..last_entry`` of one segment's ledger; records of the first
    entry from ``first_slot`` on, of the last entry below ``end_slot`` (None: all)."""

    segment: int
    ledger_id: int
    first_entry: int
    first_slot: int
    last_entry: int
    end_slot: int | None
    v1_ts_ms: int = 0
    """The time of the segment's format-1 records (its creation time)."""
    ts_floor_ms: int = 0
    """Records' times below it read as it (an adopted segment's floor)."""
    offload: Offload | None = None
    """Where the segment's object is, once offloaded (tasks read it from there)."""

    def keeps(self, entry: int, slot: int) -> bool:
        if entry == self.first_entry and slot < self.first_slot:
            return False
        return not (entry == self.last_entry and self.end_slot is not None
                    and slot >= self.end_slot)


@dataclass(frozen=True, slots=True)
class Part:
    """The records of one stream in one input partition: its slices in order."""

    stream: str
    start: str
    end: str
    records: int
    slices: tuple[Slice, ...]


async def open_slice(bk: BookKeeper, sl: Slice) -> SegmentEntries:
    """The entries of ``sl``'s segment: its object once offloaded (the ledger as the
    fallback while it is on the bookies), else its ledger."""

    async def bookies() -> ReadHandle:
        return await bk.open_ledger(sl.ledger_id, recovery=False)

    if sl.offload is None:
        return await bookies()
    return await open_offloaded(bk.objects, sl.offload, sl.ledger_id, bookies,
                                timeout_s=bk.config.object_store_read_timeout_s)


class StreamIndex:
    """Positions and sequence numbers of one stream, from one read of its segment list
    (make a new index to see later segments)."""

    def __init__(self, ctx: StreamContext, stream: str, segments: list[Segment],
                 first: Segment | None = None, from_seq: int = 0) -> None:
        self.ctx = ctx
        self.namespace = ctx.namespace
        self.stream = stream
        self.segments = segments
        """The segments numbered ``from_seq`` or more."""
        self.first = first if first is not None else (segments[0] if segments else None)
        """The stream's first segment (where it starts now)."""
        self.from_seq = from_seq
        self._handles: dict[int, SegmentEntries] = {}
        self._headers: dict[tuple[int, int], tuple[int, int]] = {}
        self._record_bytes: dict[int, float] = {}
        """Average record size (its data) in the last entry read, by ledger."""
        self._ends: dict[int, tuple[int, int]] = {}

    @classmethod
    async def load(cls, ctx: StreamContext, stream: str, from_seq: int = 0) -> StreamIndex:
        """The index of ``stream`` for positions in segment ``from_seq`` and later (a
        long stream's older segments are not read)."""
        md, ns = ctx.md, ctx.namespace
        if from_seq <= 0:
            return cls(ctx, stream, await md.segments(ns, stream))
        first = await md.segments(ns, stream, limit=1)
        if not first or first[0].seq >= from_seq:
            return cls(ctx, stream, await md.segments(ns, stream))
        return cls(ctx, stream, await md.segments(ns, stream, from_seq=from_seq),
                   first[0], from_seq)

    # ---------------------------------------------------------------- entries

    async def _handle(self, seg: Segment) -> SegmentEntries:
        rh = self._handles.get(seg.ledger_id)
        if rh is None:
            try:
                rh = await open_segment(self.ctx, seg)
            except NoSuchLedgerError:
                raise TruncatedError(
                    f"stream {self.namespace}/{self.stream}: segment {seg.seq} (ledger "
                    f"{seg.ledger_id}) is gone: truncated or deleted") from None
            self._handles[seg.ledger_id] = rh
        return rh

    async def header(self, seg: Segment, entry: int) -> tuple[int, int]:
        """``(records_before, count)`` of an entry of ``seg``."""
        key = (seg.ledger_id, entry)
        got = self._headers.get(key)
        if got is None:
            rh = await self._handle(seg)
            data = (await rh.read_unconfirmed(entry, entry))[0].data
            batch = decode(data, f"stream {self.namespace}/{self.stream} segment "
                                 f"{seg.seq} entry {entry}")
            got = (batch.records_before, batch.count)
            if batch.count:
                self._record_bytes[seg.ledger_id] = sum(map(len, batch.datas)) / batch.count
            if len(self._headers) >= HEADER_CACHE_MAX:
                self._headers.clear()
            self._headers[key] = got
        return got

    async def segment_end(self, seg: Segment) -> tuple[int, int]:
        """``(last entry, records)`` of ``seg`` as far as it is durable: a completed
        segment's, else its ledger's (closed: its last entry; open: its LAC)."""
        if seg.completed:
            return seg.last_entry, seg.records
        got = self._ends.get(seg.seq)
        if got is None:
            try:
                rh = await self._handle(seg)
            except TruncatedError:  # an open segment whose ledger never came to be
                return -1, 0
            last = durable_end(rh)
            if last < 0:
                got = (-1, 0)
            else:
                before, count = await self.header(seg, last)
                got = (last, before + count)
            self._ends[seg.seq] = got
        return got

    # ---------------------------------------------------------------- positions

    @property
    def first_position(self) -> Position:
        """Where the stream starts now (for a stream with no segment: where its first will)."""
        if self.first is not None:
            return self.first.first_position
        return Position(1, 0, 0)

    @property
    def first_sequence(self) -> int:
        return self.first.start_sequence if self.first is not None else 0

    async def end_sequence(self) -> int:
        if not self.segments:
            return 0
        last = self.segments[-1]
        return last.start_sequence + (await self.segment_end(last))[1]

    async def end_position(self) -> Position:
        """Just after the last durable record (the next position to read), from this
        index's segments and the last one's ledger (closed: after its end; open: after
        its LAC), as ``resolve_start(LATEST)`` says it but without reading them again."""
        if not self.segments:  # none at all yet, or none from ``from_seq`` on
            return Position(max(1, self.from_seq), 0, 0)
        last = self.segments[-1]
        if last.completed:
            return Position(last.seq + 1, 0, 0)
        try:
            rh = await self._handle(last)
        except TruncatedError:  # an open segment whose ledger never came to be
            return last.first_position
        if rh.metadata.is_closed:  # taken over, not yet recorded: after its end
            return Position(last.seq + 1, 0, 0)
        last_entry, _ = await self.segment_end(last)
        return Position(last.seq, last_entry + 1, 0)

    def truncated(self, pos: Position) -> bool:
        return self.first is not None and pos < self.first.first_position

    def _covers(self, pos: Position) -> None:
        if pos.segment < self.from_seq:
            raise ValueError(f"position {pos} is before segment {self.from_seq}, where this "
                             "index of the stream begins")

    async def sequence_of(self, pos: Position) -> int:
        """The sequence number of the record at ``pos`` (of the next record, if none is
        there yet).  TruncatedError if ``pos`` was truncated."""
        if self.truncated(pos):
            raise TruncatedError(
                f"stream {self.namespace}/{self.stream}: position {pos} was truncated; the "
                f"stream now starts at {self.first_position}")
        self._covers(pos)
        seg = next((s for s in self.segments if s.seq >= pos.segment), None)
        if seg is None:
            return await self.end_sequence()
        if seg.seq > pos.segment or (pos.entry == 0 and pos.slot == 0):
            return seg.start_sequence
        last_entry, records = await self.segment_end(seg)
        if pos.entry > last_entry:
            return seg.start_sequence + records
        if pos.slot > 0:
            before, count = await self.header(seg, pos.entry)
            return seg.start_sequence + before + min(pos.slot, count)
        before, count = await self.header(seg, pos.entry - 1)
        return seg.start_sequence + before + count

    async def position_of(self, sequence: int) -> Position:
        """The position of the record numbered ``sequence`` (the end position if it is not
        written yet)."""
        if sequence < self.first_sequence:
            raise TruncatedError(
                f"stream {self.namespace}/{self.stream}: record {sequence} was truncated; the "
                f"stream now starts at record {self.first_sequence}")
        if self.segments and sequence < self.segments[0].start_sequence:
            raise ValueError(f"record {sequence} is before segment {self.from_seq}, where "
                             "this index of the stream begins")
        for seg in self.segments:
            last_entry, records = await self.segment_end(seg)
            if not seg.start_sequence <= sequence < seg.start_sequence + records:
                continue
            r = sequence - seg.start_sequence
            lo, hi = 0, last_entry  # the last entry with records_before <= r
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if (await self.header(seg, mid))[0] <= r:
                    lo = mid
                else:
                    hi = mid - 1
            before, _ = await self.header(seg, lo)
            return Position(seg.seq, lo, r - before)
        return await self.end_position()

    async def bytes_between(self, first: int, stop: int) -> float:
        """About how many bytes of data records ``first..stop-1`` hold: exact per
        completed segment on average, an open segment's by its last entry's records."""
        total = 0.0
        for seg in self.segments:
            _, records = await self.segment_end(seg)
            lo = max(first, seg.start_sequence)
            hi = min(stop, seg.start_sequence + records)
            if hi <= lo:
                continue
            if seg.completed and seg.records:
                total += seg.size_bytes * (hi - lo) / seg.records
            else:
                total += self._record_bytes.get(seg.ledger_id, 0.0) * (hi - lo)
        return total

    # ---------------------------------------------------------------- slices

    async def slices(self, start: Position, end: Position) -> list[Slice]:
        """The slices holding the records of ``[start, end)``."""
        out: list[Slice] = []
        for seg in self.segments:
            if seg.seq < start.segment or seg.seq > end.segment:
                continue
            last_entry, _ = await self.segment_end(seg)
            first_entry, first_slot = (start.entry, start.slot) if seg.seq == start.segment \
                else (0, 0)
            if seg.seq == end.segment:
                if end.slot:
                    stop_entry, end_slot = min(end.entry, last_entry), \
                        (end.slot if end.entry <= last_entry else None)
                else:
                    stop_entry, end_slot = min(end.entry - 1, last_entry), None
            else:
                stop_entry, end_slot = last_entry, None
            if stop_entry < first_entry or (stop_entry == first_entry and end_slot is not None
                                             and end_slot <= first_slot):
                continue
            out.append(Slice(seg.seq, seg.ledger_id, first_entry, first_slot, stop_entry,
                             end_slot, seg.ctime_ms, seg.ts_floor_ms, seg.offload))
        return out

    async def parts(self, start: Position, end: Position, max_records: int) -> list[Part]:
        """``[start, end)`` cut into parts of at most ``max_records`` records."""
        first, stop = await self.sequence_of(start), await self.sequence_of(end)
        out: list[Part] = []
        lo_pos, lo = start, first
        while lo < stop:
            hi = min(stop, lo + max_records)
            hi_pos = end if hi == stop else await self.position_of(hi)
            pieces = await self.slices(lo_pos, hi_pos)
            if pieces:
                out.append(Part(self.stream, str(lo_pos), str(hi_pos), hi - lo, tuple(pieces)))
            lo_pos, lo = hi_pos, hi
        return out


def split_limit(backlogs: dict[str, int], limit: int) -> dict[str, int]:
    """How many records each stream may add to a batch under ``limit``: shares in
    proportion to the backlogs (largest remainders), every stream with a backlog
    getting at least one record (so none starves; the total may then exceed
    ``limit`` by at most the number of streams), no stream more than its backlog."""
    waiting = {s: b for s, b in backlogs.items() if b > 0}
    total = sum(waiting.values())
    if total <= limit:
        return dict(waiting)
    exact = {s: limit * b / total for s, b in waiting.items()}
    shares = {s: math.floor(x) for s, x in exact.items()}
    spare = limit - sum(shares.values())
    for s in sorted(waiting, key=lambda s: (shares[s] - exact[s], s))[:spare]:
        shares[s] += 1
    return {s: min(waiting[s], max(1, n)) for s, n in shares.items()}


PARTITION_BYTES = 64 * 1024 * 1024
"""Bytes of record data one input partition holds at most, by default (Spark's file
sources split at 128 MB; half keeps two cores busy on a 100 MB read)."""


def partition_bound(total: int, max_records: int, min_partitions: int | None,
                    total_bytes: float = 0.0, max_bytes: int = PARTITION_BYTES) -> int:
    """Records per partition: at most ``max_records`` and about ``max_bytes`` of data
    (from ``total_bytes`` over ``total`` records), and few enough to make at least
    ``min_partitions`` partitions of ``total`` records."""
    bound = max_records
    if total and total_bytes > 0:
        bound = max(1, min(bound, math.ceil(total / math.ceil(total_bytes / max_bytes))))
    if min_partitions and total:
        return max(1, min(bound, math.ceil(total / min_partitions)))
    return bound


def canonical(offsets: dict[str, str]) -> dict[str, str]:
    return {k: offsets[k] for k in sorted(offsets)}
