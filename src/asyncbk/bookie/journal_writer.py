"""The journal's files, as its writer thread sees them: :class:`JournalFileWriter`.

:class:`~.journal.Journal` owns the queue, the waiters and the statistics on the event
loop and hands each group commit to its writer thread; there, this object writes the
batch at the end of the current file and ``fdatasync``s it, starts the next file once
the current one is full, and allocates zeros ahead of the writes
(``journal_preallocate_bytes``): a write into space already allocated changes no file
size, so its ``fdatasync`` has only the data to make durable (about a third less time
for a small batch on ext4).  A file is cut to its last record, durably, before the next
one starts and at a graceful close, so the zeros only ever follow the last record of
the last file (where a replay cuts them: :mod:`.journal_format`).

Between a batch's write and its ``fdatasync`` the writer can do other work (``meanwhile``
of :meth:`JournalFileWriter.write`: the ledger storage copies the batch to its entry
log there).  For a batch of some size (:data:`EARLY_WRITEBACK_BYTES_MIN`) it first asks
the kernel to start writing the batch's pages to the disk (``sync_file_range``,
:meth:`~.fileio.FileIO.start_writeback`), so the disk works while the thread does: the
``fdatasync`` that follows waits only for what is left of the write and the disk's
cache flush.  Nothing is acknowledged before that ``fdatasync`` returns, as before.
Everything here runs on the writer thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from ..config import BookieConfig
from .fileio import FileIO
from .journal_format import journal_file_name

EARLY_WRITEBACK_BYTES_MIN = 32 * 1024
"""Batches from this size on start the disk's write before ``meanwhile`` (module
docstring).  Below it the overlap is too short to pay for the extra call: a lone add
measured no faster with it, and its bookie used more CPU (benchmarks/README.md)."""


class SyncedWrite(NamedTuple):
    """One batch written and synced: when (wall clock, ns) and how long (s)."""

    start_ns: int
    end_ns: int
    write_s: float
    fsync_s: float
    """The ``fdatasync`` alone (what the disk had left to do after ``meanwhile``)."""
    meanwhile: Any = None
    """What ``meanwhile`` returned (None without one)."""


class JournalFileWriter:
    """Writes batches to ``<seq>.jnl`` files in ``directory`` (writer thread only)."""

    def __init__(self, directory: Path, io: FileIO, config: BookieConfig, log: Any,
                 first_seq: int) -> None:
        self.directory = directory
        self.io = io
        self._log = log
        self._file_bytes_max = config.journal_file_bytes_max
        self._sync = config.journal_sync
        self._preallocate = config.journal_preallocate_bytes
        self._early_writeback = True
        """Start the disk's write before ``meanwhile`` (off for good once the system
        refuses it: the syncs are then as they would be without it)."""
        self._fd = -1
        self.seq = first_seq
        self.offset = 0
        """Just past the last record written in file ``seq``."""
        self._allocated = 0
        """The current file's length: its records, then zeros allocated ahead of them."""
        self.files_created = 0

    def open(self, seq: int) -> None:
        """Create file ``seq`` (durably in its directory) and write there from now on."""
        path = self.directory / journal_file_name(seq)
        fd = self.io.create(path, exclusive=True)
        try:
            self.io.fsync_dir(self.directory)
        except BaseException:
            self.io.close(fd)
            raise
        self._fd, self.seq, self.offset, self._allocated = fd, seq, 0, 0
        self.files_created += 1

    def write(self, buf: bytes, meanwhile: Callable[[], Any] | None = None) -> SyncedWrite:
        """Write ``buf`` (whole records) after the last record and sync it; in the next
        file if the current one is full.  ``meanwhile`` runs between the write and the
        ``fdatasync``, while the disk writes ``buf`` (module docstring); if it raises,
        nothing is synced and the exception propagates."""
        if self.offset >= self._file_bytes_max:
            # The previous batch was synced into the old file: it is complete.
            self._finish()
            self.open(self.seq + 1)
        end = self.offset + len(buf)
        if self._preallocate and end > self._allocated:
            self._extend(end)
        # performance timers: only reported (write and fsync latency statistics)
        start_ns = time.time_ns()  # (wall clock: where tracing spans put it)
        t0 = time.perf_counter()
        if self._allocated:
            self.io.pwrite(self._fd, buf, self.offset)
        else:
            self.io.write(self._fd, buf)
        t1 = time.perf_counter()
        result = None
        if meanwhile is not None:
            if self._sync and self._early_writeback and len(buf) >= EARLY_WRITEBACK_BYTES_MIN:
                self._start_writeback(self.offset, len(buf))
            result = meanwhile()
        t2 = time.perf_counter()
        if self._sync:
            self.io.fdatasync(self._fd)
        t3 = time.perf_counter()
        self.offset = end
        return SyncedWrite(start_ns, time.time_ns(), t1 - t0, t3 - t2, result)

    def close(self, *, cut: bool) -> None:
        """Close the current file; with ``cut``, after cutting its preallocated zeros (it
        then ends at its last record, as it would without them).  A disk failing the
        cut only closes it (a replay cuts zeros too)."""
        if self._fd >= 0 and cut:
            try:
                self._finish()
                return
            except OSError as exc:
                self._log.warning("journal: could not cut the preallocated space at close",
                                  error=str(exc))
        self._close()

    def _start_writeback(self, offset: int, length: int) -> None:
        try:
            self.io.start_writeback(self._fd, offset, length)
        except OSError as exc:  # (a file system without it: sync as before)
            self._early_writeback = False
            self._log.warning("journal: the disk's write cannot be started before the "
                              "fdatasync here; syncing without it", error=str(exc))

    def _extend(self, end: int) -> None:
        """Allocate zeros up to ``end`` and ``journal_preallocate_bytes`` past it.  A file
        system that cannot (no space for the zeros, no support) gets plain appends from
        then on."""
        allocated = max(end, min(end + self._preallocate, self._file_bytes_max))
        try:
            self.io.preallocate(self._fd, allocated)
        except OSError as exc:
            self._preallocate = 0
            self._log.warning("journal preallocation failed; appending without it",
                              error=str(exc), file=journal_file_name(self.seq))
            return
        self._allocated = allocated

    def _finish(self) -> None:
        """Cut the file's preallocated zeros, durably, then close it: a replay reads on
        from its last record into the next file."""
        if self._allocated > self.offset:
            self.io.truncate(self._fd, self.offset)
            self.io.fdatasync(self._fd)
        self._close()

    def _close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self.io.close(fd)


__all__ = ["JournalFileWriter", "SyncedWrite"]
