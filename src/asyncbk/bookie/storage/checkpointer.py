"""Checkpoints and entry-log flushes of one :class:`~.ledger_storage.LedgerStorage`
(the package docstring's "Checkpoint" paragraph; the file format is :mod:`.checkpoint`).

A checkpoint captures, on the journal's writer thread, where the journal, the entry
logs and the index stand and the ledger state those batches produced
(:func:`.checkpoint.capture_checkpoint`); then, on another thread while adds go on, it makes the
captured entry logs and index durable, writes the checkpoint file and deletes the
journal files wholly before the mark.  A background flush (every
``entry_log_flush_bytes``) fsyncs finished entry logs between checkpoints under the
same lock, so a checkpoint never misses a log handed over for syncing.

The on-disk index's write cache is written to LMDB in the background too, a frozen
layer per synced transaction (:mod:`.writecache`), as layers fill; with the
in-memory index, ``index.log`` is rewritten right after a checkpoint once it is
mostly dead (:mod:`.indexlog`, which takes two more checkpoints, under the same lock).

A failed sync fails the journal (:meth:`Checkpointer.sync_failed`): data lost at a
failed fsync must never be covered by a later mark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...clock import Clock
from ...config import BookieConfig
from ...errors import BookieIOError
from ..fileio import FileIO, Offload
from ..journal import Journal
from .checkpoint import CheckpointWork, DurableState, capture_checkpoint, make_durable
from .entrylog import EntryLogWriter, sync_and_close
from .index import INDEX_FILE
from .indexlog import (
    INDEX_COMPACT_FILE,
    compaction_due,
    finish_rename,
    write_compacted_index,
)
from .writecache import WriteCacheKV


def wall_ms(clock: Clock) -> int:
    """The clock's wall time in epoch milliseconds (tombstones are dated with it)."""
    return int(clock.wall_s() * 1000)


def _checkpoint_done(task: asyncio.Task[None]) -> None:
    """Done callback of a checkpoint's task: its failure is its caller's to report, and
    one whose caller was cancelled fails unobserved (a failed sync has failed the
    journal and logged already)."""
    if not task.cancelled():
        task.exception()


class Checkpointer:
    """The checkpoints and background entry-log flushes of one storage."""

    def __init__(self, *, journal: Journal, writer: EntryLogWriter, durable: DurableState,
                 lacs: Callable[[], dict[int, int]], ledger_dir: Path, config: BookieConfig,
                 io: FileIO, offload: Offload, clock: Clock, log: Any,
                 kv_cache: WriteCacheKV | None,
                 index_entries: Callable[[], int] | None = None) -> None:
        self._journal = journal
        self._writer = writer
        self._durable = durable
        self._lacs = lacs
        """The loop-side LACs to record (``{ledger: lac}``, those >= 0)."""
        self._ledger_dir = ledger_dir
        self._config = config
        self._io = io
        self._offload = offload
        self._clock = clock
        self._log = log
        self._kv_cache = kv_cache
        self._index_entries = index_entries
        """The in-memory index's entry count (its ``len``), to tell how much of
        ``index.log`` is dead; None with the on-disk index."""
        self._index_log_broken = False
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        """Checkpoints under way or waiting for the lock (see :meth:`start`)."""
        self._flush_task: asyncio.Task[None] | None = None
        self._index_flush_task: asyncio.Task[None] | None = None
        self._unflushed_bytes = 0
        self._last_key: tuple[Any, ...] | None = None
        """Writer thread only: what the last checkpoint written covered."""
        # statistics
        self.checkpoints = 0
        self.skipped = 0
        self.early = 0
        self.index_cache_keys_max = 0
        self.s_last = 0.0
        self.s_max = 0.0
        self.journal_files_deleted = 0
        self.entry_log_flushes = 0
        self.index_flushes = 0
        self.index_log_compactions = 0
        self.index_log_bytes_dropped = 0

    # --- checkpoints ----------------------------------------------------------

    async def checkpoint(self) -> None:
        """Make everything journaled so far durable outside the journal and delete
        the journal files that are no longer needed.  BookieIOError if the
        journal failed (a checkpoint then could skip records that never reached
        the entry log)."""
        if self._journal.failed:
            raise BookieIOError("journal failed: not checkpointing")
        await asyncio.shield(self.start())

    def start(self) -> asyncio.Task[None]:
        """The checkpoint in its own task, which the caller's cancellation (the
        housekeeping task's at close, a compaction's) does not stop: once captured,
        the checkpoint alone holds the entry logs finished since the last one, handed
        over for their fdatasync; dropped, they would never be synced, yet the next
        checkpoint's mark would cover them and trim the journal, their only durable
        copy.  (:meth:`wait` waits for it.)"""
        task = asyncio.get_running_loop().create_task(self._run(), name="asyncbk-checkpoint")
        self._tasks.add(task)
        task.add_done_callback(_checkpoint_done)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run(self) -> None:
        async with self._lock:
            work = await self._checkpoint_locked()
            if work is not None and self._index_log_compaction_due():
                await self._compact_index_log(work.payload)

    async def _checkpoint_locked(self) -> CheckpointWork | None:
        """One checkpoint (the lock held); what it wrote, None if it was skipped."""
        if self._journal.failed:  # an entry log sync failed while this one waited
            raise BookieIOError("journal failed: not checkpointing")
        t0 = time.perf_counter()  # performance timer: only reported (checkpoint_s_*)
        work = await self._journal.run_in_writer(self.capture, self._lacs(),
                                                 wall_ms(self._clock))
        if work is None:
            self.skipped += 1
            return None
        # The slow part (fdatasync of the entry logs and index, the checkpoint file,
        # journal file removal) runs off the writer thread: adds keep committing.
        try:
            await self._offload.run(self.write, work)
        except OSError as exc:
            self.sync_failed(exc)
            raise BookieIOError(f"checkpoint failed: {exc}") from exc
        self._last_key = work.key
        elapsed = time.perf_counter() - t0
        self.checkpoints += 1
        self.s_last = elapsed
        self.s_max = max(self.s_max, elapsed)
        return work

    # --- index.log compaction -----------------------------------------------------

    def _index_log_compaction_due(self) -> bool:
        """``index.log`` (the in-memory index) is dead enough to rewrite (:mod:`.indexlog`)."""
        entries = self._index_entries
        if entries is None or self._index_log_broken or self._writer.index_file != INDEX_FILE:
            return False
        return compaction_due(self._writer.index_length, entries(),
                              self._config.index_log_compaction_bytes_min)

    async def _compact_index_log(self, payload: dict[str, Any]) -> None:
        """Rewrite ``index.log`` right after the checkpoint ``payload`` was written (the
        lock held): steps 1 to 4 of :mod:`.indexlog`.  Until the writer switched to the
        new file, a failure leaves ``index.log`` as it was (the new file is rewritten
        next time, or removed at the next start); after it, failures are those of a
        checkpoint."""
        io, ledger_dir, writer = self._io, self._ledger_dir, self._writer
        covered = payload["index_length"]
        before = writer.index_length
        try:
            length = await self._offload.run(
                write_compacted_index, io, ledger_dir, covered,
                {ledger[0] for ledger in payload["ledgers"]}, payload["entry_log_id"])
            await self._journal.run_in_writer(
                writer.switch_index, ledger_dir / INDEX_COMPACT_FILE, covered, length)
        except BookieIOError as exc:  # a corrupt record: the next start will say so too
            self._index_log_broken = True
            self._log.error("index.log not compacted", error=repr(exc))
            return
        except OSError as exc:  # (disk full, say) nothing switched: index.log as it was
            self._log.warning("index.log not compacted", error=repr(exc))
            return
        await self._checkpoint_locked()  # names the new file: it is the index now
        try:
            await self._offload.run(finish_rename, io, ledger_dir)
        except OSError as exc:
            self.sync_failed(exc)
            raise BookieIOError(f"index.log rename failed: {exc}") from exc
        await self._journal.run_in_writer(writer.index_renamed, INDEX_FILE)
        await self._checkpoint_locked()  # names index.log again
        self.index_log_compactions += 1
        self.index_log_bytes_dropped += max(0, before - length)
        self._log.info("index.log compacted", bytes_before=before, bytes_after=length,
                       covered=covered)

    def capture(self, lacs: dict[int, int], now_ms: int) -> CheckpointWork | None:
        """Writer thread, between batches: where the checkpoint stands (cheap).
        ``now_ms``: the clock's wall time when the checkpoint began (tombstone expiry)."""
        journal = self._journal
        if journal.writer_failed:
            raise BookieIOError("journal failed: not checkpointing")
        return capture_checkpoint(journal.position, self._writer, self._durable, lacs,
                                  now_ms, self._config.gc_tombstone_s, self._last_key,
                                  self._kv_cache)

    def write(self, work: CheckpointWork) -> None:
        """A worker thread: make the captured state durable, then write the mark."""
        make_durable(self._io, work, self._ledger_dir)
        self.journal_files_deleted += self._journal.delete_files_before(
            work.payload["journal_seq"])

    def sync_failed(self, exc: OSError) -> None:
        """An fsync (or another write) making entry logs, index or checkpoint durable
        failed.  Its data may be lost for good while reads still see it (after a failed
        fsync the kernel marks the pages clean: a retry succeeds having written
        nothing), so no later checkpoint may cover it and trim the journal that holds
        the only durable copy: the journal is failed, nothing more is acknowledged,
        and a restart replays the journal from the last good checkpoint."""
        self._log.error("storage sync failed: no more checkpoints or adds until restart",
                        error=repr(exc))
        self._journal.fail(BookieIOError(f"storage sync failed: {exc}"))

    # --- after each batch -------------------------------------------------------

    def after_batch(self, written: int, closed: bool) -> None:
        """Loop, after a batch was applied (``written`` entry-log bytes): start a
        checkpoint early when the index write cache is past its bound, and a background
        entry-log flush every ``entry_log_flush_bytes``."""
        cache = self._kv_cache
        if cache is not None:
            cached = cache.cached_entries
            if cached > self.index_cache_keys_max:
                self.index_cache_keys_max = cached
            if not closed and not self._journal.failed:
                if cache.frozen_entries and self._index_flush_task is None:
                    # A layer of the index write cache is frozen: write it to LMDB now,
                    # off the writer thread and the loop, a layer per synced commit.
                    self._index_flush_task = asyncio.get_running_loop().create_task(
                        self._flush_index(cache), name="asyncbk-index-flush")
                if cache.over_limit and not self._tasks:
                    # Past its bound all the same (the flushes fall behind): a checkpoint
                    # flushes it too (its capture freezes the current layer).
                    self.early += 1
                    self.start()
        flush_bytes = self._config.entry_log_flush_bytes
        if flush_bytes and written:
            self._unflushed_bytes += written
            if self._unflushed_bytes >= flush_bytes and self._flush_task is None \
                    and not closed:
                self._unflushed_bytes = 0
                self._flush_task = asyncio.get_running_loop().create_task(
                    self._flush_entry_logs(), name="asyncbk-entrylog-flush")

    async def _flush_index(self, cache: WriteCacheKV) -> None:
        """Write the frozen layers of the index write cache into LMDB (a worker thread;
        :meth:`.writecache.WriteCacheKV.flush`).  A failure fails the journal, as a
        failed checkpoint sync does: the layers are kept, but no checkpoint may cover
        them now."""
        try:
            while cache.frozen_entries and not self._journal.failed:
                await self._offload.run(cache.flush)
                self.index_flushes += 1
        except OSError as exc:
            self.sync_failed(exc)
        except Exception as exc:  # (flush raises OSError: a bug, but no less a failure)
            self.sync_failed(OSError(f"index flush failed: {exc!r}"))
        finally:
            self._index_flush_task = None

    async def _flush_entry_logs(self) -> None:
        """Write back what was added to the entry logs so far (off the writer thread),
        so the next checkpoint has little left to flush and does not stall the disk."""
        try:
            async with self._lock:  # a checkpoint must not miss a handed-over log
                fds = await self._journal.run_in_writer(self._writer.take_for_sync)
                try:
                    await self._offload.run(sync_and_close, self._io, fds)
                except OSError as exc:
                    self.sync_failed(exc)
                    return
                self.entry_log_flushes += 1
        except (BookieIOError, OSError) as exc:  # nothing synced: the next checkpoint does
            self._log.warning("entry log flush not done", error=repr(exc))
        finally:
            self._flush_task = None

    async def wait(self) -> None:
        """Wait for the flush and the checkpoints under way (never cancelled: they own
        file descriptors, and dropping a captured checkpoint loses its logs' sync)."""
        if self._flush_task is not None:
            await asyncio.wait([self._flush_task])
        if self._index_flush_task is not None:
            await asyncio.wait([self._index_flush_task])
        if self._tasks:
            await asyncio.wait(list(self._tasks))

    def statistics(self) -> dict[str, Any]:
        cache = self._kv_cache
        return {
            "checkpoints": self.checkpoints,
            "checkpoints_skipped": self.skipped,
            "checkpoints_early": self.early,
            "index_cache_keys": cache.cached_entries if cache is not None else 0,
            "index_cache_keys_max": self.index_cache_keys_max,
            "index_cache_flushes": cache.flushes if cache is not None else 0,
            "index_background_flushes": self.index_flushes,
            "index_log_compactions": self.index_log_compactions,
            "index_log_bytes_dropped": self.index_log_bytes_dropped,
            "checkpoint_s_last": self.s_last,
            "checkpoint_s_max": self.s_max,
            "journal_files_deleted": self.journal_files_deleted,
            "entry_log_flushes": self.entry_log_flushes,
        }
