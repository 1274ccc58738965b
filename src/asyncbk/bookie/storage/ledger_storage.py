"""The bookie's entry storage, :class:`LedgerStorage`: the journal in front (every
mutation journaled and acknowledged after its fsync), the entry logs, index and
checkpoints behind it (the package docstring describes the whole).

Threads: loop-side state here; the entry log writer and the durable ledger state
on the journal's writer thread (:meth:`LedgerStorage.apply_in_writer`, checkpoint
capture); reads, recovery and file housekeeping on a small read pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...clock import SYSTEM_CLOCK, Clock
from ...config import BookieConfig, require_lmdb
from ...errors import BadRequestError, BookieIOError, NoSuchEntryError, NoSuchLedgerError
from ...log import get_logger
from ...types import LAST_ENTRY_ID
from ..fileio import OS_FILE_IO, THREAD_OFFLOAD, FileIO, Offload, Worker
from ..journal import Journal
from ..journal_format import (
    ADD_RECORD_OVERHEAD_BYTES,
    TYPE_ADD,
    TYPE_DELETE_LEDGER,
    TYPE_EXPLICIT_LAC,
    TYPE_FENCE,
    TYPE_LEDGER_KEY,
    encode_add,
    encode_add_run,
    encode_delete_ledger,
    encode_explicit_lac,
    encode_fence,
    encode_ledger_key,
)
from ..journal_sync import JournalSync
from .api import LedgerInfo
from .batch import KIND_ADD_RUN, AddRun, BatchApplied, write_batch
from .checkpointer import Checkpointer, wall_ms
from .compaction import EntryLogCompactor
from .entrylog import ENTRYLOG_DIR, EntryLogReader, remove_index_log
from .index import EntryIndex, Location
from .kvindex import KVEntryIndex
from .recovery import KVOpener, Recovered, recover

READ_THREADS = 4
"""Threads serving ``pread`` for reads (and start-up recovery)."""
DISK_USAGE_REFRESH_S = 1.0


# --- the storage ------------------------------------------------------------------


class LedgerStorage:
    """Durable entry storage of one bookie.  Create with :meth:`open`.

    Loop-side state (``_ledgers``, ``_index``) is touched only on the event
    loop; the entry log writer and the durable ledger state only on the
    journal's writer thread; reads use a small pool of threads doing
    ``pread`` (all of it on the ``io`` and ``offload`` seams of :mod:`..fileio`).
    """

    def __init__(self, journal_dir: Path, ledger_dir: Path, config: BookieConfig,
                 recovered: Recovered, read_pool: Worker, log: Any,
                 clock: Clock, io: FileIO, offload: Offload) -> None:
        self._io = io
        self._offload = offload
        self._journal_dir = journal_dir
        self._ledger_dir = ledger_dir
        self._config = config
        self._log = log
        self._clock = clock
        self._read_pool = read_pool
        self._writer = recovered.writer
        self._durable = recovered.durable
        self._tombstones = dict(recovered.durable.tombstones)
        """Loop-side copy of the deleted ledgers' tombstones (see DurableState)."""
        self._ledgers = recovered.ledgers
        self._index: EntryIndex | KVEntryIndex = recovered.index
        self._kv_index = recovered.kv_index
        """The on-disk index (written on the writer thread), None: the in-memory one."""
        self._kv_cache = recovered.kv_cache
        """Its write cache: past its bound, a checkpoint starts early (apply_on_loop)."""
        self._reader = EntryLogReader(ledger_dir / ENTRYLOG_DIR, io)
        self._recovery_stats = recovered.stats
        self._journal = Journal(journal_dir, config, first_seq=recovered.next_seq, sink=self,
                                log=log.bind(component="journal"), io=io, offload=offload)
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._housekeeping_task: asyncio.Task[None] | None = None
        self._checkpointer = Checkpointer(
            journal=self._journal, writer=self._writer, durable=self._durable,
            lacs=lambda: {ledger_id: info.lac for ledger_id, info in self._ledgers.items()
                          if info.lac >= 0},
            ledger_dir=ledger_dir, config=config, io=io, offload=offload, clock=clock,
            log=log, kv_cache=self._kv_cache,
            index_entries=self._index.__len__ if self._kv_index is None else None)
        self._disk_usage = (0, 0)
        self.full = False
        """Set by the bookie's disk watch: this ledger directory's disk (or its journal's)
        is past ``disk_usage_threshold``, so adds to its ledgers are refused (read-only
        for them) and new ledgers go elsewhere."""
        # statistics
        self._adds = 0
        self._reads = 0
        self._fences = 0
        self._ledgers_deleted = 0
        self._log_live: dict[int, int] = {}
        """Live (indexed) bytes of each entry log, kept as entries come and go."""
        if self._kv_index is not None:
            self._log_live.update(self._kv_index.live_bytes())
        else:
            for log_id, _, length in self._index.locations():
                self._log_live[log_id] = self._log_live.get(log_id, 0) + length
        self._compactor = EntryLogCompactor(
            entrylog_dir=ledger_dir / ENTRYLOG_DIR, index=self._index, writer=self._writer,
            reader=self._reader, journal=self._journal, read_pool=read_pool,
            live=self._log_live, checkpoint=self.checkpoint, clock=clock, log=log, io=io)

    @classmethod
    async def open(cls, journal_dir: Path, ledger_dir: Path, config: BookieConfig, *,
                   log: Any = None, clock: Clock | None = None, io: FileIO = OS_FILE_IO,
                   offload: Offload = THREAD_OFFLOAD,
                   kv_open: KVOpener | None = None) -> LedgerStorage:
        """Create sub-dirs if needed, load the last checkpoint, replay the journal
        after it (cutting a torn/garbage tail), then start the journal writer.
        Blocking file work runs off the loop (``offload``), on ``io``; ``kv_open``
        opens the on-disk index (``index_backend = "lmdb"``; default: LMDB, whose
        package missing is a ConfigError naming the extra, raised before any work)."""
        if config.index_backend == "lmdb" and kv_open is None:
            require_lmdb()
        journal_dir, ledger_dir = Path(journal_dir), Path(ledger_dir)
        log = log if log is not None else get_logger(component="storage")
        clock = clock if clock is not None else SYSTEM_CLOCK
        loop = asyncio.get_running_loop()
        read_pool = offload.worker("asyncbk-read", READ_THREADS)
        try:
            recovered = await read_pool.run(
                recover, journal_dir, ledger_dir, config, log, wall_ms(clock), io, kv_open)
        except BaseException:
            # On cancellation the recovery thread may still be running: do not wait for it.
            read_pool.abandon()
            raise
        self = cls(journal_dir, ledger_dir, config, recovered, read_pool, log, clock, io,
                   offload)
        try:
            await self._journal.start()
            await self.checkpoint()
            if recovered.remove_index_log:  # migrated: the checkpoint now names the KV
                await read_pool.run(remove_index_log, io, ledger_dir)
            self._disk_usage = await read_pool.run(io.disk_usage, ledger_dir)
        except BaseException:
            await self.abort()
            raise
        self._housekeeping_task = loop.create_task(self._housekeeping(),
                                                   name="asyncbk-storage-housekeeping")
        log.info("storage opened", ledgers=len(self._ledgers), **recovered.stats)
        return self

    # --- queries ------------------------------------------------------------

    def ledger(self, ledger_id: int) -> LedgerInfo | None:
        return self._ledgers.get(ledger_id)

    def is_deleted(self, ledger_id: int) -> bool:
        """Whether the ledger was deleted here (garbage collected) less than
        ``gc_tombstone_s`` ago on the storage's clock: its adds are refused as they
        were once it was fenced."""
        deleted_ms = self._tombstones.get(ledger_id)
        if deleted_ms is None:
            return False
        if wall_ms(self._clock) - deleted_ms >= self._config.gc_tombstone_s * 1000:
            del self._tombstones[ledger_id]
            return False
        return True

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

    def deleted_ids(self) -> list[int]:
        """Ledgers deleted here whose tombstones are kept (see :meth:`is_deleted`)."""
        return list(self._tombstones)

    @property
    def ledger_count(self) -> int:
        return len(self._ledgers)

    def is_full(self, ledger_id: int) -> bool:
        """Whether adds to ``ledger_id`` are refused for a full disk (see :attr:`full`)."""
        return self.full

    @property
    def per_directory(self) -> tuple[LedgerStorage, ...]:
        """The storage of each ledger directory: this one."""
        return (self,)

    @property
    def ledger_dir(self) -> Path:
        return self._ledger_dir

    @property
    def journal_dir(self) -> Path:
        return self._journal_dir

    def entry_ids(self, ledger_id: int) -> list[int]:
        """The ids of the entries of ``ledger_id`` stored here (readable), in order."""
        if ledger_id not in self._ledgers:
            return []
        index = self._index
        return [e for e in range(index.last_entry_id(ledger_id) + 1)
                if index.get(ledger_id, e) is not None]

    @property
    def config(self) -> BookieConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        """The clock this storage runs on (tombstone ages, housekeeping, pacing)."""
        return self._clock

    @property
    def journal(self) -> Journal:
        return self._journal

    @property
    def journal_failed(self) -> bool:
        """The journal hit a write or fsync error: every later add fails (restart needed)."""
        return self._journal.failed

    @property
    def journal_queue_entries(self) -> int:
        """Journal records queued or being written (bounded by journal_queue_entries_max)."""
        return self._journal.queue_entries

    async def wait_for_queue_space(self) -> None:
        """Resolve once the journal queue is below ~75 % of its bound (backpressure)."""
        await self._journal.wait_for_space()

    def disk_usage(self) -> tuple[int, int]:
        """(free_bytes, total_bytes) of the ledger dir's filesystem, refreshed every second."""
        return self._disk_usage

    # --- mutations ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BookieIOError("storage is closed")

    def _register(self, ledger_id: int, master_key: bytes) -> LedgerInfo:
        """A new ledger: in memory at once, its key journaled (no future: the
        record that follows it covers it, the journal being FIFO)."""
        key = bytes(master_key)
        info = LedgerInfo(master_key=key)
        self._ledgers[ledger_id] = info
        self._tombstones.pop(ledger_id, None)  # re-created (a recovery add copied it here)
        self._index.add_ledger(ledger_id)
        self._journal.append_unacked(encode_ledger_key(ledger_id, key),
                                     (TYPE_LEDGER_KEY, ledger_id, key))
        return info

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes,
                  body: bytes) -> asyncio.Future[JournalSync]:
        """Not a coroutine.  Registers the ledger (with ``master_key``) if new and
        queues a journal record; the future resolves once the record is fsynced
        AND the entry is readable via :meth:`read_entry`.

        The master key of a known ledger is not checked here (the processor
        does that).  Re-adding an existing entry overwrites it.  Raises
        TooManyRequestsError if the journal queue is full, BookieIOError if
        the journal failed or the storage is closed.
        """
        record, item = self._add_record(ledger_id, entry_id, master_key, body)
        fut = self._journal.append(record, item)
        self._adds += 1
        return fut

    def add_entries(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                    bodies: list[bytes]) -> asyncio.Future[JournalSync]:
        """:meth:`add_entry` for many entries of one ledger, with one future (resolved
        once every record is fsynced and every entry readable), queued all or none:
        their records as one run (:meth:`Journal.append_run`)."""
        run, item = self._add_run(ledger_id, entry_ids, master_key, bodies)
        fut = self._journal.append_run(run, len(item.sizes), item)
        self._adds += len(item.sizes)
        return fut

    def add_entries_then(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                         bodies: list[bytes],
                         then: Callable[[JournalSync | BaseException], None]) -> None:
        """:meth:`add_entries` with a callback instead of the future: ``then`` gets the
        group commit's :class:`JournalSync` (or the exception) in the loop turn it
        completes (:meth:`Journal.append_batch_then`); raises as :meth:`add_entries`.
        A lone entry goes as its ADD record (cheaper than a run of one)."""
        if len(entry_ids) == 1:
            record, item = self._add_record(ledger_id, entry_ids[0], master_key, bodies[0])
            self._journal.append_batch_then([record], [item], then)
            self._adds += 1
            return
        run, added = self._add_run(ledger_id, entry_ids, master_key, bodies)
        self._journal.append_run_then(run, len(added.sizes), added, then)
        self._adds += len(added.sizes)

    def _add_record(self, ledger_id: int, entry_id: int, master_key: bytes,
                    body: bytes) -> tuple[bytes, tuple[int, int, int, LedgerInfo]]:
        """One entry's ADD record and journal item (the ledger registered if new)."""
        self._check_open()
        if ledger_id < 0 or entry_id < 0:
            raise BadRequestError(f"bad entry id {ledger_id}/{entry_id}")
        record = encode_add(ledger_id, entry_id, body)
        info = self._ledgers.get(ledger_id)
        if info is None:
            self._journal.ensure_room(2)
            info = self._register(ledger_id, master_key)
        # the LedgerInfo rides along: a ledger deleted and re-created meanwhile is another
        return record, (TYPE_ADD, ledger_id, entry_id, info)

    def _add_run(self, ledger_id: int, entry_ids: list[int], master_key: bytes,
                 bodies: list[bytes]) -> tuple[bytes, AddRun]:
        self._check_open()
        if ledger_id < 0 or not entry_ids or min(entry_ids) < 0:
            raise BadRequestError(f"bad entry ids of ledger {ledger_id}")
        run, sizes = encode_add_run(ledger_id, entry_ids, bodies)
        info = self._ledgers.get(ledger_id)
        if info is None:
            self._journal.ensure_room(len(sizes) + 1)
            info = self._register(ledger_id, master_key)
        return run, AddRun(KIND_ADD_RUN, ledger_id, entry_ids, sizes, info)

    def fence(self, ledger_id: int, master_key: bytes) -> asyncio.Future[JournalSync]:
        """Set fenced=True at once in memory (so later adds see it) and journal
        a FENCE record; resolves after its fsync.  The journal being FIFO,
        every add queued before the fence is durable and readable by then.
        An unknown ledger is registered with ``master_key`` first."""
        self._check_open()
        if ledger_id < 0:
            raise BadRequestError(f"bad ledger id {ledger_id}")
        journal = self._journal
        info = self._ledgers.get(ledger_id)
        if info is None:
            journal.ensure_room(2)
            info = self._register(ledger_id, master_key)
        else:
            journal.ensure_room(1)
        info.fenced = True
        self._fences += 1
        return journal.append(encode_fence(ledger_id), (TYPE_FENCE, ledger_id, None))

    def update_lac(self, ledger_id: int, lac: int) -> bool:
        """Raise the in-memory LAC to ``lac``; True if it increased.  Persisted
        only at checkpoints.  NoSuchLedgerError if the ledger is unknown."""
        info = self._ledgers.get(ledger_id)
        if info is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored here")
        if lac > info.lac:
            info.lac = lac
            return True
        return False

    def write_explicit_lac(self, ledger_id: int, lac: int) -> asyncio.Future[JournalSync]:
        """Journal an explicit LAC (durable when the future resolves); the
        in-memory LAC and explicit LAC are raised at once."""
        self._check_open()
        info = self._ledgers.get(ledger_id)
        if info is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored here")
        if lac < -1:
            raise BadRequestError(f"bad lac {lac}")
        fut = self._journal.append(encode_explicit_lac(ledger_id, lac),
                                   (TYPE_EXPLICIT_LAC, ledger_id, lac))
        if lac > info.explicit_lac:
            info.explicit_lac = lac
        if lac > info.lac:
            info.lac = lac
        return fut

    # --- reads --------------------------------------------------------------

    async def read_entry(self, ledger_id: int, entry_id: int) -> bytes:
        """The body of an entry; ``entry_id`` -1 means the last entry stored.

        NoSuchLedgerError if the ledger is unknown here, NoSuchEntryError if
        the entry is not stored, BookieIOError if the disk fails or the
        stored record does not verify.
        """
        self._check_open()
        info = self._ledgers.get(ledger_id)
        if info is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored here")
        if entry_id == LAST_ENTRY_ID:
            entry_id = info.last_entry_id
        loc = self._index.get(ledger_id, entry_id)
        if loc is None:
            raise NoSuchEntryError(f"entry {ledger_id}/{entry_id} is not stored here")
        self._reads += 1
        return await self._read_pool.run(self._reader.read, loc, ledger_id, entry_id)

    async def read_entries(self, ledger_id: int, first: int, count_max: int,
                           bytes_max: int) -> list[bytes]:
        """The bodies of the run of stored entries from ``first``: at most
        ``count_max``, and no more once their sizes pass ``bytes_max`` (the first
        is always returned).  Errors as :meth:`read_entry`."""
        self._check_open()
        if ledger_id not in self._ledgers:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored here")
        locs: list[Location] = []
        size = 0
        for loc in self._index.run(ledger_id, first, count_max):
            size += loc[2] - ADD_RECORD_OVERHEAD_BYTES
            if locs and size > bytes_max:
                break
            locs.append(loc)
        if not locs:
            raise NoSuchEntryError(f"entry {ledger_id}/{first} is not stored here")
        self._reads += len(locs)
        return await self._read_pool.run(self._reader.read_run, locs, ledger_id, first)

    # --- journal sink (see journal.BatchSink) ---------------------------------

    def apply_in_writer(self, records: list[bytes], items: list[Any]) -> BatchApplied:
        """Writer thread, while the batch's journal write is synced:
        :func:`.batch.write_batch`."""
        return write_batch(self._writer, self._kv_index, self._durable, records, items)

    def apply_on_loop(self, items: list[Any], result: BatchApplied) -> None:
        """Loop, before the batch's futures resolve: make the new entries readable."""
        added, deleted, live_delta = result
        index = self._index
        kv_index = self._kv_index
        ledgers = self._ledgers
        live = self._log_live
        written = 0
        if kv_index is not None:
            for ledger_id in deleted:
                kv_index.unhide(ledger_id)
            for log_id, delta in (live_delta or {}).items():
                live[log_id] = live.get(log_id, 0) + delta
        for (log_id, entry_ids, offsets, sizes), ledger_id, owner in added:
            nbytes = sum(sizes)
            written += nbytes
            info = ledgers.get(ledger_id)
            if info is None or info is not owner:
                continue  # deleted while its adds were being written: the copy is garbage
            if kv_index is None:
                live[log_id] = live.get(log_id, 0) + nbytes
                for old in index.put_run(ledger_id, entry_ids, log_id,  # type: ignore[union-attr]
                                         offsets, sizes):
                    live[old[0]] -= old[2]
            last = entry_ids[-1] if len(entry_ids) == 1 else max(entry_ids)
            if last > info.last_entry_id:
                info.last_entry_id = last
        self._checkpointer.after_batch(written, self._closed)

    # --- deletion and compaction ----------------------------------------------

    def delete_ledger(self, ledger_id: int) -> asyncio.Future[Any]:
        """Forget a ledger (garbage collection): unreadable at once, its deletion
        journaled; its space is reclaimed when its entry logs are compacted."""
        self._check_open()
        info = self._ledgers.pop(ledger_id, None)
        if info is None:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut
        dropped = self._index.delete_ledger(ledger_id)  # on disk: hidden until the writer
        live = self._log_live
        for log_id, _, length in dropped:
            live[log_id] -= length
        self._ledgers_deleted += 1
        deleted_ms = wall_ms(self._clock)
        self._tombstones[ledger_id] = deleted_ms
        return self._journal.append(encode_delete_ledger(ledger_id),
                                    (TYPE_DELETE_LEDGER, ledger_id, deleted_ms))

    async def entry_log_usage(self) -> dict[int, tuple[int, int]]:
        """``{log id: (live bytes, file bytes)}`` of every finished entry log (not the
        one being written).  The directory is listed off the event loop."""
        return await self._compactor.usage()

    async def compact_entry_log(self, log_id: int, rate_bytes_per_s: float = 0.0) -> int:
        """:meth:`compact_entry_logs` of one log."""
        return await self.compact_entry_logs([log_id], rate_bytes_per_s)

    async def compact_entry_logs(self, log_ids: Sequence[int],
                                 rate_bytes_per_s: float = 0.0) -> int:
        """Move the live entries of finished entry logs to the current one, make the
        move durable (one checkpoint), then delete those logs; returns the bytes freed.
        Adds and reads go on meanwhile; ``rate_bytes_per_s`` paces the reading
        (:mod:`.compaction`)."""
        return await self._compactor.compact(log_ids, rate_bytes_per_s)

    # --- checkpoints ----------------------------------------------------------

    async def checkpoint(self) -> None:
        """:meth:`.checkpointer.Checkpointer.checkpoint`: everything journaled so far
        made durable outside the journal, the journal files no longer needed deleted.
        BookieIOError if the journal failed."""
        await self._checkpointer.checkpoint()

    async def _housekeeping(self) -> None:
        """Refresh disk usage every second; checkpoint every checkpoint_interval_s."""
        interval = self._config.checkpoint_interval_s
        next_checkpoint = self._clock.monotonic_s() + interval
        while True:
            await self._clock.sleep(min(DISK_USAGE_REFRESH_S, interval))
            try:
                self._disk_usage = await self._read_pool.run(self._io.disk_usage,
                                                             self._ledger_dir)
            except OSError as exc:
                self._log.warning("statvfs failed", error=repr(exc))
            now = self._clock.monotonic_s()
            if now >= next_checkpoint and not self._journal.failed:
                next_checkpoint = now + interval
                try:
                    await self.checkpoint()
                except Exception as exc:
                    self._log.error("checkpoint failed", error=repr(exc))

    # --- shutdown -------------------------------------------------------------

    async def close(self) -> None:
        """Stop accepting, drain the journal queue (fsync), take a final
        checkpoint, stop the threads.  Idempotent."""
        await self._shutdown(graceful=True)

    async def abort(self) -> None:
        """Stop as if the process had been killed: nothing queued is written,
        pending futures fail with BookieIOError, no checkpoint.  For tests and
        fatal errors.  Idempotent (and a no-op after :meth:`close`)."""
        await self._shutdown(graceful=False)

    async def _shutdown(self, *, graceful: bool) -> None:
        if self._close_task is None:
            self._closed = True
            self._close_task = asyncio.get_running_loop().create_task(
                self._do_shutdown(graceful), name="asyncbk-storage-close")
        await asyncio.shield(self._close_task)

    async def _do_shutdown(self, graceful: bool) -> None:
        task = self._housekeeping_task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
        await self._checkpointer.wait()  # not cancelled: see Checkpointer.start
        journal = self._journal
        try:
            if graceful:
                await journal.drain()
                if not journal.failed:
                    try:
                        await self.checkpoint()
                    except Exception as exc:
                        self._log.error("final checkpoint failed", error=repr(exc))
            else:
                await journal.stop_now()
            try:
                await journal.run_in_writer(self._writer.close)
            except BookieIOError:  # the journal never started: no writer thread yet
                await self._read_pool.run(self._writer.close)
        finally:
            await journal.close()
            # Waits for in-flight reads, so no fd is closed under a pread.
            await self._read_pool.shutdown()
            await self._offload.run(self._reader.close)
            if self._kv_index is not None:
                await self._offload.run(self._kv_index.kv.close)
            self._log.info("storage closed", graceful=graceful)

    # --- statistics -----------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        free, total = self._disk_usage
        return {
            "ledgers": len(self._ledgers),
            "entries": len(self._index),
            "adds": self._adds,
            "reads": self._reads,
            "fences": self._fences,
            **self._checkpointer.statistics(),
            "ledgers_deleted": self._ledgers_deleted,
            "compactions": self._compactor.compactions,
            "compacted_bytes": self._compactor.compacted_bytes,
            "compaction_moved_bytes": self._compactor.moved_bytes,
            "entry_log_id": self._writer.log_id,
            "entry_log_bytes": self._writer.length,
            "index_bytes": self._writer.index_length,
            "disk_free_bytes": free,
            "disk_total_bytes": total,
            "recovery": dict(self._recovery_stats),
            "journal": self._journal.statistics(),
        }
