"""Start-up recovery: what :meth:`LedgerStorage.open
<.ledger_storage.LedgerStorage.open>` does before the journal starts.

Read the checkpoint; finish or forget a rewrite of ``index.log`` it left
(:func:`.indexlog.resolve_index_file`); cut ``index.log`` and the current entry log
to the marked lengths and delete newer entry logs; load the index and the ledger state; replay
the journal from the mark up to the first bad record, cutting the torn tail.
Loading ``index.log`` honours its deletion markers (:mod:`.index`); the ledgers it
still has that the checkpoint does not know were deleted before the mark: they are
dropped before the replay, and the writer appends their deletion marker if the
replay or a later add re-creates one.

With the on-disk index (``index_backend = "lmdb"``) there is no ``index.log``: the
index is opened as it is (its last flush: the checkpoint's, or one of a start-up that
did not finish, ahead of the mark) behind a fresh write cache
(:class:`~.writecache.WriteCacheKV`, which every write of the recovery goes
through: the checkpoint that ends :meth:`~.ledger_storage.LedgerStorage.open`
flushes it, and so does a recovery that fills it), entries placed at or after the
mark are cut, and the replay re-puts the locations of the journal's adds after the
mark and re-applies its deletions, in order (idempotent).  A ledger dir written with the in-memory
index is *migrated*: its ``index.log`` prefix loaded into the emptied KV (markers
honoured, ledgers the checkpoint does not know dropped) and synced; the checkpoint
written at the end of open records the new format, and only then is ``index.log``
removed (:attr:`Recovered.remove_index_log`), so a crash at any step runs the
migration again.  A dir on the on-disk index opened with ``index_backend =
"memory"`` is refused (ConfigError).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config import BookieConfig
from ...errors import BookieIOError, ConfigError
from ..fileio import OS_FILE_IO, FileIO
from ..journal_files import list_journal_files, zeros_only
from ..journal_format import (
    TYPE_ADD,
    TYPE_DELETE_LEDGER,
    TYPE_EXPLICIT_LAC,
    TYPE_FENCE,
    TYPE_LEDGER_KEY,
    AddRecord,
    DeleteLedgerRecord,
    ExplicitLacRecord,
    FenceRecord,
    LedgerKeyRecord,
    Record,
    record_size_at,
    scan_records,
)
from .api import LedgerInfo
from .checkpoint import (
    CHECKPOINT_FILE,
    CheckpointMark,
    DurableLedger,
    DurableState,
    apply_op,
    read_checkpoint,
)
from .entrylog import ENTRYLOG_DIR, EntryLogWriter, entry_log_name, parse_entry_log_name
from .index import (
    INDEX_FILE,
    INDEX_RECORD,
    EntryIndex,
    MemoryEntryIndex,
    index_log_ops,
    load_index_records,
)
from .indexlog import resolve_index_file
from .kv import LMDB_DIR, IndexKV, open_lmdb
from .kvindex import IndexOp, KVEntryIndex
from .writecache import WriteCacheKV

KVOpener = Callable[[Path], IndexKV]
MIGRATE_BATCH_OPS = 65536

REPLAY_CHUNK_BYTES = 8 * 1024 * 1024


@dataclass
class Recovered:
    """What :func:`recover` hands :class:`~.ledger_storage.LedgerStorage`: the entry log
    writer and the durable ledger state (for the writer thread), the loop's ledgers and
    index, the journal's next file and the start-up statistics."""

    writer: EntryLogWriter
    durable: DurableState
    ledgers: dict[int, LedgerInfo]
    index: EntryIndex | KVEntryIndex
    next_seq: int
    stats: dict[str, Any] = field(default_factory=dict)
    kv_index: KVEntryIndex | None = None
    kv_cache: WriteCacheKV | None = None
    """The on-disk index's write cache (the KV under ``kv_index``)."""
    remove_index_log: bool = False
    """Migrated (or a leftover): remove index.log once a checkpoint is written."""


def _apply_index(index: EntryIndex | KVEntryIndex, ops: list[IndexOp]) -> None:
    """Index operations, in order: one KV transaction, or the in-memory index.  The
    on-disk index's write cache is flushed when past its bound (recovery writes much
    at once): an index ahead of the mark is what the next start cuts and replays."""
    if not ops:
        return
    if isinstance(index, KVEntryIndex):
        index.apply(ops)
        if isinstance(index.kv, WriteCacheKV) and index.kv.over_limit:
            index.kv.sync()
        return
    for op in ops:
        if op[0] == "put":
            index.put(op[1], op[2], op[3])
        else:
            index.delete_ledger(op[1])


def _open_at_length(io: FileIO, path: Path, length: int, what: str) -> int:
    """Open ``path`` for appending at ``length``, cutting anything after it."""
    fd = io.open_append(path)
    try:
        size = io.size(fd)
        if size < length:
            raise BookieIOError(f"{what} {path} has {size} bytes but the checkpoint covers {length}")
        if size > length:
            io.truncate(fd, length)
            io.fdatasync(fd)
    except BaseException:
        io.close(fd)
        raise
    return fd


def _replay_file(io: FileIO, path: Path, start: int, writer: EntryLogWriter,
                 durable: DurableState, index: EntryIndex | KVEntryIndex,
                 stats: dict[str, Any], now_ms: int) -> tuple[int, int]:
    """Replay one journal file from ``start``; returns (good end offset, file size)."""
    fd = io.open_read(path)
    try:
        size = io.size(fd)
        if size < start:
            raise BookieIOError(f"journal {path} has {size} bytes but the checkpoint covers {start}")
        pos = start  # file offset of the next read
        base = start  # file offset of buf[0]
        buf = b""
        eof = False
        while True:
            if not eof:
                want = record_size_at(buf, 0) or 0
                data = io.pread(fd, max(REPLAY_CHUNK_BYTES, want - len(buf)), pos)
                pos += len(data)
                if data:
                    buf = buf + data if buf else data
                else:
                    eof = True
            pairs, good = scan_records(buf)
            if pairs:
                view = memoryview(buf)
                raws: list[memoryview] = []
                items: list[tuple[int, int, Any]] = []
                ops: list[IndexOp] = []
                adds = 0
                due = writer.marks_due
                for i, (off, record) in enumerate(pairs):
                    if due and record.ledger_id in due \
                            and not isinstance(record, DeleteLedgerRecord):
                        writer.mark_if_due(record.ledger_id)  # a re-created ledger
                    if isinstance(record, AddRecord):
                        end = pairs[i + 1][0] if i + 1 < len(pairs) else good
                        raws.append(view[off:end])
                        items.append((TYPE_ADD, record.ledger_id, record.entry_id))
                        continue
                    if isinstance(record, DeleteLedgerRecord):  # in order with the adds
                        ops.extend(("put", *r) for r in writer.append(raws, items))
                        adds += len(items)
                        raws, items = [], []
                        ops.append(("del", record.ledger_id))
                        writer.ledger_deleted(record.ledger_id)
                    _apply_replayed(durable, record, now_ms)
                ops.extend(("put", *r) for r in writer.append(raws, items))
                _apply_index(index, ops)
                stats["records_replayed"] += len(pairs)
                stats["adds_replayed"] += adds + len(items)
                del raws, view, ops
                buf = buf[good:]
                base += good
            if eof:
                return base, size
            if buf:
                need = record_size_at(buf, 0)
                if need is None or need <= len(buf):
                    return base, size  # a whole record is there and it is bad: garbage
            # else: an incomplete record (or nothing) so far; read on
    finally:
        io.close(fd)


def _apply_replayed(durable: DurableState, record: Record, now_ms: int) -> None:
    """``now_ms``: the deletion time given to a replayed DELETE_LEDGER (the record
    carries none, so its tombstone counts from the restart: kept longer, never less)."""
    if isinstance(record, LedgerKeyRecord):
        apply_op(durable, TYPE_LEDGER_KEY, record.ledger_id, record.master_key)
    elif isinstance(record, FenceRecord):
        apply_op(durable, TYPE_FENCE, record.ledger_id, None)
    elif isinstance(record, ExplicitLacRecord):
        apply_op(durable, TYPE_EXPLICIT_LAC, record.ledger_id, record.lac)
    elif isinstance(record, DeleteLedgerRecord):
        apply_op(durable, TYPE_DELETE_LEDGER, record.ledger_id, now_ms)


def recover(journal_dir: Path, ledger_dir: Path, config: BookieConfig, log: Any,
            now_ms: int, io: FileIO = OS_FILE_IO, kv_open: KVOpener | None = None
            ) -> Recovered:
    """Everything :meth:`.LedgerStorage.open` does before the journal starts (a thread).
    ``now_ms``: the clock's wall time, for the tombstones of replayed deletions;
    ``kv_open``: opens the on-disk index (default LMDB) with ``index_backend = "lmdb"``."""
    t0 = time.perf_counter()  # performance timer: only reported (recovery_s)
    entrylog_dir = ledger_dir / ENTRYLOG_DIR
    for directory in (journal_dir, ledger_dir, entrylog_dir):
        io.makedirs(directory)
    io.unlink(ledger_dir / (CHECKPOINT_FILE + ".tmp"), missing_ok=True)

    payload = read_checkpoint(ledger_dir, io)
    durable = DurableState()
    if payload is None:
        mark = CheckpointMark()
    else:
        mark = CheckpointMark(
            journal_seq=payload["journal_seq"], journal_offset=payload["journal_offset"],
            entry_log_id=payload["entry_log_id"], entry_log_length=payload["entry_log_length"],
            index_length=payload["index_length"],
        )
        for ledger_id, deleted_ms in payload.get("tombstones", []):
            durable.tombstones[ledger_id] = deleted_ms
        for ledger_id, master_key, fenced, lac, explicit_lac in payload["ledgers"]:
            durable[ledger_id] = DurableLedger(master_key, fenced, explicit_lac, lac)

    on_disk = config.index_backend == "lmdb"
    kv_marked = payload is not None and payload.get("index") == "lmdb"
    if kv_marked and not on_disk:
        raise ConfigError(f"{ledger_dir} keeps its entry index in {LMDB_DIR}: set "
                          f'index_backend = "lmdb" (the memory index cannot read it)')
    migrate = on_disk and payload is not None and not kv_marked

    # Entry logs and index: keep exactly what the checkpoint covers.
    for name, _size in sorted(io.list_dir(entrylog_dir)):
        log_id = parse_entry_log_name(name)
        if log_id is not None and log_id > mark.entry_log_id:
            io.unlink(entrylog_dir / name)
    if resolve_index_file(io, ledger_dir, payload):  # a rewrite of index.log interrupted
        log.warning("index.log rewrite finished at start",
                    named=(payload or {}).get("index_file", INDEX_FILE))
    log_fd = _open_at_length(io, entrylog_dir / entry_log_name(mark.entry_log_id),
                             mark.entry_log_length, "entry log")
    index_log_left = on_disk and any(name == INDEX_FILE for name, _ in io.list_dir(ledger_dir))
    index_fd = -1
    data = b""
    try:
        if not on_disk or migrate:
            index_fd = _open_at_length(io, ledger_dir / INDEX_FILE, mark.index_length, "index")
    except BaseException:
        io.close(log_fd)
        raise
    try:
        if index_fd >= 0:
            if mark.index_length % INDEX_RECORD.size:
                raise BookieIOError(
                    f"index length {mark.index_length} is not a whole number of records")
            data = io.pread(index_fd, mark.index_length, 0) if mark.index_length else b""
            if len(data) != mark.index_length:
                raise BookieIOError("short read of the index")
        if on_disk and index_fd >= 0:
            io.close(index_fd)
            index_fd = -1
    except BaseException:
        io.close(log_fd)
        if index_fd >= 0:
            io.close(index_fd)
        raise
    writer = EntryLogWriter(io, entrylog_dir, config.entry_log_bytes_max, mark.entry_log_id,
                            log_fd, mark.entry_log_length, index_fd,
                            0 if on_disk else mark.index_length)
    kv: WriteCacheKV | None = None
    stats: dict[str, Any] = {"records_replayed": 0, "adds_replayed": 0, "bytes_cut": 0,
                             "bytes_preallocated": 0, "journal_files_removed": 0,
                             "journal_files_replayed": 0}
    try:
        io.fsync_dir(entrylog_dir)
        io.fsync_dir(ledger_dir)
        index: EntryIndex | KVEntryIndex
        if on_disk:
            kv = WriteCacheKV((kv_open or open_lmdb)(ledger_dir / LMDB_DIR),
                              config.index_write_cache_entries_max)
            index = KVEntryIndex(kv)
            if not kv_marked:  # migrating, or no checkpoint yet: rebuilt from scratch
                index.clear()
            else:  # what the commits after the mark placed: the replay re-puts it
                stats["index_entries_cut"] = index.truncate(mark.entry_log_id,
                                                            mark.entry_log_length)
            if migrate:
                ops: list[IndexOp] = []
                for op in index_log_ops(data, mark.entry_log_id):
                    ops.append(op)
                    if len(ops) >= MIGRATE_BATCH_OPS:
                        _apply_index(index, ops)
                        ops = []
                _apply_index(index, ops)
                kv.sync()
                stats["index_migrated_records"] = len(data) // INDEX_RECORD.size
                log.warning("index.log migrated to the on-disk index",
                            records=stats["index_migrated_records"])
        else:
            index = MemoryEntryIndex()
            load_index_records(index, data, mark.entry_log_id)  # streamed, no list
        del data
        stats["entries_indexed"] = len(index)  # as loaded
        if not on_disk or migrate:
            # Loaded from index.log: a ledger the checkpoint does not know was deleted
            # before it.  Its records are dropped now, before the replay (which may
            # re-create it), and it is due a deletion marker (the next records of
            # that id must not join the old ones at the next load).
            stale = [ledger_id for ledger_id in index.ledger_ids() if ledger_id not in durable]
            _apply_index(index, [("del", ledger_id) for ledger_id in stale])
            for ledger_id in stale:
                writer.ledger_deleted(ledger_id)
            stats["deleted_ledgers_dropped"] = len(stale)

        # Journal: replay from the mark, cut at the first bad record.
        files = list_journal_files(journal_dir, io)
        removed_any = False
        for seq, path in files:
            if seq < mark.journal_seq:
                io.unlink(path)
                removed_any = True
        files = [(seq, path) for seq, path in files if seq >= mark.journal_seq]
        if mark.journal_offset > 0 and (not files or files[0][0] != mark.journal_seq):
            raise BookieIOError(f"journal file {mark.journal_seq:016x} named by the checkpoint is missing")
        next_seq = max([mark.journal_seq] + [seq for seq, _ in files]) + 1
        cut = False
        prev_seq: int | None = None
        for seq, path in files:
            if not cut and prev_seq is not None and seq != prev_seq + 1:
                log.error("journal file missing: cutting the journal there",
                          missing_seq=prev_seq + 1, next_file=path.name)
                cut = True
            if cut:
                stats["bytes_cut"] += io.file_size(path)
                io.unlink(path)
                stats["journal_files_removed"] += 1
                removed_any = True
                continue
            start = mark.journal_offset if seq == mark.journal_seq else 0
            good, size = _replay_file(io, path, start, writer, durable, index, stats, now_ms)
            stats["journal_files_replayed"] += 1
            prev_seq = seq
            if good < size:
                cut = True
                # zeros alone after the last record of the last file: space the writer
                # allocated ahead of itself, not a torn write
                allocated = seq == files[-1][0] and zeros_only(io, path, good, size)
                stats["bytes_preallocated" if allocated else "bytes_cut"] += size - good
                fd = io.open_append(path)
                try:
                    io.truncate(fd, good)
                    io.fdatasync(fd)
                finally:
                    io.close(fd)
                if not allocated:
                    log.warning("journal torn tail cut", file=path.name, offset=good,
                                bytes_cut=size - good)
        if stats["journal_files_removed"]:
            log.error("journal files after a torn record removed",
                      files=stats["journal_files_removed"])
        if removed_any:
            io.fsync_dir(journal_dir)

        ledgers: dict[int, LedgerInfo] = {}
        deleted = [ledger_id for ledger_id in index.ledger_ids() if ledger_id not in durable]
        # garbage collected: its index records are stale
        _apply_index(index, [("del", ledger_id) for ledger_id in deleted])
        for ledger_id in deleted:
            writer.ledger_deleted(ledger_id)
        stats["deleted_ledgers_dropped"] = stats.get("deleted_ledgers_dropped", 0) + len(deleted)
        for ledger_id, d in durable.items():
            ledgers[ledger_id] = LedgerInfo(
                master_key=d.master_key, fenced=d.fenced, lac=max(d.lac, d.explicit_lac),
                last_entry_id=index.last_entry_id(ledger_id), explicit_lac=d.explicit_lac,
            )
    except BaseException:
        writer.close()
        if kv is not None:
            kv.close()
        raise
    stats["recovery_s"] = time.perf_counter() - t0
    kv_index = index if isinstance(index, KVEntryIndex) else None
    return Recovered(writer, durable, ledgers, index, next_seq, stats, kv_index, kv,
                      remove_index_log=migrate or index_log_left)
