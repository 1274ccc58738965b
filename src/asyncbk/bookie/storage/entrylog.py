"""Entry logs: the journal's ADD records copied verbatim into
``ledger_dir/entrylog/<id:08x>.log``, and ``index.log`` beside them.

Every file access of the entry logs is here: :class:`EntryLogWriter` (the
journal's writer thread, or the recovery thread during open) appends records and
their index records; :class:`EntryLogReader` (the read pool) reads them back,
verified; the helpers below list, read, delete and sync them for compaction and
checkpoints.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from itertools import accumulate
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import BookieIOError
from ..fileio import OS_FILE_IO, FileIO
from ..journal_format import HEADER_BYTES, AddRecord, decode_one, record_size_at
from .index import INDEX_FILE, INDEX_RECORD, RECORD_SPAN_MAX, Location, deletion_marker
from .indexlog import INDEX_COMPACT_FILE

ENTRYLOG_DIR = "entrylog"


def entry_log_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


def parse_entry_log_name(name: str) -> int | None:
    """The id of an entry log file name (``entry_log_name``'s inverse), else None."""
    if len(name) != 12 or not name.endswith(".log"):
        return None
    digits = name[:8]
    if any(c not in "0123456789abcdef" for c in digits):
        return None
    return int(digits, 16)


class RunPiece(NamedTuple):
    """Records of one ledger written back to back in one entry log
    (:meth:`EntryLogWriter.append_run`): entry ``entry_ids[i]`` at ``offsets[i]``,
    ``sizes[i]`` bytes long."""

    log_id: int
    entry_ids: list[int]
    offsets: list[int]
    sizes: list[int]

class EntryLogWriter:
    """Appends ADD records to entry logs and index.log (``index_fd`` -1: none, the
    index is on disk).  Used by one thread at a time: the recovery thread during
    open, then the journal's writer thread.

    With index.log it also keeps :attr:`marks_due`: the deleted ledgers whose records
    in index.log no deletion marker voids yet.  The caller reports each deletion
    (:meth:`ledger_deleted`) and calls :meth:`mark_if_due` before applying any other
    journal record of a ledger, so a ledger re-created with a deleted one's id gets
    the marker in index.log before anything of its own."""

    def __init__(self, io: FileIO, directory: Path, bytes_max: int, log_id: int, fd: int,
                 length: int, index_fd: int, index_length: int) -> None:
        self.io = io
        self.directory = directory
        self.bytes_max = bytes_max
        self.log_id = log_id
        self.length = length
        self.index_length = index_length
        self.index_file = INDEX_FILE
        """The name of the file ``index_fd`` appends to (another while index.log is
        being rewritten: :mod:`.indexlog`)."""
        self._fd = fd
        self._index_fd = index_fd
        self._unsynced: list[int] = []
        self.marks_due: set[int] = set()

    def ledger_deleted(self, ledger_id: int) -> None:
        """The ledger was deleted (in journal order): its index.log records, if any,
        need a deletion marker before the id is used again."""
        if self._index_fd >= 0:
            self.marks_due.add(ledger_id)

    def mark_if_due(self, ledger_id: int) -> None:
        """Before a journal record of ``ledger_id`` (other than its deletion) is
        applied: append its deletion marker to index.log if one is due."""
        if ledger_id in self.marks_due:
            self.io.write(self._index_fd, deletion_marker(ledger_id))
            self.index_length += INDEX_RECORD.size
            self.marks_due.discard(ledger_id)

    def append(self, records: Sequence[bytes | memoryview],
               items: Sequence[tuple[int, int, Any]]) -> list[tuple[int, int, Location]]:
        """Append ADD records (items are ``(kind, ledger_id, entry_id)``); returns
        ``(ledger_id, entry_id, location)`` for each, in order."""
        out: list[tuple[int, int, Location]] = []
        pieces: list[bytes | memoryview] = []
        index: list[bytes] = []
        pack = INDEX_RECORD.pack
        off = self.length
        log_id = self.log_id
        for record, item in zip(records, items, strict=True):
            n = len(record)
            if off > 0 and off + n > self.bytes_max:
                self._write(pieces, index, off)
                pieces, index = [], []
                self._rotate()
                off = 0
                log_id = self.log_id
            ledger_id = item[1]
            entry_id = item[2]
            pieces.append(record)
            index.append(pack(ledger_id, entry_id, log_id, off, n))
            out.append((ledger_id, entry_id, (log_id, off, n)))
            off += n
        self._write(pieces, index, off)
        return out

    def append_run(self, run: bytes, ledger_id: int, entry_ids: list[int],
                   sizes: list[int]) -> list[RunPiece]:
        """Append a run of ADD records of one ledger (back to back in ``run``, each
        ``sizes[i]`` long, of entry ``entry_ids[i]``): one write when it fits in this
        log, else record by record as :meth:`append`.  Returns where they went, as
        pieces of consecutive records in one log."""
        off = self.length
        end = off + len(run)
        if end > self.bytes_max and not (off == 0 and len(sizes) == 1):
            view = memoryview(run)
            records = []
            start = 0
            for n in sizes:
                records.append(view[start:start + n])
                start += n
            written = self.append(records, [(0, ledger_id, e) for e in entry_ids])
            return [RunPiece(loc[0], [e], [loc[1]], [loc[2]])
                    for (_, e, loc) in written]
        offsets = list(accumulate(sizes[:-1], initial=off))
        log_id = self.log_id
        index: list[bytes] = []
        if self._index_fd >= 0:
            pack = INDEX_RECORD.pack
            index = [pack(ledger_id, e, log_id, o, n)
                     for e, o, n in zip(entry_ids, offsets, sizes, strict=True)]
        self._write([run], index, end)
        return [RunPiece(log_id, entry_ids, offsets, sizes)]

    def _write(self, pieces: list[bytes | memoryview], index: list[bytes], end: int) -> None:
        if not pieces:
            return
        self.io.write(self._fd, pieces[0] if len(pieces) == 1 else b"".join(pieces))
        self.length = end
        if self._index_fd >= 0:
            self.io.write(self._index_fd, b"".join(index))
            self.index_length += INDEX_RECORD.size * len(index)

    def _rotate(self) -> None:
        # The finished log is made durable by the next checkpoint (the only thing that
        # relies on entry logs being durable), not here: an fsync on this thread would
        # stall every group commit behind it.
        self._unsynced.append(self._fd)
        self._fd = -1
        new_id = self.log_id + 1
        path = self.directory / entry_log_name(new_id)
        self._fd = self.io.create(path, exclusive=True)
        self.log_id, self.length = new_id, 0

    def switch_index(self, path: Path, covered: int, length: int) -> None:
        """Append the index records from now on to ``path`` (a rewrite of the first
        ``covered`` bytes of the current file, ``length`` bytes long: :mod:`.indexlog`),
        after a copy of the records written after ``covered``."""
        tail = self.io.pread(self._index_fd, self.index_length - covered, covered)
        if len(tail) != self.index_length - covered:
            raise BookieIOError(f"short read of the index ({len(tail)} bytes after {covered})")
        fd = self.io.open_append(path)
        try:
            if self.io.size(fd) != length:
                raise BookieIOError(f"{path} has {self.io.size(fd)} bytes, not {length}")
            if tail:
                self.io.write(fd, tail)
        except BaseException:
            self.io.close(fd)
            raise
        old, self._index_fd = self._index_fd, fd
        self.index_file = path.name
        self.index_length = length + len(tail)
        self.io.close(old)

    def index_renamed(self, name: str) -> None:
        """The file the index records go to is now called ``name``."""
        self.index_file = name

    def take_for_sync(self) -> list[int]:
        """File descriptors a checkpoint must fdatasync before its mark is written:
        the logs finished since the last checkpoint (handed over) and duplicates of
        the current log and index (the caller closes them all)."""
        log_fd = self.io.dup(self._fd)
        try:
            index_fds = [self.io.dup(self._index_fd)] if self._index_fd >= 0 else []
        except BaseException:
            self.io.close(log_fd)
            raise
        fds, self._unsynced = self._unsynced, []  # handed over only once nothing can fail
        return [*fds, log_fd, *index_fds]

    def close(self) -> None:
        fds, self._unsynced = self._unsynced, []
        for fd in fds:
            self.io.close(fd)
        for name in ("_fd", "_index_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                self.io.close(fd)


class EntryLogReader:
    """``pread`` of entry records on the read pool; one read-only fd per log, kept open."""

    def __init__(self, directory: Path, io: FileIO = OS_FILE_IO) -> None:
        self.io = io
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._retired: list[int] = []
        self._gone: set[int] = set()
        """Logs forgotten (compacted away): never opened again."""
        self._lock = threading.Lock()
        self._closed = False

    def _fd(self, log_id: int) -> int:
        with self._lock:
            if self._closed:
                raise BookieIOError("storage is closed")
            fd = self._fds.get(log_id)
            if fd is None:
                if log_id in self._gone:
                    raise BookieIOError(f"entry log {log_id} was compacted away (a read "
                                        "that looked its entry up before the move)")
                fd = self.io.open_read(self.directory / entry_log_name(log_id))
                self._fds[log_id] = fd
            return fd

    def read(self, loc: Location, ledger_id: int, entry_id: int) -> bytes:
        log_id, offset, length = loc
        if not HEADER_BYTES < length <= RECORD_SPAN_MAX or not 0 <= offset <= 0xFFFFFFFF:
            raise BookieIOError(f"entry {ledger_id}/{entry_id}: bad location {loc}")
        try:
            data = self.io.pread(self._fd(log_id), length, offset)
        except OSError as exc:
            raise BookieIOError(f"reading entry {ledger_id}/{entry_id}: {exc}") from exc
        got = decode_one(data)
        if got is None or len(data) != length:
            raise BookieIOError(
                f"entry {ledger_id}/{entry_id} is corrupt in entry log {log_id} at {offset}"
            )
        record = got[0]
        if (not isinstance(record, AddRecord) or record.ledger_id != ledger_id
                or record.entry_id != entry_id):
            raise BookieIOError(f"index points entry {ledger_id}/{entry_id} at another record")
        return record.body

    def forget(self, log_id: int) -> None:
        """Retire the descriptor of a log about to be deleted (compaction).  It stays
        open until the next retirement, so a read already holding it still works (an
        unlinked file stays readable through an open descriptor); the log is never
        opened again (a read reaching it now fails rather than keep its file open)."""
        with self._lock:
            self._gone.add(log_id)
            fd = self._fds.pop(log_id, None)
            old, self._retired = self._retired, [fd] if fd is not None else []
        for each in old:
            self.io.close(each)

    def read_run(self, locs: Sequence[Location], ledger_id: int, first: int) -> list[bytes]:
        """The bodies of entries ``first, first + 1, ...`` at ``locs``.  Records that
        lie back to back in one entry log (a ledger written alone) are read with a
        single ``pread``."""
        if any(not HEADER_BYTES < n <= RECORD_SPAN_MAX or not 0 <= o <= 0xFFFFFFFF
               for _, o, n in locs):
            raise BookieIOError(f"entries of ledger {ledger_id}: bad location")
        out: list[bytes] = []
        i = 0
        while i < len(locs):
            log_id, offset, length = locs[i]
            j = i + 1
            end = offset + length
            while j < len(locs) and locs[j][0] == log_id and locs[j][1] == end:
                end += locs[j][2]
                j += 1
            try:
                data = self.io.pread(self._fd(log_id), end - offset, offset)
            except OSError as exc:
                raise BookieIOError(f"reading entries of ledger {ledger_id}: {exc}") from exc
            if len(data) != end - offset:
                raise BookieIOError(f"entry log {log_id} is shorter than its index says")
            pos = 0
            for k in range(i, j):
                entry_id = first + k
                got = decode_one(data, pos)
                record = got[0] if got is not None else None
                if (got is None or got[1] != pos + locs[k][2] or not isinstance(record, AddRecord)
                        or record.ledger_id != ledger_id or record.entry_id != entry_id):
                    raise BookieIOError(f"entry {ledger_id}/{entry_id} is corrupt in entry log "
                                        f"{log_id} at {offset + pos}")
                out.append(record.body)
                pos = got[1]
            i = j
        return out

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds, self._fds = self._fds, {}
            retired, self._retired = self._retired, []
        for fd in [*fds.values(), *retired]:
            self.io.close(fd)


def entry_log_sizes(io: FileIO, directory: Path) -> dict[int, int]:
    """``{log id: file bytes}`` of every entry log in ``directory`` (compaction's usage)."""
    out: dict[int, int] = {}
    for name, size in io.list_dir(directory):
        log_id = parse_entry_log_name(name)
        if log_id is not None:
            out[log_id] = size
    return out


def pread_path(io: FileIO, path: Path, length: int, offset: int) -> bytes:
    """``length`` bytes of ``path`` from ``offset`` (a file opened for the read only), or
    more if the record that starts there is longer (compaction's chunked scan)."""
    fd = io.open_read(path)
    try:
        data = io.pread(fd, length, offset)
    finally:
        io.close(fd)
    # a record longer than the chunk: read exactly as much as it needs (unless the file
    # ended first: a torn tail, returned as it is, for the caller to judge)
    need = record_size_at(data, 0)
    if need is not None and need > len(data) == length:
        return pread_path(io, path, need, offset)
    return data


def sync_and_close(io: FileIO, fds: list[int]) -> None:
    """fdatasync each descriptor, then close them all (even after a failed sync, which
    raises): what :meth:`EntryLogWriter.take_for_sync` handed over."""
    try:
        for fd in fds:
            io.fdatasync(fd)
    finally:
        for fd in fds:
            io.close(fd)


def remove_index_log(io: FileIO, ledger_dir: Path) -> None:
    """Remove ``index.log`` (and a rewrite of it) for good (the index moved to the
    on-disk backend and a checkpoint naming it was written), durably."""
    io.unlink(ledger_dir / INDEX_FILE, missing_ok=True)
    io.unlink(ledger_dir / INDEX_COMPACT_FILE, missing_ok=True)
    io.fsync_dir(ledger_dir)
