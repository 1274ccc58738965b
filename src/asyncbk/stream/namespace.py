"""Namespaces: groups of streams sharing defaults (``bk.namespace(name)``)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..clock import LOOP_CLOCK, Clock
from ..errors import EndOfStreamError, MetadataVersionError, NoSuchStreamError
from .adopt import sweep
from .context import StreamContext
from .meta import (
    BOOKIES,
    StreamConfig,
    StreamMeta,
    StreamMetadata,
    check_stream_name,
    config_from,
)
from .position import Position
from .reader import StreamReader, StreamRecord, resolve_start
from .retention import apply_retention, drop_segments, segments_before
from .segment_ledger import delete_segment_data, fence_ledger
from .stats import StreamStats
from .subscription import Subscription, SubscriptionInfo, infos, seek, subscribe
from .subscription import delete as delete_subscription
from .writer import StreamWriter, WriterOptions, open_writer

if TYPE_CHECKING:
    from ..client.client import BookKeeper


@dataclass(frozen=True)
class SegmentInfo:
    seq: int
    ledger_id: int
    state: str
    first_position: Position
    last_position: Position | None
    first_txid: int
    last_txid: int
    records: int
    start_sequence: int
    size_bytes: int
    ctime_ms: int
    completion_ms: int
    first_timestamp_ms: int | None = None
    """Its first record's timestamp (None: open, or no record)."""
    last_timestamp_ms: int | None = None
    """Its last record's timestamp (None: open, or no record)."""
    storage: str = BOOKIES
    """``"bookies"``, ``"bookies+object"`` (offloaded, its ledger not yet deleted) or
    ``"object"``."""
    object: str | None = None
    """Its object (``s3://bucket/prefix/key``) once offloaded."""


@dataclass(frozen=True)
class StreamInfo:
    namespace: str
    stream: str
    config: StreamConfig
    ended: bool
    segments: list[SegmentInfo]
    first_position: Position | None
    """Where the stream starts now (None: no segment yet)."""
    last_position: Position | None
    """The last record of the completed segments (records of the open segment are
    not counted here: ask a reader)."""


class Namespace:
    """A namespace of streams.  Get one with ``await bk.namespace(name)``.

    It gives its writers, readers and the rest of the stream layer a
    :class:`~asyncbk.stream.context.StreamContext` (:attr:`context`), never itself.
    ``rng``: the random generator of back-off jitter (the client's, when it was given
    one; else a fresh one)."""

    def __init__(self, bk: BookKeeper, name: str, defaults: StreamConfig,
                 stats: StreamStats, clock: Clock = LOOP_CLOCK, *,
                 rng: random.Random | None = None) -> None:
        self.bk = bk
        self.name = name
        self.defaults = defaults
        self.stats = stats
        self.clock = clock
        self.context = StreamContext.create(bk, name, defaults, stats=stats, rng=rng,
                                            clock=clock)
        """What this namespace's writers, readers and staged writers are given."""
        self.md: StreamMetadata = self.context.md
        self._log = self.context.log()

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"

    # ------------------------------------------------------------------ streams

    async def create_stream(self, name: str, **overrides: Any) -> None:
        """A new, empty stream; ``overrides`` replace the namespace's defaults for it
        (ledger shape, rolling, retention, placement)."""
        check_stream_name(name)
        config_from(overrides, self.defaults, f"stream {name!r}")  # checked before storing
        await self.md.create_stream(self.name, name, overrides,
                                    int(self.clock.wall_s() * 1000))
        self._log.info("stream created", stream=name, overrides=overrides)

    async def stream_exists(self, name: str) -> bool:
        try:
            await self.md.stream(self.name, name)
        except NoSuchStreamError:
            return False
        return True

    async def list_streams(self, prefix: str = "") -> AsyncIterator[str]:
        for name in await self.md.list_streams(self.name, prefix):
            yield name

    async def stream_config(self, sm: StreamMeta) -> StreamConfig:
        return self.context.stream_config(sm)

    async def delete_stream(self, name: str) -> None:
        """Fence the stream's writer, remove the stream, then its segments' ledgers."""
        sm = await self.md.stream(self.name, name)
        segs = await self.md.segments(self.name, name)
        for seg in segs:
            if not seg.completed:
                await fence_ledger(self.context, seg.ledger_id)
        while True:
            try:
                await self.md.delete_stream(sm)
                break
            except MetadataVersionError:  # a writer rolled meanwhile: fence that one too
                sm = await self.md.stream(self.name, name)
                segs = await self.md.segments(self.name, name)
                for seg in segs:
                    if not seg.completed:
                        await fence_ledger(self.context, seg.ledger_id)
        for seg in segs:
            await delete_segment_data(self.context, seg)
        await sweep(self.context, name)  # ledgers staged for it by Spark tasks
        self._log.info("stream deleted", stream=name, segments=len(segs))

    # ------------------------------------------------------------------ writing

    async def open_writer(self, name: str, **options: Any) -> StreamWriter:
        """Take the stream over: fence and complete its open segment (an older writer
        gets WriterFencedError) and start a new one.  ``options``: WriterOptions."""
        check_stream_name(name)
        # (A record, with the batch header, must fit in one ledger entry: open_writer.)
        return await open_writer(self.context, name, WriterOptions(**options))

    # ------------------------------------------------------------------ reading

    async def open_reader(self, name: str, start: Position | None = None, *,
                          txid: int | None = None, timestamp_ms: int | None = None,
                          readahead_entries: int = 32) -> StreamReader:
        """A reader from ``start`` (a Position, ``Position.EARLIEST`` (default) or
        ``Position.LATEST``), from the first record with a txid >= ``txid``, or from
        the first record with a timestamp >= ``timestamp_ms`` (exactly: stream times
        never decrease)."""
        check_stream_name(name)
        pos = await resolve_start(self.context, name, start, txid, timestamp_ms)
        return StreamReader(self.context, name, pos, readahead_entries)

    async def read(self, name: str, start: Position | None = None, *,
                   txid: int | None = None,
                   timestamp_ms: int | None = None) -> AsyncIterator[StreamRecord]:
        """Every record from ``start`` (or ``txid``, or ``timestamp_ms``) on, tailing
        forever (break to stop); ends after the last record of an ended stream."""
        reader = await self.open_reader(name, start, txid=txid, timestamp_ms=timestamp_ms)
        try:
            while True:
                try:
                    rec = await reader.read_next()
                except EndOfStreamError:
                    return
                yield rec
        finally:
            await reader.close()

    # ------------------------------------------------------------------ truncation

    async def truncate(self, name: str, before: Position, force: bool = False) -> int:
        """Drop the completed segments that lie wholly before ``before`` (never the open
        one), with their ledgers, as far as the stream's subscriptions have
        acknowledged them (or their backlog quota lets them go); ``force``: regardless
        of subscriptions.  Returns how many were dropped."""
        if not isinstance(before, Position) or before.is_marker():
            raise TypeError("truncate needs a real Position (from a record or Position.parse)")
        return await drop_segments(self.context, name, segments_before(before), "truncated",
                                   force=force)

    # ------------------------------------------------------------------ subscriptions

    async def subscribe(self, stream: str, name: str, start: Position | None = None, *,
                        timestamp_ms: int | None = None,
                        readahead_entries: int = 32) -> Subscription:
        """The consumer of the subscription ``name`` of ``stream``: created at ``start``
        (``Position.EARLIEST`` (default), ``Position.LATEST``, a position, or the first
        record at or after ``timestamp_ms``) if it does not exist; else taken over
        (the previous consumer is fenced) and resumed after its last persisted ack."""
        check_stream_name(stream)
        return await subscribe(self.context, stream, name,
                                            start if start is not None or timestamp_ms
                                            is not None else Position.EARLIEST,
                                            timestamp_ms, readahead_entries)

    async def subscriptions(self, stream: str) -> list[SubscriptionInfo]:
        """The subscriptions of ``stream`` with their position and lag."""
        check_stream_name(stream)
        return await infos(self.context, stream)

    async def seek_subscription(self, stream: str, name: str, position: Position | None = None,
                                *, timestamp_ms: int | None = None) -> Position:
        """Move a subscription to ``position`` (a position, ``Position.EARLIEST`` or
        ``Position.LATEST``) or to the first record at or after ``timestamp_ms``, back
        or forth; its consumer is fenced and subscribes again.  Returns the position."""
        check_stream_name(stream)
        return await seek(self.context, stream, name, position, timestamp_ms)

    async def delete_subscription(self, stream: str, name: str) -> None:
        """Remove a subscription: retention no longer waits for it."""
        check_stream_name(stream)
        await delete_subscription(self.context, stream, name)

    async def apply_retention(self, target: StreamWriter | str, quiet: bool = False) -> int:
        """Drop completed segments completed longer ago than the stream's
        ``retention_s`` (0: keep them).  The writer calls it when it opens and rolls."""
        if isinstance(target, str):
            return await apply_retention(self.context, target, quiet=quiet)
        return await apply_retention(self.context, target.stream, target, quiet=quiet)

    # ------------------------------------------------------------------ info

    async def stream_info(self, name: str) -> StreamInfo:
        sm = await self.md.stream(self.name, name)
        segs = await self.md.segments(self.name, name)
        infos = [SegmentInfo(s.seq, s.ledger_id, s.state, s.first_position, s.last_position,
                             s.first_txid, s.last_txid, s.records, s.start_sequence, s.size_bytes,
                             s.ctime_ms, s.completion_ms,
                             s.first_ts if s.completed and s.records else None,
                             s.last_ts if s.completed and s.records else None, s.storage,
                             s.offload.object_uri if s.offload else None) for s in segs]
        last = next((s.last_position for s in reversed(segs) if s.last_position is not None),
                    None)
        return StreamInfo(self.name, name, await self.stream_config(sm), sm.ended, infos,
                          segs[0].first_position if segs else None, last)

    async def delete(self, force: bool = False) -> None:
        """Delete this namespace: it must be empty, unless ``force`` (then every stream
        in it is deleted first)."""
        if force:
            async for name in self.list_streams():
                await self.delete_stream(name)
        await self.md.delete_namespace(self.name)
        self._log.info("namespace deleted")

