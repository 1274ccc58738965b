"""The journal writer: a group-committed write-ahead log.

Callers append encoded records (see :mod:`journal_format`) and get a future
that resolves once the record is on stable storage.  Durability costs one
``fdatasync`` per *batch*, not per record: while one batch is being written
and synced, new records pile up in the queue and all go into the next batch
(group commit), so throughput grows with concurrency while latency stays
about one fsync.

Threads and ownership
---------------------
* The event loop owns the queue, the futures and the statistics.  A single
  writer task takes a batch off the queue and hands it to the writer thread.
* One dedicated thread (a single-thread :class:`~.fileio.Worker` owned by the
  journal, from the ``offload`` seam) does every blocking file operation, on
  the ``io`` seam (:mod:`.fileio`): one write of the whole
  batch joined into one buffer, one ``fdatasync``, file rotation, and the
  :class:`BatchSink` hook (the ledger storage appends the batch's entries to
  its entry log there, so entry data costs no extra thread hop).  File
  position and descriptor are touched only on that thread; anything else
  that must be ordered with batches (checkpoints) goes through
  :meth:`Journal.run_in_writer`, which queues behind them (FIFO).
* A batch's futures are resolved on the loop, after the thread reports the
  fsync done and after :meth:`BatchSink.apply_on_loop` ran, so an
  acknowledged record is durable and (for storage) readable.

When a batch is flushed
-----------------------
The writer takes records until the batch reaches ``journal_group_bytes_max``
bytes or ``journal_group_entries_max`` records.  With
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
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..config import BookieConfig
from ..errors import BookieIOError, TooManyRequestsError
from ..log import get_logger
from ..stats import LatencyHistogram
from .fileio import OS_FILE_IO, THREAD_OFFLOAD, FileIO, Offload
from .journal_format import journal_file_name, parse_journal_file_name

T = TypeVar("T")

FLUSH_REASONS = ("bytes", "entries", "wait_time", "queue_empty", "close")

FSYNC_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5,
                   1.0)
BATCH_RECORDS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
"""Upper bounds of the fsync latency histogram buckets (plus one overflow bucket)."""


DELETE_STEP_BYTES = 16 * 1024 * 1024
"""Journal files are truncated this much at a time before they are unlinked."""


def shrink_then_unlink(io: FileIO, path: Path, step: int = DELETE_STEP_BYTES,
                       pause_s: float = 0.002) -> None:
    """Unlink a large file without one long filesystem stall: freeing 256 MB at once
    held up concurrent fdatasyncs of the journal on the same disk by tens of ms."""
    try:
        fd = io.open_append(path) if io.file_size(path) > step else -1
    except FileNotFoundError:
        return
    if fd >= 0:
        try:
            size = io.size(fd)
            while size > step:
                size -= step
                io.truncate(fd, size)
                # A worker thread (never the loop) letting the real disk breathe: not
                # behaviour in time, so not the injected clock.
                time.sleep(pause_s)
        finally:
            io.close(fd)
    io.unlink(path, missing_ok=True)


def list_journal_files(directory: Path, io: FileIO = OS_FILE_IO) -> list[tuple[int, Path]]:
    """``(seq, path)`` of every journal file in ``directory``, by seq."""
    out: list[tuple[int, Path]] = []
    for name, _size in io.list_dir(directory):
        seq = parse_journal_file_name(name)
        if seq is not None:
            out.append((seq, Path(directory) / name))
    out.sort()
    return out


class BatchSink(Protocol):
    """Work done with each batch, after its fsync and before its futures resolve."""

    def apply_in_writer(self, records: list[bytes], items: list[Any]) -> Any:
        """Runs on the writer thread after the batch's fsync; the result is
        passed to :meth:`apply_on_loop`.  An exception fails the journal."""

    def apply_on_loop(self, items: list[Any], result: Any) -> None:
        """Runs on the event loop just before the batch's futures resolve."""


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


@dataclass(frozen=True, slots=True)
class JournalSync:
    """The group commit that made a record durable, what the journal's futures resolve
    to: when its write began and its ``fdatasync`` ended (wall clock, ns: for tracing
    spans), and how many records and bytes it wrote."""

    start_ns: int
    end_ns: int
    records: int
    nbytes: int


# A queued record: (encoded record, sink item, future or None, loop time enqueued)
_Queued = tuple[bytes, Any, "asyncio.Future[JournalSync] | None", float]


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
        self._file_bytes_max = config.journal_file_bytes_max
        self._sync = config.journal_sync
        self._worker = offload.worker("asyncbk-journal", 1)

        # writer-thread state (touched only on the executor thread)
        self._fd = -1
        self._seq = first_seq
        self._offset = 0
        self._thread_failed = False
        self._files_created = 0

        # loop state
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: collections.deque[_Queued] = collections.deque()
        self._queued_bytes = 0
        self._pending = 0  # queued + in flight
        self._inflight: list[asyncio.Future[JournalSync] | None] = []
        self._wakeup = asyncio.Event()
        self._space_waiters: list[asyncio.Future[None]] = []
        self._failed: BaseException | None = None
        self._closing = False
        self._closed = False
        self._writer_task: asyncio.Task[None] | None = None
        self._synced_position = (first_seq, 0)

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
        """Create the first journal file (``first_seq``) and start the writer task."""
        self._loop = asyncio.get_running_loop()
        await self._worker.run(self._open_file, self._first_seq)
        self._writer_task = self._loop.create_task(self._run(), name="asyncbk-journal-writer")

    async def drain(self) -> None:
        """Stop accepting appends, write out everything queued, stop the writer task."""
        self._closing = True
        self._wakeup.set()
        task = self._writer_task
        if task is not None and not task.done():
            await asyncio.wait([task])

    async def stop_now(self) -> None:
        """Stop as if the process died: cancel the writer, fail everything
        pending with BookieIOError, wait for the thread to go idle."""
        self._closing = True
        if self._failed is None:
            self._failed = BookieIOError("journal stopped")
        task = self._writer_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        if self._loop is not None and not self._closed:
            # FIFO executor: once this no-op ran, any in-flight batch is finished.
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
                await self._worker.run(self._close_file)
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

    def _enqueue(self, records: list[bytes], items: list[Any],
                 fut: asyncio.Future[JournalSync] | None,
                 loop: asyncio.AbstractEventLoop) -> None:
        """Queue ``records``, ``fut`` riding with the last."""
        q = self._queue
        was_empty = not q
        now = loop.time()
        last = len(records) - 1
        nbytes = 0
        for i, record in enumerate(records):
            q.append((record, items[i], fut if i == last else None, now))
            nbytes += len(record)
        self._queued_bytes += nbytes
        self._pending += len(records)
        if self._pending > self._pending_peak:
            self._pending_peak = self._pending
        # Wake the writer only when it can act: the queue just became
        # non-empty, or a size limit was crossed while it waits for a group.
        if was_empty or len(q) >= self._entries_max or self._queued_bytes >= self._bytes_max:
            self._wakeup.set()

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

    # --- writer task ----------------------------------------------------

    async def _run(self) -> None:
        q = self._queue
        try:
            while True:
                if not q:
                    if self._closing or self._failed is not None:
                        return
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                if self._closing:
                    reason = "close"
                elif self._flush_when_empty:
                    reason = "queue_empty"
                else:
                    reason = await self._wait_for_group()
                if not q:  # failed from outside (fail) while waiting for a group
                    continue
                if not await self._flush(reason):
                    return
        except asyncio.CancelledError:
            self._fail_all(self._failed or BookieIOError("journal stopped"))
            raise
        except Exception as exc:  # a bug: never leave futures hanging
            self._set_failed(exc)
            raise

    async def _wait_for_group(self) -> str:
        """Wait (loop timer, no polling) until the queued records make a batch."""
        loop = self._loop
        assert loop is not None
        q = self._queue
        while True:
            if not q:
                return "close"
            if len(q) >= self._entries_max:
                return "entries"
            if self._queued_bytes >= self._bytes_max:
                return "bytes"
            if self._closing:
                return "close"
            remaining = q[0][3] + self._wait_s - loop.time()
            if remaining <= 0:
                return "wait_time"
            self._wakeup.clear()
            try:
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            except TimeoutError:
                return "wait_time"

    async def _flush(self, reason: str) -> bool:
        """Write one batch; False if the journal failed."""
        loop = self._loop
        assert loop is not None
        q = self._queue
        n_max = self._entries_max
        b_max = self._bytes_max
        records: list[bytes] = []
        items: list[Any] = []
        futs: list[asyncio.Future[JournalSync] | None] = []
        nbytes = 0
        oldest = q[0][3]
        while q and len(records) < n_max and nbytes < b_max:
            record, item, fut, _t = q.popleft()
            records.append(record)
            items.append(item)
            futs.append(fut)
            nbytes += len(record)
        self._queued_bytes -= nbytes
        if len(records) >= n_max:
            reason = "entries"
        elif nbytes >= b_max:
            reason = "bytes"
        self._inflight = futs
        wait_s = loop.time() - oldest
        try:
            result = await self._worker.run(self._write_batch, records, items)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._set_failed(exc)
            return False
        if self._failed is not None:  # failed from outside (fail) meanwhile: futures failed
            return False
        try:
            if self._sink is not None:
                self._sink.apply_on_loop(items, result.sink_result)
        except Exception as exc:
            self._set_failed(exc)
            return False

        self._synced_position = (result.seq, result.offset)
        self._batches += 1
        self._records += len(records)
        self._bytes += result.nbytes
        self._flush_reasons[reason] += 1
        self._write_s_sum += result.write_s
        self._fsync_s_sum += result.fsync_s
        if result.fsync_s > self._fsync_s_max:
            self._fsync_s_max = result.fsync_s
        self.fsync_latency.observe(result.fsync_s)
        self.batch_records.observe(len(records))
        if len(records) > self._batch_records_max:
            self._batch_records_max = len(records)
        if wait_s > self._batch_wait_s_max:
            self._batch_wait_s_max = wait_s

        self._inflight = []
        self._pending -= len(futs)
        synced = JournalSync(result.start_ns, result.end_ns, len(records), result.nbytes)
        for fut in futs:
            if fut is not None and not fut.done():
                fut.set_result(synced)
        if self._space_waiters and self._pending < self._low_water:
            self._wake_space_waiters()
        return True

    def fail(self, exc: BaseException) -> None:
        """Fail the journal from outside, as a failed fsync of its own would: what is
        queued fails, every later append raises (the storage behind it could no longer
        keep what the journal acknowledges; a restart replays the journal)."""
        self._set_failed(exc)
        self._wakeup.set()

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
        futs.extend(fut for _, _, fut, _ in self._queue)
        self._queue.clear()
        self._queued_bytes = 0
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

    def _open_file(self, seq: int) -> None:
        path = self.directory / journal_file_name(seq)
        fd = self.io.create(path, exclusive=True)
        try:
            self.io.fsync_dir(self.directory)
        except BaseException:
            self.io.close(fd)
            raise
        self._fd, self._seq, self._offset = fd, seq, 0
        self._files_created += 1

    def _close_file(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self.io.close(fd)

    def _write_batch(self, records: list[bytes], items: list[Any]) -> _BatchResult:
        if self._thread_failed:
            raise BookieIOError("journal failed earlier")
        try:
            if self._offset >= self._file_bytes_max:
                # The previous batch was synced into the old file: it is complete.
                self._close_file()
                self._open_file(self._seq + 1)
            buf = records[0] if len(records) == 1 else b"".join(records)
            # performance timers: only reported (write and fsync latency statistics)
            start_ns = time.time_ns()  # (wall clock: where tracing spans put it)
            t0 = time.perf_counter()
            self.io.write(self._fd, buf)
            t1 = time.perf_counter()
            if self._sync:
                self.io.fdatasync(self._fd)
            t2 = time.perf_counter()
            end_ns = time.time_ns()
            self._offset += len(buf)
            sink_result = self._sink.apply_in_writer(records, items) if self._sink else None
        except BaseException:
            self._thread_failed = True
            raise
        return _BatchResult(sink_result, t1 - t0, t2 - t1, len(buf), self._seq, self._offset,
                            start_ns, end_ns)

    @property
    def writer_failed(self) -> bool:
        """Writer-thread view of failure (use from inside :meth:`run_in_writer`)."""
        return self._thread_failed

    @property
    def position(self) -> tuple[int, int]:
        """(file seq, offset) after the last batch written; writer thread only."""
        return self._seq, self._offset

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
            "queue_entries_waiting": len(self._queue),
            "queue_entries_peak": self._pending_peak,
            "queue_entries_max": self._queue_max,
            "files_created": self._files_created,
            "position": self._synced_position,
            "failed": self._failed is not None,
        }


def _noop() -> None:
    return None
