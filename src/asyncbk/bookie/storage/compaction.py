"""Compaction: moving the live entries of finished entry logs into the current one,
then deleting those logs (driven by :mod:`..gc` through
:meth:`LedgerStorage.compact_entry_logs <.ledger_storage.LedgerStorage.compact_entry_logs>`).

The records are copied verbatim through the journal's writer thread (so they
interleave with adds), paced by a :class:`~asyncbk.clock.RateLimiter`; one
checkpoint makes the copies durable before the old logs go.

With the on-disk index, the copies are re-indexed only once a checkpoint covers
them (:data:`RELOCATE_ENTRIES_MAX` at a time): LMDB may be written ahead of the
checkpoint's mark (the write cache flushes its layers in the background), and a
restart cuts every entry placed after the mark, relying on the journal to put it
back, which it cannot for a move.  An entry pointed at a copy the restart cut
would be lost, though its old log is still there; pointed at a copy below the
mark, it never is.  (With ``index.log``, a move after the mark is cut with the
file and the record before it, still in the file, points at the old log.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ...clock import Clock, RateLimiter
from ...errors import BadRequestError, BookieIOError
from ..fileio import FileIO, Worker
from ..freeing import shrink_then_unlink_paced
from ..journal import Journal
from ..journal_format import TYPE_ADD, AddRecord, scan_records
from .entrylog import (
    EntryLogReader,
    EntryLogWriter,
    entry_log_name,
    entry_log_sizes,
    pread_path,
)
from .index import EntryIndex, Location
from .kvindex import KVEntryIndex

COMPACTION_CHUNK_BYTES = 4 * 1024 * 1024
COMPACTION_READ_GRACE_S = 0.5
"""After moving a log's entries, how long reads that already looked up the old place
get; and again after retiring its descriptor, before the file is cut (reads that
already took the descriptor)."""
RELOCATE_ENTRIES_MAX = 65_536
"""On-disk index: entries copied before a checkpoint covers the copies and they are
re-indexed (module docstring); bounds the moves kept in memory meanwhile."""


class EntryLogCompactor:
    """Compaction of one storage's entry logs (loop side; file work on the read pool).

    Shares the storage's index, entry log writer and reader, journal, and
    ``live`` (live bytes of each entry log), and takes its checkpoints.
    """

    def __init__(self, *, entrylog_dir: Path, index: EntryIndex | KVEntryIndex, writer: EntryLogWriter,
                 reader: EntryLogReader, journal: Journal, read_pool: Worker,
                 live: dict[int, int], checkpoint: Callable[[], Awaitable[None]],
                 clock: Clock, log: Any, io: FileIO) -> None:
        self._io = io
        self._entrylog_dir = entrylog_dir
        self._index = index
        self._writer = writer
        self._reader = reader
        self._journal = journal
        self._read_pool = read_pool
        self._live = live
        self._checkpoint = checkpoint
        self._clock = clock
        self._log = log
        # statistics
        self.compactions = 0
        self.compacted_bytes = 0
        self.moved_bytes = 0

    async def usage(self) -> dict[int, tuple[int, int]]:
        """``{log id: (live bytes, file bytes)}`` of every finished entry log (not the
        one being written).  The directory is listed off the event loop."""
        current = self._writer.log_id
        sizes = await self._read_pool.run(entry_log_sizes, self._io, self._entrylog_dir)
        live = self._live
        return {log_id: (max(0, live.get(log_id, 0)), size)
                for log_id, size in sizes.items() if log_id < current}

    async def compact(self, log_ids: Sequence[int], rate_bytes_per_s: float = 0.0) -> int:
        """Move the live entries of finished entry logs to the current one, make the
        move durable (one checkpoint), then delete those logs; returns the bytes freed.
        Adds and reads go on meanwhile; ``rate_bytes_per_s`` paces the reading."""
        current = self._writer.log_id
        for log_id in log_ids:
            if log_id >= current:
                raise BadRequestError(f"entry log {log_id} is still being written")
        sizes: dict[int, int] = {}
        moved = 0
        pacer = RateLimiter(rate_bytes_per_s, burst=COMPACTION_CHUNK_BYTES, clock=self._clock)
        for log_id in log_ids:
            path = self._entrylog_dir / entry_log_name(log_id)
            sizes[log_id] = await self._read_pool.run(self._io.file_size, path)
            moved += await self._move_live_entries(log_id, path, sizes[log_id], pacer)
        if not log_ids:
            return 0
        await self._checkpoint()  # the moved copies are durable before the old logs go
        await self._clock.sleep(COMPACTION_READ_GRACE_S)  # reads that looked the old place up
        for log_id in log_ids:
            await self._read_pool.run(self._reader.forget, log_id)
        await self._clock.sleep(COMPACTION_READ_GRACE_S)  # reads that took the descriptor
        for log_id in log_ids:
            # Cut in steps, not unlinked at once: freeing a 1 GiB log in one commit held
            # the journals' fdatasyncs on the same disk 41-84 ms (..freeing).  Cut short
            # by a crash or a cancellation, the log stays with no live entry and a torn
            # tail, which the next compaction reads up to and deletes.
            await shrink_then_unlink_paced(self._read_pool, self._io,
                                           self._entrylog_dir / entry_log_name(log_id),
                                           self._clock.sleep)
            self._live.pop(log_id, None)
        total = sum(sizes.values())
        self.compactions += len(log_ids)
        self.compacted_bytes += total
        self.moved_bytes += moved
        self._log.info("entry logs compacted", entry_logs=list(log_ids),
                       bytes_freed=total - moved, bytes_moved=moved)
        return total - moved

    async def _move_live_entries(self, log_id: int, path: Path, size: int,
                                 pacer: RateLimiter) -> int:
        offset = 0
        moved = 0
        kv_index = self._index if isinstance(self._index, KVEntryIndex) else None
        copies: list[tuple[Location, tuple[int, int, Location]]] = []
        """On-disk index: copies written, not yet re-indexed (old place, new entry)."""
        while offset < size:
            data = await self._read_pool.run(pread_path, self._io, path,
                                             COMPACTION_CHUNK_BYTES, offset)
            if not data:
                break
            pairs, good = scan_records(data)
            if not pairs:
                if offset + len(data) >= size and self._live.get(log_id, 0) <= 0:
                    break  # a log whose deletion a crash cut short: nothing live was left
                raise BookieIOError(f"entry log {log_id} is corrupt at {offset}")
            raws: list[bytes] = []
            items: list[tuple[int, int, Any]] = []
            olds: list[Location] = []
            view = memoryview(data)
            for i, (off, record) in enumerate(pairs):
                end = pairs[i + 1][0] if i + 1 < len(pairs) else good
                if not isinstance(record, AddRecord):
                    continue
                loc = (log_id, offset + off, end - off)
                if self._index.get(record.ledger_id, record.entry_id) != loc:
                    continue  # deleted, or overwritten since: garbage
                raws.append(bytes(view[off:end]))
                items.append((TYPE_ADD, record.ledger_id, record.entry_id))
                olds.append(loc)
            del view
            if raws:
                result = await self._journal.run_in_writer(self._writer.append, raws, items)
                if kv_index is not None:
                    copies.extend(zip(olds, result, strict=True))
                    if len(copies) >= RELOCATE_ENTRIES_MAX:
                        await self._relocate_on_disk(kv_index, copies)
                        copies = []
                else:
                    self._relocate(olds, result)
                moved += sum(len(r) for r in raws)
            offset += good
            await pacer.acquire(good)
        if kv_index is not None and copies:
            await self._relocate_on_disk(kv_index, copies)
        return moved

    async def _relocate_on_disk(self, index: KVEntryIndex,
                                copies: list[tuple[Location, tuple[int, int, Location]]]
                                ) -> None:
        """On-disk index: a checkpoint covers the copies first (module docstring), then
        the writer points the entries at them unless they changed meanwhile."""
        await self._checkpoint()
        delta = await self._journal.run_in_writer(
            index.relocate, [old for old, _ in copies], [new for _, new in copies])
        live = self._live
        for log_id, change in delta.items():
            live[log_id] = live.get(log_id, 0) + change

    def _relocate(self, olds: list[Location], result: list[tuple[int, int, Location]]) -> None:
        """Point moved entries at their new place, unless they changed meanwhile."""
        live = self._live
        index = self._index
        for old, (ledger_id, entry_id, new) in zip(olds, result, strict=True):
            if index.get(ledger_id, entry_id) != old:
                continue  # deleted or overwritten while being moved: the copy is garbage
            index.put(ledger_id, entry_id, new)  # type: ignore[union-attr]
            live[new[0]] = live.get(new[0], 0) + new[2]
            live[old[0]] -= old[2]
