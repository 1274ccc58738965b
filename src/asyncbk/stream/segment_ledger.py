"""A segment ledger's life, in one place: create it (with its stream's shape and
placement), count what a writer put in it, complete it, recover (fence and
describe) one whose writer is gone, fence it, discard it or delete it.

The writer, the adoption of staged ledgers, the namespace (deletion, truncation,
retention) and Spark's planner all go through these functions, given a
:class:`~asyncbk.stream.context.StreamContext`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..errors import BKError, NoSuchLedgerError
from ..tiered.reader import open_offloaded
from .codec import Batch, decode
from .context import StreamContext
from .meta import COMPLETED, Segment, StreamConfig, placement_spec

if TYPE_CHECKING:
    from ..client.ledger import LedgerHandle, ReadHandle
    from ..types import LedgerEntry

STREAM_KEY = "asyncbk.stream"
"""Custom ledger metadata: ``namespace/stream`` of the stream the ledger belongs to."""
SEGMENT_KEY = "asyncbk.segment"
"""Custom ledger metadata: the segment number (a writer's segment)."""
STAGED_BY_KEY = "asyncbk.staged-by"
"""Custom ledger metadata: the owner of a staged ledger (see :mod:`asyncbk.stream.adopt`)."""


async def _create(ctx: StreamContext, stream: str, config: StreamConfig,
                  tag: tuple[str, bytes]) -> LedgerHandle:
    return await ctx.ledgers.create_ledger(
        config.ensemble_size, config.write_quorum, config.ack_quorum, digest=config.digest,
        metadata={STREAM_KEY: f"{ctx.namespace}/{stream}".encode(), tag[0]: tag[1]},
        placement=placement_spec(config))


async def create_segment_ledger(ctx: StreamContext, stream: str, config: StreamConfig,
                 seq: int) -> LedgerHandle:
    """A new ledger for segment ``seq`` of ``stream`` (shape and placement from
    ``config``)."""
    return await _create(ctx, stream, config, (SEGMENT_KEY, str(seq).encode()))


async def create_staged_ledger(ctx: StreamContext, stream: str, config: StreamConfig,
                        owner: str) -> LedgerHandle:
    """A new ledger staged for ``stream`` by ``owner`` (not a segment yet)."""
    return await _create(ctx, stream, config, (STAGED_BY_KEY, owner.encode()))


class Tally:
    """What a writer has put in its open segment (pure state): records and their bytes
    as they are sent, and the place of the last record acknowledged."""

    __slots__ = ("first_ts", "first_txid", "last_entry", "last_slot", "last_ts", "last_txid",
                 "records", "size_bytes")

    def __init__(self) -> None:
        self.records = 0
        self.size_bytes = 0
        self.first_txid = -1
        self.last_txid = -1
        self.last_entry = -1
        self.last_slot = -1
        self.first_ts = -1
        self.last_ts = -1

    def sent(self, txids: Sequence[int], nbytes: int, first_ts: int, last_ts: int) -> None:
        """An entry of ``txids`` (``nbytes`` bytes of records, timestamps ``first_ts``
        to ``last_ts``) was sent."""
        if self.first_txid < 0:
            self.first_txid = txids[0]
            self.first_ts = first_ts
        self.last_txid = txids[-1]
        self.last_ts = last_ts
        self.records += len(txids)
        self.size_bytes += nbytes

    def acked(self, entry_id: int, records: int) -> None:
        """Entry ``entry_id``, holding ``records`` records, was acknowledged."""
        self.last_entry = entry_id
        self.last_slot = records - 1

    def completed(self, seg: Segment, completion_ms: int) -> Segment:
        """``seg`` described completed with what was counted."""
        return dataclasses.replace(
            seg, state=COMPLETED, records=self.records, first_txid=self.first_txid,
            last_txid=self.last_txid, last_entry=self.last_entry, last_slot=self.last_slot,
            size_bytes=self.size_bytes, completion_ms=completion_ms,
            first_ts_ms=self.first_ts, last_ts_ms=self.last_ts)


async def complete_segment(ctx: StreamContext, lh: LedgerHandle, seg: Segment, tally: Tally) -> Segment:
    """Close the writer's ledger (every entry sent must be acknowledged) and describe
    its segment completed (not yet committed)."""
    await lh.close()
    return tally.completed(seg, ctx.now_ms())


class Recovered(NamedTuple):
    segment: Segment
    """The segment, described completed (not yet committed)."""
    ended: bool
    """Its last entry ends the stream."""


async def recover_segment(ctx: StreamContext, seg: Segment) -> Recovered:
    """Fence and close an open segment's ledger (its writer, alive or dead, can get
    nothing more acknowledged) and describe the segment completed: record count,
    txids, last position (from its first and last entries).  Also whether its last
    entry ends the stream."""
    try:
        rh = await ctx.ledgers.open_ledger(seg.ledger_id, password=b"", recovery=True)
    except NoSuchLedgerError:  # created, then lost before any write (deleted)
        return Recovered(dataclasses.replace(seg, state=COMPLETED,
                                             completion_ms=ctx.now_ms()), False)
    md = rh.metadata
    last = md.last_entry_id
    completed = dataclasses.replace(seg, state=COMPLETED, size_bytes=md.length,
                                    completion_ms=ctx.now_ms())
    if last < 0:
        return Recovered(completed, False)
    where = f"stream {ctx.namespace}/{seg.seq}"
    ended = False
    entry = last
    while entry >= 0:
        batch = decode_entry(seg, (await rh.read(entry, entry))[0].data, f"{where}:{entry}")
        ended = ended or (entry == last and batch.end_of_stream)
        if batch.count:
            first = decode_entry(seg, (await rh.read(0, 0))[0].data, f"{where}:0")
            head = first if first.count else batch
            return Recovered(dataclasses.replace(
                completed, records=batch.records_before + batch.count,
                first_txid=head.txids[0], last_txid=batch.txids[-1], last_entry=entry,
                last_slot=batch.count - 1, first_ts_ms=head.timestamps[0],
                last_ts_ms=batch.timestamps[-1]), ended)
        entry -= 1
    return Recovered(completed, ended)


def decode_entry(seg: Segment, payload: bytes, where: str) -> Batch:
    """An entry of ``seg``'s ledger: its records with the segment's times (version-1
    entries take the segment's creation time; adopted ones are raised to its floor)."""
    batch = decode(payload, where, seg.ctime_ms)
    return batch.floored(seg.ts_floor_ms) if seg.ts_floor_ms else batch


async def fence_ledger(ctx: StreamContext, ledger_id: int) -> None:
    """Fence and close a segment's ledger (a ledger that is gone is left so)."""
    try:
        await ctx.ledgers.open_ledger(ledger_id, recovery=True)
    except NoSuchLedgerError:
        pass


async def open_for_read(ctx: StreamContext, ledger_id: int) -> ReadHandle:
    """A read handle on a segment's ledger that neither fences nor closes it
    (NoSuchLedgerError if it is gone)."""
    return await ctx.ledgers.open_ledger(ledger_id, recovery=False)


class LedgerView(Protocol):
    """What readers look at in a ledger's metadata."""

    @property
    def is_closed(self) -> bool: ...

    @property
    def last_entry_id(self) -> int: ...


class SegmentEntries(Protocol):
    """The entries of a segment, wherever they are: a ledger's read handle, or an
    offloaded segment's reader (:class:`~asyncbk.tiered.reader.ObjectSegmentReader`)."""

    @property
    def metadata(self) -> LedgerView: ...

    @property
    def last_add_confirmed(self) -> int: ...

    async def read(self, first_entry: int, last_entry: int) -> list[LedgerEntry]: ...

    async def read_unconfirmed(self, first_entry: int, last_entry: int) -> list[LedgerEntry]: ...

    def tail(self, start: int = 0, poll_s: float = 1.0) -> AsyncIterator[LedgerEntry]: ...


async def open_segment(ctx: StreamContext, seg: Segment) -> SegmentEntries:
    """The entries of ``seg``: its ledger's, or, once it is offloaded, its object's (with
    the ledger as the fallback while it is still on the bookies).  NoSuchLedgerError if
    it is on the bookies only and its ledger is gone."""
    if seg.offload is None:
        return await open_for_read(ctx, seg.ledger_id)

    async def bookies() -> ReadHandle:
        return await open_for_read(ctx, seg.ledger_id)

    return await open_offloaded(ctx.objects, seg.offload, seg.ledger_id, bookies,
                                size_bytes=seg.size_bytes, timeout_s=ctx.object_read_timeout_s,
                                sleep=ctx.clock.sleep,
                                log=ctx.log(segment=seg.seq, ledger_id=seg.ledger_id))


async def reread_segment(ctx: StreamContext, stream: str, seq: int) -> Segment | None:
    """Segment ``seq`` as the metadata has it now (None: gone)."""
    got = await ctx.md.segments(ctx.namespace, stream, from_seq=seq, limit=1)
    return got[0] if got and got[0].seq == seq else None


def durable_end(rh: SegmentEntries) -> int:
    """The last entry of a ledger that readers may take as final: a closed ledger's
    last entry, an open one's LAC."""
    md = rh.metadata
    return md.last_entry_id if md.is_closed else rh.last_add_confirmed


async def discard_ledger(ctx: StreamContext, lh: LedgerHandle) -> None:
    """A segment ledger that never made it into the metadata: close and delete it (a
    failure to delete is logged, not raised)."""
    await lh.close_quietly()
    try:
        await ctx.ledgers.delete_ledger(lh.id)
    except BKError as exc:
        ctx.log().warning("could not delete an unused segment ledger", ledger_id=lh.id,
                          error=str(exc))


async def delete_segment_data(ctx: StreamContext, seg: Segment) -> None:
    """Delete a dropped segment's ledger and, if it was offloaded, its object (a
    failure to delete the object is logged: the offloader's sweep removes objects no
    segment names)."""
    if seg.offload is None or not seg.offload.ledger_deleted_ms:
        await delete_ledger(ctx, seg.ledger_id)
    if seg.offload is not None:
        try:
            store = await ctx.objects.get(seg.offload.store)
            await store.delete(seg.offload.key)
        except BKError as exc:
            ctx.log().warning("could not delete a dropped segment's object; the offloader's "
                              "sweep will", segment=seg.seq,
                              object=f"{seg.offload.store}/{seg.offload.key}", error=str(exc))


async def delete_ledger(ctx: StreamContext, ledger_id: int) -> None:
    """Delete a segment's ledger (one that is gone already is fine)."""
    try:
        await ctx.ledgers.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass
