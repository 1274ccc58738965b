"""The stream writer: one at a time per stream, by fencing.

**Opening** (:func:`open_writer`) takes the stream over: if its last segment is
still open (a writer is alive, or died), its ledger is opened with recovery,
which fences it on its bookies (the older writer's next add fails: it gets
``WriterFencedError``) and closes it where every acknowledged entry is kept;
then, in one metadata transaction, that segment is completed and a new one
started on a fresh ledger.  Of two writers opening at once, the transaction of
one fails and it tries again (fencing the other in turn).  Correctness rests on
fencing and the versioned transactions, never on who thinks it holds a lock.

**Writing**: ``write_nowait`` queues a record and returns a future; the records
queued in one event-loop turn (up to ``batch_bytes_max``) leave together as one
ledger entry (:mod:`asyncbk.stream.codec`), and each record's future resolves
to its :class:`Position` once that entry is acknowledged by an ack quorum of
bookies (journal fsync).  Entries are pipelined; futures resolve in order.

**Rolling**: once the segment reaches ``rolling_bytes``, ``rolling_entries``
records or ``rolling_s`` of age, the writer waits for the entries in flight,
closes the ledger, and completes the segment and starts the next in one
transaction; records written meanwhile wait in the bounded buffer.  Each roll
(and each opening) also drops segments older than ``retention_s``.

Any failure (fenced, bookies lost past the ledger's own retries, metadata
refused) fails the writer: every pending record fails with the cause and
later writes raise it; open a new writer to go on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
from typing import TYPE_CHECKING, Any

from ..backoff import Backoff
from ..errors import (
    BKError,
    EndOfStreamError,
    EntryTooLargeError,
    InvalidTxidError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataError,
    MetadataVersionError,
    TooManyRequestsError,
    WriterFencedError,
)
from .codec import (
    END_OF_STREAM,
    HEADER_BYTES,
    RECORD_OVERHEAD_BYTES_MAX,
    TIMESTAMP_MS_MAX,
    TXID_MAX,
    encode,
    pack_extras,
)
from .context import StreamContext, StreamLimits
from .meta import Segment, StreamConfig, StreamMeta
from .position import Position
from .retention import apply_retention
from .segment_ledger import (
    Tally,
    complete_segment,
    create_segment_ledger,
    discard_ledger,
    recover_segment,
)

if TYPE_CHECKING:
    from ..client.ledger import LedgerHandle

TAKEOVER_ATTEMPTS = 20
"""Opening a writer retries this often when another opening wins the race."""
TAKEOVER_BACKOFF_S = 0.04
"""The first pause (at most) before opening again after losing the race; it doubles
at each loss, up to TAKEOVER_BACKOFF_S_MAX, with full jitter."""
TAKEOVER_BACKOFF_S_MAX = 1.0


@dataclasses.dataclass(frozen=True)
class WriterOptions:
    """Bounds of one writer (``ns.open_writer(name, **options)``)."""

    batch_bytes_max: int = 1024 * 1024
    """Bytes of one ledger entry at most, records and their headers (a larger record
    goes alone)."""
    record_bytes_max: int = 4 * 1024 * 1024
    """The largest record accepted."""
    pending_records_max: int = 200_000
    """Records written but not yet acknowledged; past it ``write_nowait`` raises
    TooManyRequestsError (``write`` waits for room)."""
    pending_bytes_max: int = 128 * 1024 * 1024
    """The same bound in bytes."""

    def validate(self) -> WriterOptions:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"{f.name} must be > 0")
        return self

    def check_fits(self, limits: StreamLimits) -> WriterOptions:
        """ValueError unless a record of ``record_bytes_max`` (with the batch header)
        fits in one ledger entry."""
        fit = limits.record_bytes_max
        if self.record_bytes_max > fit:
            raise ValueError(f"record_bytes_max {self.record_bytes_max} exceeds what one "
                             f"ledger entry carries ({fit} bytes, from frame_bytes_max)")
        return self


class _Entry:
    """An entry in flight: its ledger future and its records' futures."""

    __slots__ = ("futures", "ledger_future", "nbytes", "seq")

    def __init__(self, seq: int, ledger_future: asyncio.Future[int],
                 futures: list[asyncio.Future[Position]], nbytes: int) -> None:
        self.seq = seq
        self.ledger_future = ledger_future
        self.futures = futures
        self.nbytes = nbytes


class StreamWriter:
    """The single writer of a stream (see the module docstring).  Get one with
    ``await ns.open_writer(name)``; use it as an async context manager, or call
    ``close()``."""

    def __init__(self, ctx: StreamContext, config: StreamConfig, sm: StreamMeta,
                 segment: Segment, lh: LedgerHandle, last_txid: int,
                 options: WriterOptions, last_ts_ms: int = 0) -> None:
        self._ctx = ctx
        self.namespace = ctx.namespace
        self.stream = sm.name
        self._config = config
        self._options = options
        self._sm = sm
        self._seg = segment
        self._lh = lh
        self._loop = asyncio.get_running_loop()
        self._clock = ctx.clock
        self._log = ctx.log(stream=sm.name)
        self._last_txid = last_txid
        """The txid of the last record accepted (written or queued)."""
        self._last_ts = last_ts_ms
        """The timestamp of the last record accepted: none below it is stored."""
        # the segment being written
        self._seg_started_s = self._clock.monotonic_s()
        self._tally = Tally()
        # records queued for the next entry
        self._txids: list[int] = []
        self._datas: list[bytes] = []
        self._tss: list[int] = []
        self._extras: list[bytes] | None = None
        """Each queued record's packed key and headers (None: no queued record has any)."""
        self._futures: list[asyncio.Future[Position]] = []
        self._buffer_bytes = 0
        self._transmit_scheduled = False
        # entries in flight, oldest first
        self._inflight: collections.deque[_Entry] = collections.deque()
        self._pending_records = 0
        self._pending_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._roll_task: asyncio.Task[None] | None = None
        self._error: BKError | None = None
        self._aborted = False
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ public

    @property
    def last_txid(self) -> int:
        """The txid of the last record written (or queued); -1 before any."""
        return self._last_txid

    @property
    def segment(self) -> int:
        """The number of the segment being written."""
        return self._seg.seq

    @property
    def last_timestamp_ms(self) -> int:
        """The timestamp of the last record written (or queued); the stream's last
        before any."""
        return self._last_ts

    def write_nowait(self, data: bytes, txid: int | None = None, *, key: bytes | None = None,
                     headers: dict[str, bytes] | None = None,
                     timestamp_ms: int | None = None) -> asyncio.Future[Position]:
        """Queue ``data`` now (in call order); the future resolves to its Position once
        it is durable.  ``key`` and ``headers`` travel with the record; ``timestamp_ms``
        (default: the wall clock now) is raised to the previous record's if lower.
        Raises at once on bad input, a failed or closed writer, or when the writer's
        pending bounds are reached (TooManyRequestsError)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write takes bytes, not {type(data).__name__}")
        self._check_writable()
        if txid is None:
            txid = self._last_txid + 1
        elif not isinstance(txid, int) or isinstance(txid, bool):
            raise InvalidTxidError(f"txid must be an int, not {type(txid).__name__}")
        if txid < self._last_txid or txid < 0 or txid > TXID_MAX:
            raise InvalidTxidError(
                f"stream {self.namespace}/{self.stream}: txid {txid} is "
                + ("negative" if txid < 0 else "too large" if txid > TXID_MAX else
                   f"below the previous one ({self._last_txid})")
                + "; txids must not decrease")
        if timestamp_ms is None:
            ts = int(self._clock.wall_s() * 1000)
        else:
            ts = check_timestamp_ms(timestamp_ms)
        if ts < self._last_ts:
            ts = self._last_ts
        extra = b"" if key is None and not headers else _extras(key, headers)
        size = len(data) + len(extra)
        if size > self._options.record_bytes_max:
            raise EntryTooLargeError(
                f"record of {size} bytes (with its key and headers) exceeds record_bytes_max "
                f"({self._options.record_bytes_max}); split it")
        if self._pending_records >= self._options.pending_records_max \
                or self._pending_bytes + size > self._options.pending_bytes_max:
            self._room.clear()
            raise TooManyRequestsError(
                f"stream {self.namespace}/{self.stream}: {self._pending_records} records "
                f"({self._pending_bytes} bytes) pending; await write() or flush()")
        fut: asyncio.Future[Position] = self._loop.create_future()
        cost = size + RECORD_OVERHEAD_BYTES_MAX  # what it may add to the entry
        if self._buffer_bytes and self._buffer_bytes + cost > self._options.batch_bytes_max:
            self._transmit()
            if self._error is not None:  # that send found the writer failed
                raise self._error
        self._txids.append(txid)
        self._datas.append(bytes(data))
        self._tss.append(ts)
        if extra:
            if self._extras is None:
                self._extras = [b""] * (len(self._datas) - 1)
            self._extras.append(extra)
        elif self._extras is not None:
            self._extras.append(b"")
        self._futures.append(fut)
        self._buffer_bytes += cost
        self._pending_records += 1
        self._pending_bytes += size
        self._last_txid = txid
        self._last_ts = ts
        if self._buffer_bytes >= self._options.batch_bytes_max:
            self._transmit()
        elif not self._transmit_scheduled:
            self._transmit_scheduled = True
            self._loop.call_soon(self._transmit_soon)
        return fut

    async def write(self, data: bytes, txid: int | None = None, *, key: bytes | None = None,
                    headers: dict[str, bytes] | None = None,
                    timestamp_ms: int | None = None) -> Position:
        """Write one record and wait until it is durable; returns its Position.  Waits
        for room when the writer's pending bounds are reached.  ``key``, ``headers``,
        ``timestamp_ms``: as :meth:`write_nowait`."""
        while True:
            self._check_writable()
            if self._pending_records < self._options.pending_records_max and \
                    self._pending_bytes + len(data) <= self._options.pending_bytes_max:
                break
            self._room.clear()
            await self._room.wait()
        return await self.write_nowait(data, txid, key=key, headers=headers,
                                       timestamp_ms=timestamp_ms)

    async def flush(self) -> None:
        """Send what is queued and wait until every record written so far is durable."""
        self._check_writable()
        self._transmit()
        while True:
            if self._roll_task is not None:
                await asyncio.wait([self._roll_task])  # (abort() may cancel it)
                if self._error is not None:
                    raise self._error
                self._transmit()
            entries = [e.ledger_future for e in self._inflight]
            if not entries and self._roll_task is None:
                break
            if entries:
                await asyncio.wait(entries)
            if self._error is not None:
                raise self._error
        if self._error is not None:
            raise self._error

    async def close(self) -> None:
        """Flush, close the segment's ledger and complete the segment.  Idempotent."""
        if self._close_task is None:
            self._close_task = self._loop.create_task(self._close(end=False))
            self._close_task.add_done_callback(_consume)  # (if every waiter is cancelled)
        await asyncio.shield(self._close_task)

    async def mark_end_of_stream(self) -> int:
        """Flush, then end the stream: readers get EndOfStreamError after the last
        record, and no writer can open it again.  Closes this writer; returns the last
        txid."""
        self._check_writable()
        self._close_task = self._loop.create_task(self._close(end=True))
        self._close_task.add_done_callback(_consume)
        await asyncio.shield(self._close_task)
        return self._last_txid

    async def abort(self) -> None:
        """Give up without completing anything (what a crash does): pending records
        fail; the next writer's takeover completes the segment."""
        self._aborted = True
        self._fail(LedgerClosedError(f"writer of {self.namespace}/{self.stream} aborted"))
        self._closed = True
        await self._cancel_roll()
        await self._lh.close_quietly()

    async def __aenter__(self) -> StreamWriter:
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            await self.close()
        else:
            await self.abort()

    # ------------------------------------------------------------------ internals

    def _check_writable(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed or self._close_task is not None:
            raise LedgerClosedError(f"the writer of {self.namespace}/{self.stream} is closed")

    def _transmit_soon(self) -> None:
        self._transmit_scheduled = False
        self._transmit()

    def _transmit(self) -> None:
        """Send the queued records, as entries of at most ``batch_bytes_max`` bytes of
        records each (unless a roll is under way: they wait for the new segment)."""
        limit = self._options.batch_bytes_max - HEADER_BYTES
        overhead = RECORD_OVERHEAD_BYTES_MAX
        while self._futures and self._roll_task is None and self._error is None:
            n, encoded = 0, 0
            extras = self._extras
            for i, data in enumerate(self._datas):  # at least one record, then while they fit
                cost = len(data) + overhead + (len(extras[i]) if extras is not None else 0)
                if n and encoded + cost > limit:
                    break
                n += 1
                encoded += cost
            self._send(n, encoded)

    def _send(self, n: int, encoded: int) -> None:
        """Send the first ``n`` queued records (``encoded`` bytes in the entry)."""
        txids, datas, futures = self._txids[:n], self._datas[:n], self._futures[:n]
        tss = self._tss[:n]
        del self._txids[:n], self._datas[:n], self._futures[:n], self._tss[:n]
        extras = self._extras
        if extras is not None:
            extras, self._extras = extras[:n], extras[n:] or None
        self._buffer_bytes -= encoded
        nbytes = encoded - n * RECORD_OVERHEAD_BYTES_MAX  # the records' own bytes
        payload = encode(self._tally.records, txids, datas, tss, extras)
        try:
            ledger_future = self._lh.append(payload)
        except BKError as exc:
            for f in futures:
                f.set_exception(self._map_error(exc))
                f.exception()
            self._fail(self._map_error(exc))
            return
        self._tally.sent(txids, nbytes, tss[0], tss[-1])
        entry = _Entry(self._seg.seq, ledger_future, futures, nbytes)
        self._inflight.append(entry)
        ledger_future.add_done_callback(functools.partial(self._entry_done, entry))
        self._maybe_roll()

    def _entry_done(self, entry: _Entry, fut: asyncio.Future[int]) -> None:
        if self._inflight and self._inflight[0] is entry:
            self._inflight.popleft()
        else:
            try:
                self._inflight.remove(entry)
            except ValueError:
                pass
        self._pending_records -= len(entry.futures)
        self._pending_bytes -= entry.nbytes
        if not self._room.is_set():
            self._room.set()
        if fut.cancelled():
            error: BKError = LedgerClosedError("the entry was cancelled")
        elif (exc := fut.exception()) is not None:
            error = self._map_error(exc)
        else:
            entry_id = fut.result()
            seq = entry.seq
            for slot, f in enumerate(entry.futures):
                if not f.done():
                    f.set_result(Position(seq, entry_id, slot))
            self._tally.acked(entry_id, len(entry.futures))
            self._ctx.stats.written(self.namespace, len(entry.futures), entry.nbytes)
            return
        for f in entry.futures:
            if not f.done():
                f.set_exception(error)
                f.exception()  # a caller that never awaits is not warned about it
        self._fail(error)

    def _map_error(self, exc: BaseException) -> BKError:
        # The ledger fenced (a bookie said so) or closed under us (a recovery closed
        # it, seen at an ensemble change or at close): another writer took over.
        if isinstance(exc, (LedgerFencedError, LedgerClosedError)) and not self._aborted:
            return WriterFencedError(
                f"stream {self.namespace}/{self.stream}: another writer took it over "
                "(opened it); this writer can write nothing more")
        if isinstance(exc, BKError):
            return exc
        return MetadataError(f"stream writer failed: {exc!r}")

    def _fail(self, error: BKError) -> None:
        if self._error is None:
            self._error = error
            self._log.warning("stream writer failed", error=str(error))
        futures, self._futures = self._futures, []
        self._txids, self._datas, self._buffer_bytes = [], [], 0
        self._tss, self._extras = [], None
        for f in futures:
            if not f.done():
                f.set_exception(self._error)
                f.exception()
        self._room.set()

    # ------------------------------------------------------------------ rolling

    def _maybe_roll(self) -> None:
        cfg = self._config
        if self._roll_task is not None or self._closed:
            return
        tally = self._tally
        if (cfg.rolling_bytes and tally.size_bytes >= cfg.rolling_bytes) \
                or (cfg.rolling_entries and tally.records >= cfg.rolling_entries) \
                or (cfg.rolling_s and self._clock.monotonic_s() - self._seg_started_s
                    >= cfg.rolling_s):
            self._roll_task = self._loop.create_task(self._roll())
            self._roll_task.add_done_callback(_consume)

    async def _wait_inflight(self) -> None:
        entries = [e.ledger_future for e in self._inflight]
        if entries:
            await asyncio.wait(entries)
        if self._error is not None:
            raise self._error

    async def _roll(self) -> None:
        try:
            await self._wait_inflight()
            completed = await complete_segment(self._ctx, self._lh, self._seg, self._tally)
            await self._start_segment(completed)
            self._ctx.stats.rolled(self.namespace)
        except BKError as exc:
            self._fail(self._map_error(exc))
        finally:
            self._roll_task = None
        if self._error is None:
            self._transmit()
            await apply_retention(self._ctx, self.stream, self, quiet=True)

    async def _cancel_roll(self) -> None:
        task = self._roll_task
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    async def _start_segment(self, completed: Segment) -> None:
        """Commit ``completed`` and a new open segment on a fresh ledger, in one
        transaction.  A conflict that left our segment ours (a truncation, retention)
        is retried; anything else means another writer took over."""
        ctx = self._ctx
        lh = await create_segment_ledger(ctx, self._sm.name, self._config, self._sm.max_seq + 1)
        while True:
            new = Segment(seq=self._sm.max_seq + 1, ledger_id=lh.id,
                          start_sequence=completed.start_sequence + completed.records,
                          start_bytes=completed.start_bytes + completed.size_bytes,
                          ctime_ms=ctx.now_ms())
            try:
                self._sm, (_, new) = await ctx.md.commit(self._sm, put=[completed, new])
                break
            except MetadataVersionError:
                pass  # certainly not applied
            except BaseException:
                # The outcome may be unknown (cancelled, or the store's answer lost):
                # keep the ledger; if the segment was committed, the next takeover
                # recovers it.
                await lh.close_quietly()
                raise
            try:
                completed = await self._refresh_own(completed)
            except BaseException:  # fenced, or the stream deleted: the ledger is unused
                await discard_ledger(ctx, lh)
                raise
        self._lh = lh
        self._seg = new
        self._seg_started_s = self._clock.monotonic_s()
        self._tally = Tally()

    async def _refresh_own(self, completed: Segment) -> Segment:
        """After a lost commit: re-read; if our segment is still ours and open, return
        ``completed`` with the fresh version (and take the fresh stream record), else
        raise WriterFencedError."""
        sm = await self._ctx.md.stream(self.namespace, self.stream)
        segs = await self._ctx.md.segments(self.namespace, self.stream)
        mine = next((s for s in segs if s.seq == self._seg.seq), None)
        if sm.epoch != self._sm.epoch or mine is None or mine.completed \
                or mine.ledger_id != self._seg.ledger_id or segs[-1].seq != mine.seq:
            raise WriterFencedError(
                f"stream {self.namespace}/{self.stream}: another writer took it over")
        self._sm = sm
        self._seg = mine
        return dataclasses.replace(completed, version=mine.version)

    async def _commit_completed(self, completed: Segment, ended: bool) -> None:
        while True:
            try:
                self._sm, (self._seg,) = await self._ctx.md.commit(
                    self._sm, put=[completed], ended=ended or None)
                return
            except MetadataVersionError:
                completed = await self._refresh_own(completed)

    async def _close(self, end: bool) -> None:
        try:
            self._transmit()
            while self._roll_task is not None:
                await asyncio.wait([self._roll_task])  # (abort() may cancel it)
                if self._error is not None:
                    raise self._error
                self._transmit()
            await self._wait_inflight()
            self._closed = True
            if end:
                # An entry with no records marks the end, after every record.
                fut = self._lh.append(encode(self._tally.records, [], [],
                                             flags=END_OF_STREAM))
                await fut
            completed = await complete_segment(self._ctx, self._lh, self._seg, self._tally)
            await self._commit_completed(completed, ended=end)
            self._log.info("stream writer closed", segment=completed.seq,
                           records=completed.records, ended=end)
        except BKError as exc:
            error = self._map_error(exc)
            self._fail(error)
            self._closed = True
            await self._lh.close_quietly()
            raise error from None

    def take_stream_meta(self, sm: StreamMeta) -> bool:
        """Take a fresher stream record (after retention changed it), unless another
        writer has opened the stream since (then this one is fenced: False)."""
        if sm.epoch != self._sm.epoch:
            return False
        self._sm = sm
        return True

    @property
    def stream_meta(self) -> StreamMeta:
        """The stream record this writer holds (the version it read or wrote last)."""
        return self._sm


def check_timestamp_ms(timestamp_ms: object) -> int:
    """``timestamp_ms`` if it is a record time (ms since the epoch); else ValueError."""
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise TypeError(f"timestamp_ms must be an int (ms since the epoch), not "
                        f"{type(timestamp_ms).__name__}")
    if not 0 <= timestamp_ms <= TIMESTAMP_MS_MAX:
        raise ValueError(f"timestamp_ms {timestamp_ms} out of range: ms since the epoch, "
                         f"0 to {TIMESTAMP_MS_MAX}")
    return timestamp_ms


def _extras(key: object, headers: object) -> bytes:
    """A record's key and headers, checked and packed."""
    if (key is None or type(key) is bytes) and type(headers) is dict \
            and all(type(k) is str and type(v) is bytes for k, v in headers.items()):
        return pack_extras(key, headers)  # (the common case, checked at once)
    if key is not None and not isinstance(key, bytes):
        if isinstance(key, (bytearray, memoryview)):
            key = bytes(key)
        else:
            raise TypeError(f"key must be bytes or None, not {type(key).__name__}")
    if headers is not None:
        if not isinstance(headers, dict):
            raise TypeError(f"headers must be a dict of str to bytes, not "
                            f"{type(headers).__name__}")
        for name, value in headers.items():
            if not isinstance(name, str) or not isinstance(value, bytes):
                raise TypeError(f"headers must map str to bytes; got {name!r}: "
                                f"{type(value).__name__}")
    return pack_extras(key, headers)


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def open_writer(ctx: StreamContext, name: str, options: WriterOptions) -> StreamWriter:
    """Take the stream over (see the module docstring) and return its writer."""
    options.validate().check_fits(ctx.limits)
    md = ctx.md
    log = ctx.log(stream=name)
    backoff = Backoff(TAKEOVER_BACKOFF_S, TAKEOVER_BACKOFF_S_MAX, jitter=1.0, rng=ctx.rng)
    for attempt in range(TAKEOVER_ATTEMPTS):
        if attempt:  # another opener won the race: let it settle, then fence it in turn
            await ctx.clock.sleep(backoff.next_s())
        sm = await md.stream(ctx.namespace, name)
        if sm.ended:
            raise EndOfStreamError(f"stream {ctx.namespace}/{name} was ended: it takes no more "
                                   "writes")
        # First claim the stream: from this commit on, an older writer's next change
        # of the segments (a roll, its close) fails and it knows it was fenced.
        try:
            sm, _ = await md.commit(sm, epoch=sm.epoch + 1)
        except MetadataVersionError:
            continue
        config = ctx.stream_config(sm)
        segs = await md.segments(ctx.namespace, name)
        put: list[Segment] = []
        last = segs[-1] if segs else None
        took_over = False
        if last is not None and not last.completed:
            last, ended = await recover_segment(ctx, last)
            put.append(last)
            took_over = True
            if ended:  # its writer ended it but died before recording so: record it
                with contextlib.suppress(MetadataVersionError):  # (or someone else did)
                    await md.commit(sm, put=put, ended=True)
                raise EndOfStreamError(f"stream {ctx.namespace}/{name} was ended")
        last_txid = max([sm.last_txid, *(s.last_txid for s in segs), *(s.last_txid for s in put)])
        last_ts = max([sm.last_ts_ms, *(s.last_ts for s in segs if s.records),
                       *(s.last_ts for s in put if s.records)])
        start_sequence = last.start_sequence + last.records if last is not None else 0
        start_bytes = last.start_bytes + last.size_bytes if last is not None else 0
        seq = max([sm.max_seq, *(s.seq for s in segs)]) + 1
        lh = await create_segment_ledger(ctx, name, config, seq)
        new = Segment(seq=seq, ledger_id=lh.id, start_sequence=start_sequence,
                      start_bytes=start_bytes,
                      ctime_ms=ctx.now_ms())
        try:
            sm, committed = await md.commit(sm, put=[*put, new])
        except MetadataVersionError:  # certainly not applied: the ledger is unused
            await discard_ledger(ctx, lh)
            log.info("another writer opened the stream at the same time; trying again")
            continue
        except BaseException:
            # The outcome may be unknown (the commit may have landed): keep the
            # ledger; if it was committed, the next takeover recovers it.
            await lh.close_quietly()
            raise
        if took_over:
            ctx.stats.took_over(ctx.namespace)
            log.info("took the stream over", fenced_segment=put[0].seq, segment=seq)
        writer = StreamWriter(ctx, config, sm, committed[-1], lh, last_txid, options, last_ts)
        await apply_retention(ctx, name, writer, quiet=True)
        return writer
    raise WriterFencedError(
        f"stream {ctx.namespace}/{name}: {TAKEOVER_ATTEMPTS} attempts to open a writer each "
        "lost to another writer opening it; are two writers fighting over it?")
