"""Subscriptions: durable, named cursors on a stream (``ns.subscribe``).

**Storage.**  One metadata key per subscription
(``<root>/streams/sub/<ns>/<stream>/<name>``, :mod:`asyncbk.meta.keys`) holds a
msgpack map: the *resume position* (the first record not yet acknowledged), the
consumer *epoch*, and when it was created and last written.  Every change is a
compare-and-swap on the version read:

- a consumer persists its acknowledgements (at most once per
  ``subscription_ack_interval_s``, or at ``flush``/``close``) only while the key
  is still at the version it wrote last: a consumer that was taken over, or whose
  subscription was sought or deleted, finds the version moved, re-reads, sees
  another epoch (or no key) and is *fenced*: it persists nothing more, its acks
  raise SubscriptionFencedError, so no ack of a fenced consumer moves the
  cursor;
- ``subscribe`` of an existing name bumps the epoch (taking it over), and of a
  new name creates the key; creating it and ``seek_subscription`` (which may move
  it backwards) also rewrite the stream record in the same transaction, so a
  retention pass that read the subscriptions before them and drops segments after
  fails its own transaction (it compares the stream record) and reads again: a
  segment is never dropped under a cursor it did not see;
- the position persisted only grows (acks are cumulative, checked against what
  was delivered: :mod:`asyncbk.stream.cursor`), except by an explicit seek.

A consumer that crashes resumes from the last persisted position: every record
after it is delivered again (at least once), none before it is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import weakref
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import (
    BKError,
    ConfigError,
    EndOfStreamError,
    InvalidNameError,
    MetadataVersionError,
    NoSuchSubscriptionError,
    SubscriptionFencedError,
)
from ..meta import keys
from .context import StreamContext
from .cursor import CursorState, Release, release
from .meta import Segment, StreamMeta
from .position import Position
from .reader import StreamReader, StreamRecord, resolve_start
from .segment_ledger import decode_entry, durable_end, open_for_read, open_segment

SUBSCRIPTION_NAME_BYTES_MAX = 128


def check_subscription_name(name: object) -> str:
    """Subscription names: 1 to 128 bytes, no control characters, not only spaces."""
    if not isinstance(name, str):
        raise InvalidNameError(f"a subscription name is a str, not {type(name).__name__}")
    if not name.strip():
        raise InvalidNameError("a subscription name cannot be empty or only spaces")
    if len(name.encode()) > SUBSCRIPTION_NAME_BYTES_MAX:
        raise InvalidNameError(f"subscription name longer than {SUBSCRIPTION_NAME_BYTES_MAX} "
                               "bytes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise InvalidNameError(f"bad subscription name {name!r}: control characters")
    return name


@dataclass(frozen=True, slots=True)
class CursorRecord:
    """A subscription as stored."""

    name: str
    position: Position
    """The resume position: the first record not yet acknowledged."""
    epoch: int = 0
    ctime_ms: int = 0
    mtime_ms: int = 0
    version: int = 0

    def to_bytes(self) -> bytes:
        p = self.position
        return msgpack.packb({"position": [p.segment, p.entry, p.slot], "epoch": self.epoch,
                              "ctime_ms": self.ctime_ms, "mtime_ms": self.mtime_ms},
                             use_bin_type=True)

    @classmethod
    def from_value(cls, name: str, value: bytes, version: int, where: str) -> CursorRecord:
        try:
            d = msgpack.unpackb(value, raw=False)
            seg, entry, slot = d["position"]
            return cls(name, Position(int(seg), int(entry), int(slot)), int(d.get("epoch", 0)),
                       int(d.get("ctime_ms", 0)), int(d.get("mtime_ms", 0)), version)
        except Exception as exc:
            raise ConfigError(f"{where}: undecodable subscription record ({exc})") from None


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """A subscription and how far behind it is (``ns.subscriptions(stream)``)."""

    name: str
    position: Position
    """Where it resumes: the first record not yet acknowledged."""
    lag_records: int
    """Durable records from ``position`` to the end of the stream."""
    lag_bytes: int
    """Their bytes: exact over whole segments, estimated (pro rata) inside the one it
    is in and the open one."""
    lag_s: float
    """Age of the first record not yet acknowledged (0 when none is waiting)."""
    epoch: int
    """Consumers that subscribed (or seeks) so far: a takeover bumps it."""
    ctime_ms: int
    mtime_ms: int
    """When its position was last written."""
    truncated: bool
    """Its position was dropped (backlog quota, forced truncation): its consumer's next
    read raises TruncatedError until it is sought."""


# ------------------------------------------------------------------ the store


def _key(ctx: StreamContext, stream: str, name: str) -> str:
    return keys.subscription(ctx.md.root, ctx.namespace, stream, name)


async def read_cursor(ctx: StreamContext, stream: str, name: str) -> CursorRecord | None:
    kv = await ctx.md.meta.kv_get(_key(ctx, stream, name))
    if kv is None:
        return None
    return CursorRecord.from_value(name, kv.value, kv.version, kv.key)


async def read_cursors(ctx: StreamContext, stream: str) -> list[CursorRecord]:
    """Every subscription of ``stream``, by name."""
    prefix = keys.subscriptions_prefix(ctx.md.root, ctx.namespace, stream)
    out: list[CursorRecord] = []
    after: str | None = None
    while True:
        page = await ctx.md.meta.kv_range(prefix, after=after, limit=1000)
        for kv in page:
            name = keys.subscription_from_key(ctx.md.root, ctx.namespace, stream, kv.key)
            out.append(CursorRecord.from_value(name, kv.value, kv.version, kv.key))
        if len(page) < 1000:
            return out
        after = page[-1].key


async def _resolve(ctx: StreamContext, stream: str, position: Position | None,
                   timestamp_ms: int | None) -> Position:
    if position is not None and not isinstance(position, Position):
        raise TypeError(f"position must be a Position, not {type(position).__name__}")
    return await resolve_start(ctx, stream, position, None, timestamp_ms)


async def _write_with_stream(ctx: StreamContext, stream: str, rec: CursorRecord,
                             expected_version: int) -> int:
    """Write ``rec`` if its key is at ``expected_version`` (0: absent), rewriting the
    stream record in the same transaction (see the module docstring); the new
    version.  MetadataVersionError if either moved."""
    key = _key(ctx, stream, rec.name)
    sm: StreamMeta = await ctx.md.stream(ctx.namespace, stream)
    new_sm, _ = await ctx.md.commit(sm, also_compare=[(key, expected_version)],
                                    also_put=[(key, rec.to_bytes())])
    return new_sm.version


# ------------------------------------------------------------------ one consumer

_LIVE: dict[tuple[Any, ...], weakref.ref[Subscription]] = {}
"""The consumers of this process, by cluster and name: a takeover in this process
fences the one it replaces at once (other processes' learn it at their next
persistence)."""


class Subscription:
    """One consumer of a subscription (see the module docstring).  Get one with
    ``await ns.subscribe(stream, name)``; iterate it, ``ack`` what was handled,
    ``close`` it (or use ``async with``)."""

    def __init__(self, ctx: StreamContext, stream: str, record: CursorRecord,
                 ack_interval_s: float, live_key: tuple[Any, ...],
                 readahead_entries: int = 32) -> None:
        self._ctx = ctx
        self.namespace = ctx.namespace
        self.stream = stream
        self.name = record.name
        self.epoch = record.epoch
        self._version = record.version
        self._key = _key(ctx, stream, record.name)
        self._state = CursorState(record.position)
        self._ctime_ms = record.ctime_ms
        self._interval_s = ack_interval_s
        self._log = ctx.log(stream=stream, subscription=record.name)
        self._lock = asyncio.Lock()
        self._live_key = live_key
        self._closed = False
        self._reader = StreamReader(ctx, stream, record.position, readahead_entries)
        self._task = asyncio.get_running_loop().create_task(self._persist_loop())

    # ------------------------------------------------------------------ public

    @property
    def position(self) -> Position:
        """Where a consumer resumes after the acknowledgements so far."""
        return self._state.acked

    @property
    def persisted_position(self) -> Position:
        """Where a consumer resumes after a crash now."""
        return self._state.persisted

    @property
    def fenced(self) -> bool:
        return self._state.fenced

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> StreamRecord:
        state = self._state
        if state.fenced:
            raise SubscriptionFencedError(state.why_fenced)
        rec = self._reader.take_ready()
        if rec is None:
            try:
                rec = await self._reader.read_next()
            except EndOfStreamError:
                raise StopAsyncIteration from None
        state.delivered(rec.position)
        return rec

    async def read_batch(self, n: int, wait_s: float) -> list[StreamRecord]:
        """Up to ``n`` records: those ready now, else the first to come within
        ``wait_s`` seconds (``[]`` if none came); each is delivered, to be acked."""
        state = self._state
        if state.fenced:
            raise SubscriptionFencedError(state.why_fenced)
        recs = await self._reader.read_batch(n, wait_s)
        delivered = state.delivered
        for rec in recs:
            delivered(rec.position)
        return recs

    async def read_next(self) -> StreamRecord:
        """The next record (waiting for it); SubscriptionFencedError once fenced."""
        state = self._state
        if state.fenced:
            raise SubscriptionFencedError(state.why_fenced)
        rec = self._reader.take_ready() or await self._reader.read_next()
        state.delivered(rec.position)
        return rec

    async def ack(self, position: Position) -> None:
        """Everything up to ``position`` (a record delivered) is handled: cumulative.
        Persisted within ``subscription_ack_interval_s`` (or by ``flush``)."""
        self._state.ack(position)

    async def flush(self) -> None:
        """Persist the acknowledgements now."""
        await self._persist()
        if self._state.fenced:
            raise SubscriptionFencedError(self._state.why_fenced)

    async def close(self) -> None:
        """Persist the last acknowledgement and stop (a fenced consumer persists
        nothing).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._task.cancel()
        try:
            await asyncio.wait([self._task])
            with contextlib.suppress(SubscriptionFencedError):
                await self._persist()
        finally:
            await self._stop_reading()

    async def abort(self) -> None:
        """Stop without persisting anything more (what a crash does): a new consumer
        resumes from the last position persisted."""
        if self._closed:
            return
        self._closed = True
        self._state.fence("aborted")
        self._task.cancel()
        await asyncio.wait([self._task])
        await self._stop_reading()

    async def _stop_reading(self) -> None:
        """Close the reader and leave this process's consumers."""
        await self._reader.close()
        ref = _LIVE.get(self._live_key)
        if ref is not None and ref() is self:
            del _LIVE[self._live_key]

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def fence(self, why: str) -> None:
        """Stop counting this consumer's acks (another consumer took over)."""
        if not self._state.fenced:
            self._state.fence(why)
            self._log.info("subscription fenced", why=why)

    # ------------------------------------------------------------------ internals

    async def _persist_loop(self) -> None:
        clock = self._ctx.clock
        interval = self._interval_s
        while not self._state.fenced:
            # On the interval's multiples of the clock: the consumers of a process
            # persist together, in shared transactions (BatchedCas).
            delay = interval - clock.monotonic_s() % interval
            if delay < interval / 100:  # (at a multiple already, give or take rounding)
                delay += interval
            await clock.sleep(delay)
            try:
                await self._persist()
            except SubscriptionFencedError:
                return
            except BKError as exc:  # the store is away: try again at the next interval
                self._log.warning("could not persist the subscription's position; will "
                                  "try again", error=str(exc))

    async def _persist(self) -> None:
        async with self._lock:
            state = self._state
            pos = state.due()
            if pos is None:
                return
            rec = CursorRecord(self.name, pos, self.epoch, self._ctime_ms, self._ctx.now_ms())
            meta = self._ctx.md.meta
            try:
                while True:
                    try:
                        self._version = await self._ctx.cas.write(
                            meta, self._key, self._version, rec.to_bytes())
                    except MetadataVersionError:
                        pass
                    else:
                        state.persisted_as(pos)
                        return
                    kv = await meta.kv_get(self._key)
                    if kv is None:
                        self.fence(f"subscription {self.name!r} of {self.namespace}/"
                                   f"{self.stream} was deleted")
                        raise SubscriptionFencedError(state.why_fenced)
                    now = CursorRecord.from_value(self.name, kv.value, kv.version, kv.key)
                    if now.epoch != self.epoch or now.ctime_ms != self._ctime_ms:
                        # (another epoch, or the same number of a subscription deleted
                        # and created again since)
                        self.fence(f"subscription {self.name!r} of {self.namespace}/"
                                   f"{self.stream} was taken over by another consumer or "
                                   f"sought (epoch {now.epoch}); this consumer's acks no "
                                   "longer count: subscribe again")
                        raise SubscriptionFencedError(state.why_fenced)
                    self._version = kv.version  # our own write whose answer was lost
            except BaseException:
                if state.persisting is not None:
                    state.persist_failed()  # (unknown outcome: the next one compares)
                raise


# ------------------------------------------------------------------ admin


async def _cluster_identity(ctx: StreamContext) -> Any:
    kv = await ctx.md.meta.kv_get(keys.instance_id(ctx.md.root))
    return kv.value if kv is not None else id(ctx.md.meta)


async def _live_key(ctx: StreamContext, stream: str, name: str) -> tuple[Any, ...]:
    return (await _cluster_identity(ctx), ctx.md.root, ctx.namespace, stream, name)


async def _fence_local(ctx: StreamContext, stream: str, name: str, why: str) -> None:
    """Fence this process's consumer of the subscription, if there is one."""
    ref = _LIVE.get(await _live_key(ctx, stream, name))
    if ref is not None and (sub := ref()) is not None:
        sub.fence(why)


async def subscribe(ctx: StreamContext, stream: str, name: str, start: Position | None,
                    timestamp_ms: int | None, readahead_entries: int = 32) -> Subscription:
    """Take over (or create, from ``start`` / ``timestamp_ms``) the subscription
    ``name`` of ``stream`` and return its consumer."""
    check_subscription_name(name)
    sm = await ctx.md.stream(ctx.namespace, stream)
    interval = ctx.stream_config(sm).subscription_ack_interval_s
    for _attempt in range(20):
        now = await read_cursor(ctx, stream, name)
        if now is None:
            pos = await _resolve(ctx, stream, start, timestamp_ms)
            rec = CursorRecord(name, pos, 1, ctx.now_ms(), ctx.now_ms())
            try:
                version = await _write_with_stream(ctx, stream, rec, 0)
            except MetadataVersionError:
                continue  # created meanwhile, or the stream changed: look again
            ctx.log(stream=stream).info("subscription created", subscription=name,
                                        position=str(pos))
        else:
            rec = dataclasses.replace(now, epoch=now.epoch + 1, mtime_ms=ctx.now_ms())
            try:
                version = await ctx.md.meta.kv_txn([(_key(ctx, stream, name), now.version)],
                                                   put=[(_key(ctx, stream, name),
                                                         rec.to_bytes())])
            except MetadataVersionError:
                continue
        rec = dataclasses.replace(rec, version=version)
        live_key = await _live_key(ctx, stream, name)
        old = _LIVE.get(live_key)
        if old is not None and (previous := old()) is not None:
            previous.fence(f"subscription {name!r} of {ctx.namespace}/{stream} was taken "
                           f"over by another consumer (epoch {rec.epoch})")
        sub = Subscription(ctx, stream, rec, interval, live_key, readahead_entries)
        _LIVE[live_key] = weakref.ref(sub)
        return sub
    raise MetadataVersionError(f"subscription {name!r} of {ctx.namespace}/{stream}: 20 "
                               "attempts to subscribe each lost a race; try again")


async def seek(ctx: StreamContext, stream: str, name: str, position: Position | None,
               timestamp_ms: int | None) -> Position:
    """Move the subscription to ``position`` (or the first record at or after
    ``timestamp_ms``), either way; its consumer is fenced (it subscribes again)."""
    check_subscription_name(name)
    if (position is None) == (timestamp_ms is None):
        raise ValueError("give one of position and timestamp_ms")
    for _attempt in range(20):
        now = await read_cursor(ctx, stream, name)
        if now is None:
            raise NoSuchSubscriptionError(f"no subscription {name!r} on {ctx.namespace}/"
                                          f"{stream}")
        pos = await _resolve(ctx, stream, position, timestamp_ms)
        rec = dataclasses.replace(now, position=pos, epoch=now.epoch + 1, mtime_ms=ctx.now_ms())
        try:
            await _write_with_stream(ctx, stream, rec, now.version)
        except MetadataVersionError:
            continue
        ctx.log(stream=stream).info("subscription sought", subscription=name,
                                    position=str(pos))
        await _fence_local(ctx, stream, name, f"subscription {name!r} of {ctx.namespace}/"
                           f"{stream} was sought to {pos}: subscribe again")
        return pos
    raise MetadataVersionError(f"subscription {name!r} of {ctx.namespace}/{stream}: 20 "
                               "attempts to seek each lost a race; try again")


async def mirror(ctx: StreamContext, stream: str, name: str, position: Position) -> bool:
    """Set the subscription ``name`` to ``position``, creating it the first time: the
    progress of a consumer that keeps its own elsewhere (a Spark query's checkpoint),
    published so that retention waits for it and its lag shows.  Its consumer epoch is
    left alone.  Returns whether anything was written."""
    check_subscription_name(name)
    key = _key(ctx, stream, name)
    for _attempt in range(20):
        now = await read_cursor(ctx, stream, name)
        if now is not None and now.position == position:
            return False
        now_ms = ctx.now_ms()
        rec = CursorRecord(name, position, now.epoch if now else 0,
                           now.ctime_ms if now else now_ms, now_ms)
        try:
            if now is None or position < now.position:
                # Created, or moved back: with the stream record, as a seek (retention
                # that read the holds before this is refused).
                await _write_with_stream(ctx, stream, rec, now.version if now else 0)
            else:  # forward only releases more: the key alone
                await ctx.md.meta.kv_txn([(key, now.version)], put=[(key, rec.to_bytes())])
        except MetadataVersionError:
            continue
        return True
    raise MetadataVersionError(f"subscription {name!r} of {ctx.namespace}/{stream}: 20 "
                               "attempts to publish its position each lost a race")


async def delete(ctx: StreamContext, stream: str, name: str) -> None:
    """Remove the subscription (its consumer, if any, is fenced at its next
    persistence); retention no longer waits for it."""
    check_subscription_name(name)
    await ctx.md.stream(ctx.namespace, stream)  # NoSuchStreamError first
    while True:
        now = await read_cursor(ctx, stream, name)
        if now is None:
            raise NoSuchSubscriptionError(f"no subscription {name!r} on {ctx.namespace}/"
                                          f"{stream}")
        key = _key(ctx, stream, name)
        try:
            await ctx.md.meta.kv_txn([(key, now.version)], delete=[key])
            ctx.log(stream=stream).info("subscription deleted", subscription=name)
            await _fence_local(ctx, stream, name, f"subscription {name!r} of "
                               f"{ctx.namespace}/{stream} was deleted")
            return
        except MetadataVersionError:
            continue


# ------------------------------------------------------------------ lag


@dataclass(slots=True)
class _End:
    records: int
    """Records in the stream up to its durable end (its sequence number)."""
    bytes: float
    open_seg: Segment | None
    open_records: int
    open_avg: float


class _Entries:
    """Entries read while measuring lags, each ledger opened and each entry read once
    (many subscriptions often sit in the same place)."""

    ENTRIES_MAX = 1024

    def __init__(self, ctx: StreamContext) -> None:
        self.ctx = ctx
        self.handles: dict[int, Any] = {}
        self.entries: dict[tuple[int, int], Any] = {}

    async def read(self, seg: Segment, entry: int) -> Any:
        key = (seg.ledger_id, entry)
        got = self.entries.get(key)
        if got is None:
            rh = self.handles.get(seg.ledger_id)
            if rh is None:
                rh = self.handles[seg.ledger_id] = await open_segment(self.ctx, seg)
            data = (await rh.read_unconfirmed(entry, entry))[0].data
            got = decode_entry(seg, data, f"stream {self.ctx.namespace} segment {seg.seq} "
                                          f"entry {entry}")
            if len(self.entries) >= self.ENTRIES_MAX:
                self.entries.clear()
            self.entries[key] = got
        return got


async def _stream_end(ctx: StreamContext, segs: list[Segment]) -> _End:
    if not segs:
        return _End(0, 0.0, None, 0, 0.0)
    last = segs[-1]
    if last.completed:
        return _End(last.start_sequence + last.records, float(last.start_bytes + last.size_bytes),
                    None, 0, 0.0)
    try:
        rh = await open_for_read(ctx, last.ledger_id)
    except BKError:
        return _End(last.start_sequence, float(last.start_bytes), last, 0, 0.0)
    end = durable_end(rh)
    entry = end
    while entry >= 0:
        b = decode_entry(last, (await rh.read_unconfirmed(entry, entry))[0].data,
                         f"stream {ctx.namespace} segment {last.seq} entry {entry}")
        if b.count:
            n = b.records_before + b.count
            avg = sum(map(len, b.datas)) / b.count
            return _End(last.start_sequence + n, last.start_bytes + n * avg, last, n, avg)
        entry -= 1
    return _End(last.start_sequence, float(last.start_bytes), last, 0, 0.0)


async def measure(entries: _Entries, segs: list[Segment], end: _End, rec: CursorRecord,
                  now_ms: int) -> SubscriptionInfo:
    """How far behind the end of the stream ``rec`` is (entry reads: at most two)."""
    pos = rec.position
    truncated = bool(segs) and pos < segs[0].first_position
    if truncated:
        pos = segs[0].first_position
    seg = next((s for s in segs if s.seq >= pos.segment), None)
    if seg is None:
        return SubscriptionInfo(rec.name, rec.position, 0, 0, 0.0, rec.epoch, rec.ctime_ms,
                                rec.mtime_ms, truncated)
    if seg.seq > pos.segment:
        pos = seg.first_position
    seg_records = seg.records if seg.completed else end.open_records
    ts: int | None = None
    last_entry = seg.last_entry if seg.completed else -1
    within = seg_records
    if seg.completed and pos.entry <= last_entry or not seg.completed and seg_records:
        try:
            b = await entries.read(seg, pos.entry)
            within = b.records_before + min(pos.slot, b.count)
            if pos.slot < b.count:
                ts = b.timestamps[pos.slot]
        except BKError:
            within = seg_records if seg.completed else within
    if seg.completed:
        seg_bytes_before = seg.size_bytes * within / seg.records if seg.records else 0.0
    else:
        seg_bytes_before = within * end.open_avg
    sequence = seg.start_sequence + within
    lag_records = max(0, end.records - sequence)
    lag_bytes = max(0, round(end.bytes - (seg.start_bytes + seg_bytes_before)))
    if ts is None and lag_records:
        later = next((s for s in segs if s.seq > seg.seq and (s.records or not s.completed)),
                     None)
        if later is not None and later.completed:
            ts = later.first_ts
        elif later is not None:
            with contextlib.suppress(BKError):
                ts = (await entries.read(later, 0)).timestamps[0]
    lag_s = max(0.0, (now_ms - ts) / 1000) if lag_records and ts is not None else 0.0
    return SubscriptionInfo(rec.name, rec.position, lag_records, lag_bytes, lag_s, rec.epoch,
                            rec.ctime_ms, rec.mtime_ms, truncated)


async def infos(ctx: StreamContext, stream: str) -> list[SubscriptionInfo]:
    """Every subscription of ``stream`` with its lag (also recorded in the stream
    stats, for the metrics endpoint)."""
    await ctx.md.stream(ctx.namespace, stream)
    cursors = await read_cursors(ctx, stream)
    if not cursors:
        ctx.stats.subscriptions_seen(ctx.namespace, stream, [])
        return []
    segs = await ctx.md.segments(ctx.namespace, stream)
    end = await _stream_end(ctx, segs)
    now = ctx.now_ms()
    entries = _Entries(ctx)
    out = [await measure(entries, segs, end, rec, now) for rec in cursors]
    ctx.stats.subscriptions_seen(ctx.namespace, stream, out)
    return out


# ------------------------------------------------------------------ retention


async def let_go(ctx: StreamContext, stream: str, segs: list[Segment],
                 doomed: list[Segment]) -> Release:
    """Of ``doomed``, what the stream's subscriptions let retention or truncation drop
    (:func:`asyncbk.stream.cursor.release`)."""
    cursors = await read_cursors(ctx, stream) if doomed else []
    if not cursors:
        return Release(list(doomed), {}, [])
    sm = await ctx.md.stream(ctx.namespace, stream)
    config = ctx.stream_config(sm)
    return release(doomed, segs, {c.name: c.position for c in cursors},
                   config.backlog_quota_bytes, config.backlog_quota_s, ctx.now_ms())


def report_release(ctx: StreamContext, stream: str, got: Release, doomed: list[Segment]) -> None:
    """Log and count what a release committed: the subscriptions whose backlog quota
    dropped records they had not acknowledged, and those that held segments back."""
    log = ctx.log(stream=stream)
    for name, seqs in got.evicted.items():
        log.warning("backlog quota exceeded: dropped segments a subscription had not "
                    "acknowledged; its consumer's next read raises TruncatedError (seek "
                    "it, e.g. to earliest, to go on)", subscription=name, segments=seqs)
        ctx.stats.evicted(ctx.namespace, stream, name, len(seqs))
    if got.held_by:
        log.info("segments held back by subscriptions that have not acknowledged them",
                 subscriptions=got.held_by, kept_from_segment=doomed[len(got.segments)].seq)



__all__ = ["Subscription", "SubscriptionInfo", "check_subscription_name"]
