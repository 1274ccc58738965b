"""The journal writer: a group-committed write-ahead log.

Callers append encoded records (see :mod:`journal_format`) and get a future
that resolves once the record is on stable storage.  Durability costs one
``fdatasync`` per *batch*, not per record: while one batch is being written
and synced, new records pile up in the queue and all go into the next batch
(group commit), so throughput grows with concurrency while latency stays
about one fsync.

Threads and ownership
---------------------
* The event loop owns the queue, the futures and the statistics.  There is no
  writer task: the journal is driven by callbacks.  An append to an idle journal
  schedules one ``_kick`` (a loop turn later, so that every request read in that
  turn joins the batch), which hands a batch to the writer thread; the thread hands
  the batch's result back with one ``call_soon_threadsafe``, and that callback
  completes the batch's waiters, starts the next batch at once if records queued
  meanwhile, and calls ``after_batch`` (the bookie writes the answers the batch
  completed, one write per connection, in that same loop turn).
* One dedicated thread (a single-thread :class:`~.fileio.Worker` owned by the
  journal, from the ``offload`` seam) does every blocking file operation, on
  the ``io`` seam (:mod:`.fileio`): one write of the whole batch joined into one
  buffer, one ``fdatasync``, file rotation and preallocation (its files:
  :class:`~.journal_writer.JournalFileWriter`), and the
  :class:`BatchSink` hook (the ledger storage appends the batch's entries to
  its entry log there, so entry data costs no extra thread hop; it runs between
  the batch's write and its ``fdatasync``, while the disk writes the batch:
  :mod:`.journal_writer`).  File
  position and descriptor are touched only on that thread; anything else
  that must be ordered with batches (checkpoints) goes through
  :meth:`Journal.run_in_writer`, which queues behind them (FIFO).
* A batch's waiters are completed on the loop, after the thread reports the
  fsync done and after :meth:`BatchSink.apply_on_loop` ran, so an
  acknowledged record is durable and (for storage) readable.  A waiter is a
  future (:meth:`Journal.append_batch`), whose callbacks run a loop turn later, or
  a callback (:meth:`Journal.append_batch_then`), called right there: the add path
  uses those.

When a batch is flushed
-----------------------
The writer takes records until the batch reaches ``journal_group_bytes_max``
bytes or ``journal_group_entries_max`` records; a run of records queued as one
(:meth:`Journal.append_run`, a batch of adds) is taken whole.  With
``journal_flush_when_queue_empty`` it then flushes whatever it has (the queue
is empty, waiting would only add latency).  Otherwise it waits, on a loop
timer, until a size limit is reached or the oldest queued record has waited
``journal_group_wait_ms_max``.  Each flush counts one reason in
``statistics()["flush_reasons"]``: ``bytes``, ``entries``, ``wait_time``,
``queue_empty`` or ``close``.

Failure
-------
If a write or fsync fails, the batch's futures fail with
:class:`BookieIOError` and the journal is *failed*: everything queued fails,
and every later append raises at once.  Nothing is ever acknowledged after a
failed fsync (after a failed fsync the page cache state is unknown, so retrying
could ack data that is not on disk).  A restart replays the journal, cutting
whatever partial batch the failure left behind.

Bounds
------
At most ``journal_queue_entries_max`` records may be queued or in flight;
past it appends raise :class:`TooManyRequestsError`.
:meth:`Journal.wait_for_space` lets a producer wait until the queue is back
below 75 % of the bound.
"""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..config import BookieConfig
from ..errors import BookieIOError, TooManyRequestsError
from ..log import get_logger
from ..stats import LatencyHistogram
from .fileio import OS_FILE_IO, THREAD_OFFLOAD, FileIO, Offload
from .freeing import shrink_then_unlink
from .journal_files import list_journal_files
from .journal_sync import JournalSync, Then, Waiter
from .journal_writer import JournalFileWriter

T = TypeVar("T")

FLUSH_REASONS = ("bytes", "entries", "wait_time", "queue_empty", "close")

FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
                   1.0)
BATCH_RECORDS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
"""Upper bounds of the fsync latency histogram buckets (plus one overflow bucket)."""


class BatchSink(Protocol):
    """Work done with each batch, before its futures resolve."""

    def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
        """Runs on the writer thread once the batch is written, before its
        ``fdatasync`` returns (while the disk writes it), with what was queued
        (a record, or a run of records appended as one: :meth:`Journal.append_run_then`)
        and its item; the result is passed to :meth:`apply_on_loop`.  An exception
        fails the journal (and the batch, unsynced).  What it writes is trusted only
        up to a checkpoint, which comes after the batch (FIFO): a restart rebuilds
        the rest from the synced journal, so work done before the sync is safe."""

    def apply_on_loop(self, items: list[Any], result: Any) -> None:
        """Runs on the event loop after the batch's fsync, just before its futures
        resolve."""


@dataclass(slots=True)
class _BatchResult:
    sink_result: Any
    write_s: float
    fsync_s: float
    nbytes: int
    seq: int
    offset: int
    start_ns: int
    end_ns: int


# Queued: (encoded record, or a run of ADD records as one buffer; its sink item;
# waiter or None; loop time enqueued; how many records)
_Queued = tuple[bytes, Any, "Waiter | None", float, int]


class Journal:
    """A group-commit journal writing ``<seq>.jnl`` files in one directory.

    Lifecycle: ``await start()``, then :meth:`append` from the loop; finally
    ``await close()`` (drains and syncs) or ``await stop_now()`` then
    ``close()`` (crash-like: nothing more is written or acknowledged).
    """

    def __init__(
        self,
        directory: Path,
        config: BookieConfig,
        *,
        first_seq: int,
        sink: BatchSink | None = None,
        log: Any = None,
        io: FileIO = OS_FILE_IO,
        offload: Offload = THREAD_OFFLOAD,
    ) -> None:
        self.directory = Path(directory)
        self.io = io
        self._log = log if log is not None else get_logger(component="journal")
        self._sink = sink
        self._first_seq = first_seq
        self._bytes_max = config.journal_group_bytes_max
        self._entries_max = config.journal_group_entries_max
        self._wait_s = config.journal_group_wait_ms_max / 1000.0
        self._flush_when_empty = config.journal_flush_when_queue_empty
        self._queue_max = config.journal_queue_entries_max
        self._low_water = max(1, (3 * self._queue_max) // 4)
        self._worker = offload.worker("asyncbk-journal", 1)

        # writer-thread state (touched only on the executor thread)
        self._files = JournalFileWriter(self.directory, io, config, self._log, first_seq)
        self._thread_failed = False

        # loop state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_Queued] = collections.deque()
        self._queued_bytes = 0
        self._queued_records = 0
        self._pending = 0  # queued + in flight
        self._inflight: list[Waiter | None] = []
        self._busy = False  # a batch is with the writer thread
        self._batch: tuple[list[Any], str, float, int] = ([], "", 0.0, 0)
        """The batch with the thread: its items, flush reason, wait and records."""
        self._kick_handle: asyncio.Handle | None = None
        self._group_timer: asyncio.TimerHandle | None = None
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._space_waiters: list[asyncio.Future[None]] = []
        self._failed: BaseException | None = None
        self._closing = False
        self._closed = False
        self._synced_position = (first_seq, 0)
        self.after_batch: Callable[[], None] | None = None
        """Called on the loop after each batch's waiters were completed (the bookie
        writes the answers they queued)."""

        # statistics (loop)
        self._batches = 0
        self._records = 0
        self._bytes = 0
        self._flush_reasons = dict.fromkeys(FLUSH_REASONS, 0)
        self._fsync_s_sum = 0.0
        self._fsync_s_max = 0.0
        self.fsync_latency = LatencyHistogram(FSYNC_BUCKETS_S)
        self.batch_records = LatencyHistogram(BATCH_RECORDS_BUCKETS)
        """Records per group commit (a histogram over counts, not seconds)."""
        self._write_s_sum = 0.0
        self._batch_records_max = 0
        self._batch_wait_s_max = 0.0
        self._pending_peak = 0

    # --- lifecycle ------------------------------------------------------

    async def start(self) -> None:
        """Create the first journal file (``first_seq``); appends may follow."""
        self._loop = asyncio.get_running_loop()
        await self._worker.run(self._files.open, self._first_seq)

    async def drain(self) -> None:
        """Stop accepting appends, write out everything queued, return once idle."""
        self._closing = True
        loop = self._loop
        if loop is None or self._idle():
            return
        if not self._busy:
            self._schedule_kick(loop)
        fut: asyncio.Future[None] = loop.create_future()
        self._idle_waiters.append(fut)
        await fut

    async def stop_now(self) -> None:
        """Stop as if the process died: fail everything pending with BookieIOError,
        write nothing more, wait for the thread to go idle."""
        self._closing = True
        if self._failed is None:
            self._failed = BookieIOError("journal stopped")
        self._cancel_handles()
        if self._loop is not None and not self._closed:
            # FIFO worker: once this no-op ran, any batch in flight is finished (and
            # its result, handed back before the no-op's, was seen to fail).
            await self._worker.run(_noop)
        self._fail_all(self._failed)

    async def close(self) -> None:
        """Drain (if still running), close the file, stop the writer thread.  Idempotent."""
        if self._closed:
            return
        await self.drain()
        self._closed = True
        try:
            if self._loop is not None:
                # (stopped as if the process died, or failed: the zeros stay, as a crash
                # leaves them)
                cut = self._failed is None and not self._thread_failed
                await self._worker.run(functools.partial(self._files.close, cut=cut))
        finally:
            self._fail_all(BookieIOError("journal closed"))
            await self._worker.shutdown()

    # --- appending ------------------------------------------------------

    @property
    def failed(self) -> bool:
        return self._failed is not None

    @property
    def queue_entries(self) -> int:
        """Records queued or being written."""
        return self._pending

    @property
    def synced_position(self) -> tuple[int, int]:
        """(file seq, offset) just past the last batch written and synced (loop view)."""
        return self._synced_position

    def ensure_room(self, count: int = 1) -> None:
        """Raise unless ``count`` more records can be appended right now."""
        if self._failed is not None:
            raise BookieIOError(f"journal failed: {self._failed}") from self._failed
        if self._closing:
            raise BookieIOError("journal is closed")
        if self._pending + count > self._queue_max:
            raise TooManyRequestsError(
                f"journal queue full ({self._pending} of {self._queue_max} records)"
            )

    def append(self, record: bytes, item: Any = None) -> asyncio.Future[JournalSync]:
        """Queue ``record``; the future resolves after the fsync covering it.

        ``item`` is passed to the sink with the record.  Raises
        TooManyRequestsError if the queue is full, BookieIOError if the
        journal failed or is closed.
        """
        return self.append_batch([record], [item])

    def append_batch(self, records: list[bytes],
                     items: list[Any]) -> asyncio.Future[JournalSync]:
        """Queue ``records`` (with their ``items``) in order, with one future: it
        resolves after the fsync covering the last of them, and so, the journal being
        FIFO, all of them.  Raises as :meth:`append` does, for all or none."""
        count = len(records)
        if count == 0 or count != len(items):
            raise ValueError(f"append_batch of {count} records and {len(items)} items")
        loop = self._ready(count)
        fut: asyncio.Future[JournalSync] = loop.create_future()
        self._enqueue(records, items, fut, loop)
        return fut

    def append_batch_then(self, records: list[bytes], items: list[Any],
                          then: Callable[[JournalSync | BaseException], None]) -> None:
        """:meth:`append_batch` with a callback instead of a future: ``then`` is called
        on the loop with the batch's :class:`JournalSync` (or the exception that failed
        it) as soon as the group commit covering the records completes, without the
        loop turn a future's callbacks wait for."""
        count = len(records)
        if count == 0 or count != len(items):
            raise ValueError(f"append_batch of {count} records and {len(items)} items")
        self._enqueue(records, items, Then(then), self._ready(count))

    def append_run(self, run: bytes, count: int, item: Any) -> asyncio.Future[JournalSync]:
        """Queue ``run``, ``count`` records back to back (a batch's ADD records), as
        one queue element with one sink ``item`` and one future (as
        :meth:`append_batch`'s).  The bytes written are those of the records queued
        one by one; only the journal's bookkeeping is one element, not ``count``."""
        loop = self._ready(count)
        fut: asyncio.Future[JournalSync] = loop.create_future()
        self._enqueue_run(run, count, item, fut, loop)
        return fut

    def append_run_then(self, run: bytes, count: int, item: Any,
                        then: Callable[[JournalSync | BaseException], None]) -> None:
        """:meth:`append_run` with a callback, as :meth:`append_batch_then`."""
        self._enqueue_run(run, count, item, Then(then), self._ready(count))

    def _enqueue_run(self, run: bytes, count: int, item: Any, waiter: Waiter,
                     loop: asyncio.AbstractEventLoop) -> None:
        if count < 1 or not run:
            raise ValueError(f"append_run of {count} records in {len(run)} bytes")
        self._queue.append((run, item, waiter, loop.time(), count))
        self._queued(len(run), count, loop)

    def append_unacked(self, record: bytes, item: Any = None) -> None:
        """Like :meth:`append` without a future: for records whose durability
        is covered by a later record's future (the journal is FIFO)."""
        self._enqueue([record], [item], None, self._ready(1))

    def _ready(self, count: int) -> asyncio.AbstractEventLoop:
        """The loop, once ``count`` more records may be queued (else raise)."""
        self.ensure_room(count)
        loop = self._loop
        if loop is None:
            raise BookieIOError("journal not started")
        return loop

    def _enqueue(self, records: list[bytes], items: list[Any], fut: Waiter | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``records``, ``fut`` riding with the last."""
        q = self._queue
        now = loop.time()
        last = len(records) - 1
        nbytes = 0
        for i, record in enumerate(records):
            q.append((record, items[i], fut if i == last else None, now, 1))
            nbytes += len(record)
        self._queued(nbytes, len(records), loop)

    def _queued(self, nbytes: int, count: int, loop: asyncio.AbstractEventLoop) -> None:
        """Count what was just queued; kick the writer if it can act."""
        was_empty = not self._queued_records
        self._queued_bytes += nbytes
        self._queued_records += count
        self._pending += count
        if self._pending > self._pending_peak:
            self._pending_peak = self._pending
        # Kick the writer only when it can act: idle, and the queue just became
        # non-empty or a size limit was crossed while it waits for a group.
        if not self._busy and self._kick_handle is None and (
                was_empty or self._queued_records >= self._entries_max
                or self._queued_bytes >= self._bytes_max):
            self._schedule_kick(loop)

    async def wait_for_space(self) -> None:
        """Return once fewer than ~75 % of ``journal_queue_entries_max`` records
        are pending (at once if so already, or if the journal failed/closed)."""
        if self._pending < self._low_water or self._failed is not None or self._closing:
            return
        loop = self._loop
        if loop is None:
            return
        fut: asyncio.Future[None] = loop.create_future()
        self._space_waiters.append(fut)
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()
            try:
                self._space_waiters.remove(fut)
            except ValueError:
                pass

    async def run_in_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the writer thread, after every batch handed to it so far."""
        if self._closed or self._loop is None:
            raise BookieIOError("journal is closed")
        return await self._worker.run(fn, *args)

    # --- the writer, driven by callbacks ---------------------------------

    def _idle(self) -> bool:
        return not self._busy and (not self._queue or self._failed is not None)

    def _schedule_kick(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._kick_handle is None:
            self._kick_handle = loop.call_soon(self._kick)

    def _cancel_handles(self) -> None:
        for handle in (self._kick_handle, self._group_timer):
            if handle is not None:
                handle.cancel()
        self._kick_handle = self._group_timer = None

    def _kick(self) -> None:
        """Hand the next batch to the writer thread if one is due; else arm the group
        timer (the oldest record's wait) or, with nothing queued, tell drain()."""
        self._kick_handle = None
        if self._busy:
            return
        q = self._queue
        if not q or self._failed is not None:
            self._notify_idle()
            return
        if self._closing:
            reason = "close"
        elif self._flush_when_empty:
            reason = "queue_empty"
        elif self._queued_records >= self._entries_max:
            reason = "entries"
        elif self._queued_bytes >= self._bytes_max:
            reason = "bytes"
        else:
            loop = self._loop
            assert loop is not None
            due = q[0][3] + self._wait_s
            if due > loop.time():
                if self._group_timer is None:
                    self._group_timer = loop.call_at(due, self._group_due)
                return
            reason = "wait_time"
        self._start_batch(reason)

    def _group_due(self) -> None:
        self._group_timer = None
        if not self._busy and self._queue and self._failed is None:
            self._start_batch("close" if self._closing else "wait_time")

    def _start_batch(self, reason: str) -> None:
        """Take one batch off the queue and hand it to the writer thread."""
        loop = self._loop
        assert loop is not None
        if self._group_timer is not None:
            self._group_timer.cancel()
            self._group_timer = None
        q = self._queue
        n_max = self._entries_max
        b_max = self._bytes_max
        records: list[bytes] = []
        items: list[Any] = []
        futs: list[Waiter | None] = []
        nbytes = 0
        count = 0
        oldest = q[0][3]
        while q and count < n_max and nbytes < b_max:
            record, item, fut, _t, n = q.popleft()
            records.append(record)
            items.append(item)
            futs.append(fut)
            nbytes += len(record)
            count += n
        self._queued_bytes -= nbytes
        self._queued_records -= count
        if count >= n_max:
            reason = "entries"
        elif nbytes >= b_max:
            reason = "bytes"
        self._inflight = futs
        self._busy = True
        self._batch = (items, reason, loop.time() - oldest, count)
        self._worker.submit(self._write_batch, (records, items), self._batch_done)

    def _batch_done(self, result: _BatchResult | None, exc: BaseException | None) -> None:
        """The writer thread's answer for the batch in flight (on the loop)."""
        self._busy = False
        items, reason, wait_s, count = self._batch
        self._batch = ([], "", 0.0, 0)
        if exc is not None:
            self._set_failed(exc)
        elif self._failed is None:  # (else failed from outside meanwhile: waiters failed)
            assert result is not None
            try:
                if self._sink is not None:
                    self._sink.apply_on_loop(items, result.sink_result)
            except Exception as sink_exc:
                self._set_failed(sink_exc)
            else:
                self._completed(result, reason, wait_s, count)
        if self._queue and self._failed is None:
            self._kick()  # the records queued during this batch: at once
        else:
            self._notify_idle()
        if self.after_batch is not None:
            self.after_batch()

    def _completed(self, result: _BatchResult, reason: str, wait_s: float,
                   records: int) -> None:
        futs = self._inflight
        self._inflight = []
        self._synced_position = (result.seq, result.offset)
        self._batches += 1
        self._records += records
        self._bytes += result.nbytes
        self._flush_reasons[reason] += 1
        self._write_s_sum += result.write_s
        self._fsync_s_sum += result.fsync_s
        if result.fsync_s > self._fsync_s_max:
            self._fsync_s_max = result.fsync_s
        self.fsync_latency.observe(result.fsync_s)
        self.batch_records.observe(records)
        if records > self._batch_records_max:
            self._batch_records_max = records
        if wait_s > self._batch_wait_s_max:
            self._batch_wait_s_max = wait_s
        self._pending -= records
        if self._space_waiters and self._pending < self._low_water:
            self._wake_space_waiters()  # (first: a producer paused for room resumes
            # no later than what the answers below wake)
        synced = JournalSync(result.start_ns, result.end_ns, records, result.nbytes)
        for fut in futs:
            if fut is not None and not fut.done():
                fut.set_result(synced)

    def _notify_idle(self) -> None:
        if self._idle_waiters and self._idle():
            waiters = self._idle_waiters
            self._idle_waiters = []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """Fail the journal from outside, as a failed fsync of its own would: what is
        queued fails, every later append raises (the storage behind it could no longer
        keep what the journal acknowledges; a restart replays the journal)."""
        self._set_failed(exc)
        self._cancel_handles()
        self._notify_idle()

    def _set_failed(self, exc: BaseException) -> None:
        if self._failed is None:
            self._failed = exc
            self._log.error("journal failed; no further adds will be acknowledged",
                            error=repr(exc), seq=self._synced_position[0])
        self._fail_all(exc)

    def _fail_all(self, exc: BaseException) -> None:
        """Fail every in-flight and queued future; the journal accepts nothing more."""
        futs = self._inflight
        self._inflight = []
        futs.extend(queued[2] for queued in self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        self._queued_records = 0
        self._pending = 0
        for fut in futs:
            if fut is not None and not fut.done():
                err = BookieIOError(f"journal write failed: {exc}")
                err.__cause__ = exc
                fut.set_exception(err)
        self._wake_space_waiters()

    def _wake_space_waiters(self) -> None:
        waiters = self._space_waiters
        self._space_waiters = []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # --- writer thread --------------------------------------------------

    def _write_batch(self, records: list[bytes], items: list[Any]) -> _BatchResult:
        if self._thread_failed:
            raise BookieIOError("journal failed earlier")
        files = self._files
        sink = self._sink
        try:
            buf = records[0] if len(records) == 1 else b"".join(records)
            # (the sink's work while the disk writes the batch: before its fdatasync)
            written = files.write(buf, None if sink is None
                                  else functools.partial(sink.apply_in_writer, records, items))
        except BaseException:
            self._thread_failed = True
            raise
        return _BatchResult(written.meanwhile, written.write_s, written.fsync_s, len(buf),
                            files.seq, files.offset, written.start_ns, written.end_ns)

    @property
    def writer_failed(self) -> bool:
        """Writer-thread view of failure (use from inside :meth:`run_in_writer`)."""
        return self._thread_failed

    @property
    def position(self) -> tuple[int, int]:
        """(file seq, offset) after the last batch written; writer thread only."""
        return self._files.seq, self._files.offset

    def delete_files_before(self, seq: int) -> int:
        """Remove journal files with a smaller seq; returns how many.  Safe beside the
        writer thread, which only creates files with a higher seq.  Blocks (call it off
        the event loop and off the writer thread)."""
        removed = 0
        for file_seq, path in list_journal_files(self.directory, self.io):
            if file_seq < seq:
                shrink_then_unlink(self.io, path)
                removed += 1
        if removed:
            self.io.fsync_dir(self.directory)
        return removed

    # --- statistics -----------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        batches = self._batches
        return {
            "batches": batches,
            "records": self._records,
            "bytes": self._bytes,
            "flush_reasons": dict(self._flush_reasons),
            "fsync_s_sum": self._fsync_s_sum,
            "fsync_s_max": self._fsync_s_max,
            "fsync_s_mean": self._fsync_s_sum / batches if batches else 0.0,
            "fsync_histogram": dict(self.fsync_latency.cumulative()),
            "write_s_sum": self._write_s_sum,
            "batch_records_max": self._batch_records_max,
            "batch_records_mean": self._records / batches if batches else 0.0,
            "batch_wait_s_max": self._batch_wait_s_max,
            "queue_entries": self._pending,
            "queue_entries_waiting": self._queued_records,
            "queue_entries_peak": self._pending_peak,
            "queue_entries_max": self._queue_max,
            "files_created": self._files.files_created,
            "position": self._synced_position,
            "failed": self._failed is not None,
        }


def _noop() -> None:
    return None
