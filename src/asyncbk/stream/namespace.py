"""Namespaces: groups of streams sharing defaults (``bk.namespace(name)``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..client.client import PlacementSpec
from ..client.ledger import FRAME_OVERHEAD_BYTES_MAX
from ..clock import LOOP_CLOCK, Clock
from ..errors import (
    BKError,
    EndOfStreamError,
    MetadataVersionError,
    NoSuchLedgerError,
    NoSuchStreamError,
)
from ..log import get_logger
from . import codec
from .meta import (
    Segment,
    StreamConfig,
    StreamMeta,
    StreamMetadata,
    check_stream_name,
    config_from,
)
from .position import Position
from .reader import StreamReader, StreamRecord, resolve_start
from .stats import StreamStats
from .writer import StreamWriter, WriterOptions, open_writer

if TYPE_CHECKING:
    from ..client.client import BookKeeper
    from ..client.ledger import LedgerHandle


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


def placement_spec(config: StreamConfig) -> PlacementSpec | None:
    """How the ledgers of a stream with ``config`` are placed (None: as the client
    places any ledger)."""
    given = config.placement
    return PlacementSpec(**given) if given else None


class Namespace:
    """A namespace of streams.  Get one with ``await bk.namespace(name)``."""

    def __init__(self, bk: BookKeeper, name: str, defaults: StreamConfig,
                 stats: StreamStats, clock: Clock = LOOP_CLOCK) -> None:
        self.bk = bk
        self.name = name
        self.defaults = defaults
        self.md = StreamMetadata(bk.meta)
        self.stats = stats
        self.clock = clock
        self._log = get_logger(namespace=name)

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
        return self.defaults.with_overrides(sm.overrides)

    async def delete_stream(self, name: str) -> None:
        """Fence the stream's writer, remove the stream, then its segments' ledgers."""
        sm = await self.md.stream(self.name, name)
        segs = await self.md.segments(self.name, name)
        for seg in segs:
            if not seg.completed:
                await self._fence(seg)
        while True:
            try:
                await self.md.delete_stream(sm)
                break
            except MetadataVersionError:  # a writer rolled meanwhile: fence that one too
                sm = await self.md.stream(self.name, name)
                segs = await self.md.segments(self.name, name)
                for seg in segs:
                    if not seg.completed:
                        await self._fence(seg)
        for seg in segs:
            await self._delete_ledger(seg.ledger_id)
        from .adopt import sweep  # ledgers staged for it by Spark tasks

        await sweep(self, name)
        self._log.info("stream deleted", stream=name, segments=len(segs))

    async def _fence(self, seg: Segment) -> None:
        try:
            await self.bk.open_ledger(seg.ledger_id, recovery=True)
        except NoSuchLedgerError:
            pass

    async def _delete_ledger(self, ledger_id: int) -> None:
        try:
            await self.bk.delete_ledger(ledger_id)
        except NoSuchLedgerError:
            pass

    # ------------------------------------------------------------------ writing

    async def open_writer(self, name: str, **options: Any) -> StreamWriter:
        """Take the stream over: fence and complete its open segment (an older writer
        gets WriterFencedError) and start a new one.  ``options``: WriterOptions."""
        check_stream_name(name)
        opts = WriterOptions(**options).validate()
        # A record (with the batch header) must fit in one ledger entry.
        fit = self.bk.config.frame_bytes_max - FRAME_OVERHEAD_BYTES_MAX \
            - codec.HEADER_BYTES - codec.RECORD_OVERHEAD_BYTES
        if opts.record_bytes_max > fit:
            raise ValueError(f"record_bytes_max {opts.record_bytes_max} exceeds what one "
                             f"ledger entry carries ({fit} bytes, from frame_bytes_max)")
        return await open_writer(self, name, opts)

    async def create_segment_ledger(self, stream: str, config: StreamConfig,
                                    seq: int) -> LedgerHandle:
        return await self.bk.create_ledger(
            config.ensemble_size, config.write_quorum, config.ack_quorum, digest=config.digest,
            metadata={"asyncbk.stream": f"{self.name}/{stream}".encode(),
                      "asyncbk.segment": str(seq).encode()},
            placement=placement_spec(config))

    async def discard_ledger(self, lh: LedgerHandle) -> None:
        """A segment ledger that never made it into the metadata: remove it."""
        await lh.close_quietly()
        try:
            await self.bk.delete_ledger(lh.id)
        except BKError as exc:
            self._log.warning("could not delete an unused segment ledger", ledger_id=lh.id,
                              error=str(exc))

    # ------------------------------------------------------------------ reading

    async def open_reader(self, name: str, start: Position | None = None, *,
                          txid: int | None = None, readahead_entries: int = 32) -> StreamReader:
        """A reader from ``start`` (a Position, ``Position.EARLIEST`` (default) or
        ``Position.LATEST``) or from the first record with a txid >= ``txid``."""
        check_stream_name(name)
        pos = await resolve_start(self, name, start, txid)
        return StreamReader(self, name, pos, readahead_entries)

    async def read(self, name: str, start: Position | None = None, *,
                   txid: int | None = None) -> AsyncIterator[StreamRecord]:
        """Every record from ``start`` on, tailing forever (break to stop); ends after
        the last record of an ended stream."""
        reader = await self.open_reader(name, start, txid=txid)
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

    async def truncate(self, name: str, before: Position) -> int:
        """Drop the completed segments that lie wholly before ``before`` (never the open
        one), with their ledgers.  Returns how many were dropped."""
        if not isinstance(before, Position) or before.is_marker():
            raise TypeError("truncate needs a real Position (from a record or Position.parse)")
        return await self._drop(name, lambda s: s.completed and (
            s.last_position is None and s.seq < before.segment
            or s.last_position is not None and s.last_position < before), "truncated")

    async def apply_retention(self, target: StreamWriter | str, quiet: bool = False) -> int:
        """Drop completed segments completed longer ago than the stream's
        ``retention_s`` (0: keep them).  The writer calls it when it opens and rolls."""
        name = target if isinstance(target, str) else target.stream
        sm = await self.md.stream(self.name, name)
        retention_s = (await self.stream_config(sm)).retention_s
        if not retention_s:
            return 0
        horizon_ms = (self.clock.wall_s() - retention_s) * 1000
        try:
            return await self._drop(
                name, lambda s: s.completed and s.completion_ms < horizon_ms, "expired",
                writer=None if isinstance(target, str) else target)
        except BKError as exc:
            if not quiet:
                raise
            self._log.warning("retention failed; will try again at the next roll",
                              stream=name, error=str(exc))
            return 0

    async def _drop(self, name: str, doomed: Any, why: str,
                    writer: StreamWriter | None = None) -> int:
        while True:
            sm = writer.stream_meta if writer is not None else await self.md.stream(self.name, name)
            segs = await self.md.segments(self.name, name)
            drop = [s for s in segs[:-1] if doomed(s)]  # never the last segment
            if not drop:
                return 0
            try:
                new_sm, _ = await self.md.commit(sm, drop=drop)
            except MetadataVersionError:
                if writer is not None and \
                        not writer._take_sm(await self.md.stream(self.name, name)):
                    return 0  # another writer opened the stream: not ours to trim
                continue
            if writer is not None:
                writer._take_sm(new_sm)
            for s in drop:
                await self._delete_ledger(s.ledger_id)
            self._log.info(f"segments {why}", stream=name, segments=[s.seq for s in drop])
            return len(drop)

    # ------------------------------------------------------------------ info

    async def stream_info(self, name: str) -> StreamInfo:
        sm = await self.md.stream(self.name, name)
        segs = await self.md.segments(self.name, name)
        infos = [SegmentInfo(s.seq, s.ledger_id, s.state, s.first_position, s.last_position,
                             s.first_txid, s.last_txid, s.records, s.start_sequence, s.size_bytes,
                             s.ctime_ms, s.completion_ms) for s in segs]
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

