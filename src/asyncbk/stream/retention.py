"""Dropping a stream's completed segments from the front: truncation (before a
position) and retention (completed longer ago than ``retention_s``).

One metadata transaction removes the segment records (never the last segment's),
then their ledgers are deleted.  A writer that trims its own stream (it applies
retention when it opens and at each roll) passes itself as the *holder* of the
stream record: the transaction uses the holder's record, and the holder takes the
fresh one after, so the writer's next change of the segments does not conflict
with its own trimming.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ..errors import BKError, MetadataVersionError
from .context import StreamContext
from .meta import Segment, StreamMeta
from .position import Position
from .segment_ledger import delete_segment_data
from .subscription import infos, let_go, report_release


class StreamHolder(Protocol):
    """A writer, as far as trimming its stream goes."""

    @property
    def stream_meta(self) -> StreamMeta:
        """The stream record the writer holds (the version it read last)."""
        ...

    def take_stream_meta(self, sm: StreamMeta) -> bool:
        """Take a fresher stream record, unless another writer opened the stream
        since (then False)."""
        ...


def segments_before(position: Position) -> Callable[[Segment], bool]:
    """Completed segments that lie wholly before ``position``."""
    return lambda s: s.completed and (
        s.last_position is None and s.seq < position.segment
        or s.last_position is not None and s.last_position < position)


async def drop_segments(ctx: StreamContext, stream: str, doomed: Callable[[Segment], bool], why: str,
               holder: StreamHolder | None = None, force: bool = False) -> int:
    """Remove the segments ``doomed`` says (never the last one) and their ledgers,
    as far as the stream's subscriptions let them go (unless ``force``:
    :func:`asyncbk.stream.subscription.let_go`); returns how many.  With a
    ``holder`` whose stream another writer has opened since, nothing (0)."""
    while True:
        sm = holder.stream_meta if holder is not None else await ctx.md.stream(ctx.namespace,
                                                                               stream)
        segs = await ctx.md.segments(ctx.namespace, stream)
        asked = [s for s in segs[:-1] if doomed(s)]  # never the last segment
        released = None
        gone = asked
        if asked and not force:
            # (A subscription created or sought after this read rewrites the stream
            # record: the commit below then fails and this reads again.)
            released = await let_go(ctx, stream, segs, asked)
            gone = released.segments
        if not gone:
            if released is not None:
                report_release(ctx, stream, released, asked)
            return 0
        try:
            new_sm, _ = await ctx.md.commit(sm, drop=gone)
        except MetadataVersionError:
            if holder is not None and \
                    not holder.take_stream_meta(await ctx.md.stream(ctx.namespace, stream)):
                return 0  # another writer opened the stream: not ours to trim
            continue
        if holder is not None:
            holder.take_stream_meta(new_sm)
        if released is not None:
            report_release(ctx, stream, released, asked)
        for s in gone:
            await delete_segment_data(ctx, s)
        ctx.log().info(f"segments {why}", stream=stream, segments=[s.seq for s in gone])
        return len(gone)


async def apply_retention(ctx: StreamContext, stream: str, holder: StreamHolder | None = None,
                quiet: bool = False) -> int:
    """Drop the completed segments completed longer ago than the stream's
    ``retention_s`` (0: keep them); returns how many.  ``quiet``: a failure is
    logged (the next roll tries again), not raised."""
    sm = await ctx.md.stream(ctx.namespace, stream)
    retention_s = ctx.stream_config(sm).retention_s
    if not retention_s:
        return 0
    horizon_ms = (ctx.clock.wall_s() - retention_s) * 1000
    try:
        dropped = await drop_segments(
            ctx, stream, lambda s: s.completed and s.completion_ms < horizon_ms, "expired",
            holder)
        await infos(ctx, stream)  # the subscriptions' lag, for this process's metrics
        return dropped
    except BKError as exc:
        if not quiet:
            raise
        ctx.log().warning("retention failed; will try again at the next roll",
                          stream=stream, error=str(exc))
        return 0
