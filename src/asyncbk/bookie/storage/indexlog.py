"""Compaction of ``index.log`` (the in-memory index's file): rewritten at a
checkpoint once most of it is dead, so it does not grow for ever.

``index.log`` is append-only: a record is superseded by a later one for the same
entry (a compaction's move, an add written again), voided by a deletion marker, or
left behind by a deleted ledger.  Once dead records make up at least
:data:`INDEX_LOG_DEAD_SHARE_MAX` of a file of at least
``index_log_compaction_bytes_min``, the checkpointer (:mod:`.checkpointer`) rewrites
it, right after writing a checkpoint ``k`` that covers its first ``L`` bytes:

1. (a worker thread) :func:`write_compacted_index`: read ``index.log[0, L)`` and
   write to :data:`INDEX_COMPACT_FILE` one record per entry the load would index,
   for the ledgers ``k`` knows; fsync it and the directory.  Loading it gives the
   same index as loading ``index.log[0, L)`` (and dropping the ledgers ``k`` does not
   know, as a start-up does).
2. (the writer thread, between batches)
   :meth:`~.entrylog.EntryLogWriter.switch_index`: the records written after ``L``
   are copied after it and the writer appends to the new file from then on.
3. A checkpoint ``k'`` names the new file (``"index_file"``, checkpoint version 3,
   which older code refuses rather than read the wrong file) and its length.
4. (a worker thread) the new file is renamed over ``index.log``, the directory
   fsynced; a checkpoint ``k''`` names ``index.log`` again (version 1).

:func:`resolve_index_file` (start-up) finishes or forgets an interrupted rewrite:
a checkpoint that names ``index.log`` makes a leftover new file garbage (removed);
one that names the new file has it renamed over ``index.log`` (step 4), unless that
was done already (the new file is gone, so ``index.log`` is it).  A crash at any
step thus leaves a checkpoint and the file it covers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..fileio import FileIO
from .index import INDEX_FILE, INDEX_RECORD, MemoryEntryIndex, load_index_records

INDEX_COMPACT_FILE = "index.log.compact"
"""The rewritten ``index.log`` until it is renamed over it."""
INDEX_LOG_DEAD_SHARE_MAX = 0.5
"""``index.log`` is rewritten once dead records are at least this share of it."""
READ_CHUNK_BYTES = 8 * 1024 * 1024 // INDEX_RECORD.size * INDEX_RECORD.size
"""``index.log`` is read this much at a time (whole records) by a compaction."""
WRITE_RECORDS = 65_536
"""Records written per write call of a compaction."""


def compaction_due(index_bytes: int, live_entries: int, bytes_min: int) -> bool:
    """Whether ``index.log`` of ``index_bytes`` (at least ``bytes_min``), indexing
    ``live_entries`` entries, is dead enough to rewrite (:data:`INDEX_LOG_DEAD_SHARE_MAX`)."""
    records = index_bytes // INDEX_RECORD.size
    if index_bytes < max(bytes_min, INDEX_RECORD.size) or not records:
        return False
    return (records - live_entries) / records >= INDEX_LOG_DEAD_SHARE_MAX


def write_compacted_index(io: FileIO, ledger_dir: Path, length: int, ledgers: set[int],
                          entry_log_id_max: int) -> int:
    """Step 1 (module docstring): :data:`INDEX_COMPACT_FILE` written from
    ``index.log[0, length)`` (the ledgers in ``ledgers`` only) and made durable, name
    included; returns its length.  BookieIOError if a record is corrupt; OSError."""
    index = MemoryEntryIndex()
    fd = io.open_read(ledger_dir / INDEX_FILE)
    try:
        for offset in range(0, length, READ_CHUNK_BYTES):
            data = io.pread(fd, min(READ_CHUNK_BYTES, length - offset), offset)
            load_index_records(index, data, entry_log_id_max)
            del data
    finally:
        io.close(fd)
    written = 0
    fd = io.create(ledger_dir / INDEX_COMPACT_FILE, exclusive=False)
    try:
        pack = INDEX_RECORD.pack
        pending: list[bytes] = []
        for ledger_id in sorted(set(index.ledger_ids()) & ledgers):
            for entry_id, (log_id, offset, size) in index.entries(ledger_id):
                pending.append(pack(ledger_id, entry_id, log_id, offset, size))
                if len(pending) >= WRITE_RECORDS:
                    io.write(fd, b"".join(pending))
                    written += len(pending)
                    pending = []
        if pending:
            io.write(fd, b"".join(pending))
            written += len(pending)
        io.fdatasync(fd)
    finally:
        io.close(fd)
    io.fsync_dir(ledger_dir)
    return written * INDEX_RECORD.size


def finish_rename(io: FileIO, ledger_dir: Path) -> None:
    """Step 4 (module docstring): the rewritten file renamed over ``index.log``,
    durably."""
    io.replace(ledger_dir / INDEX_COMPACT_FILE, ledger_dir / INDEX_FILE)
    io.fsync_dir(ledger_dir)


def resolve_index_file(io: FileIO, ledger_dir: Path, payload: dict[str, Any] | None) -> bool:
    """Start-up, before ``index.log`` is opened: finish or forget a rewrite the last
    run left (module docstring), so ``index.log`` is the file the checkpoint covers.
    Returns whether anything was done."""
    names = {name for name, _ in io.list_dir(ledger_dir)}
    if INDEX_COMPACT_FILE not in names:
        return False
    named = (payload or {}).get("index_file", INDEX_FILE)
    if named == INDEX_COMPACT_FILE:
        finish_rename(io, ledger_dir)
    else:
        io.unlink(ledger_dir / INDEX_COMPACT_FILE)
        io.fsync_dir(ledger_dir)
    return True
