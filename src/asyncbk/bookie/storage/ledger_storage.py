"""Ledger storage: journal + entry logs + index + checkpoints.

This is what the request processor calls.  The design follows Apache
BookKeeper's bookie: every mutation is first appended to the group-committed
journal (:mod:`.journal`) and acknowledged after the fsync that covers it;
the same records are then stored where reads can find them without scanning
the journal; periodic checkpoints make the older journal files redundant.

On disk
-------
``journal_dir/<seq:016x>.jnl``
    The journal (format in :mod:`.journal_format`).
``ledger_dir/entrylog/<id:08x>.log``
    Entry logs: the journal's ADD records, copied verbatim (length, xxh3
    checksum, type, ledger id, entry id, body), so every read is verified by
    the same checksum.  Appended by the journal's writer thread in the same
    batch as the journal write, *not* fsynced per batch (the journal already
    made the batch durable); a new log starts before a record would pass
    ``entry_log_bytes_max``.  Logs are fsynced off the writer thread: in the
    background every ``entry_log_flush_bytes`` and at checkpoints.
``ledger_dir/index.log``
    Append-only, fixed 32-byte records ``<qqIQI``: ledger id, entry id, entry
    log id, record offset, record length; written in the same batch.  Loaded
    into memory at start.  No checksum: only the prefix recorded in the
    checkpoint (which was fsynced before the checkpoint was written) is ever
    trusted; anything after it is cut and rebuilt from the journal.
``ledger_dir/checkpoint``
    8-byte xxh3_64 of the rest, then a msgpack map: the *mark* (journal seq
    and offset after the last batch covered, entry log id and length, index
    length), every ledger's state (master key, fenced, LAC, explicit LAC) and
    the tombstones of deleted ledgers.  ``version`` is
    :data:`CHECKPOINT_VERSION`; another version stops the bookie.  Replaced
    atomically (tmp file, fsync, rename, fsync dir).

Checkpoint (every ``checkpoint_interval_s``, at start, after a compaction and
on close): its first step runs on the journal's writer thread, so it is
ordered after every batch written so far: note the journal position and the
entry log and index lengths, and snapshot the ledger state those batches
produced (the writer thread keeps its own copy of keys, fence flags and
explicit LACs, updated per batch, so the snapshot is exactly the state of the
journal prefix it covers).  Then, on another thread while adds go on: fsync
the entry logs and index.log, write the checkpoint, delete the journal files
wholly before the mark.

Recovery (:meth:`LedgerStorage.open`): read the checkpoint; truncate
index.log and the current entry log to the marked lengths and delete newer
entry logs (anything after the mark may be torn and is rebuilt); load
index.log and the ledger state; replay the journal from the mark (ADD
records re-appended to the entry log and index, keys / fences / explicit
LACs re-applied) up to the first bad record, cutting the torn tail (file
truncated, later journal files removed); start the journal on a fresh file
and take a checkpoint.  Every step is idempotent, so a crash during recovery
is recovered by the next start.

Deletion and compaction (driven by :mod:`.gc`): :meth:`LedgerStorage.delete_ledger`
forgets a ledger at once (unreadable, its index dropped) and journals a
DELETE_LEDGER record, so replay and later checkpoints forget it too; the
ledger leaves a *tombstone* (its deletion time, in epoch ms from the storage's
clock, kept in checkpoints) for ``gc_tombstone_s``, during which adds to it
are refused as if it were fenced.  :meth:`LedgerStorage.compact_entry_logs`
copies the still-indexed records of finished entry logs verbatim into the
current log (through the journal's writer thread, paced by
``compaction_rate_bytes_per_s``), takes a checkpoint so the copies are
durable, and then deletes the old logs.

What survives a crash: every acknowledged add, fence, explicit LAC and
deletion, and possibly some unacknowledged ones (a prefix of the journal).
The piggybacked LAC (:meth:`LedgerStorage.update_lac`) is persisted only at
checkpoints: after a crash it may be older, which only delays readers.

Time (tombstone ages, the housekeeping and compaction sleeps, compaction
pacing) comes from the injected :class:`~asyncbk.clock.Clock`.

Limits (deliberate, for now): the index is in memory (:class:`LedgerIndex`,
about 12 bytes per stored entry) and start-up reads all of index.log;
index.log is append-only: compaction does not rewrite it, so records of
moved and deleted entries stay in it and are superseded (a later record for
the same entry wins) or dropped (the ledger is gone) when it is loaded.
"""

from __future__ import annotations

import asyncio
import os
import struct
import threading
import time
from array import array
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from ...clock import SYSTEM_CLOCK, Clock, RateLimiter
from ...config import BookieConfig
from ...errors import BadRequestError, BookieIOError, NoSuchEntryError, NoSuchLedgerError
from ...log import get_logger
from ...types import LAST_ENTRY_ID
from .. import journal as _journal
from ..journal import Journal, fsync_dir, list_journal_files, write_all
from ..journal_format import (
    ADD_RECORD_OVERHEAD_BYTES,
    HEADER_BYTES,
    RECORD_BYTES_MAX,
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
    decode_one,
    encode_add,
    encode_delete_ledger,
    encode_explicit_lac,
    encode_fence,
    encode_ledger_key,
    record_size_at,
    scan_records,
)

ENTRYLOG_DIR = "entrylog"
INDEX_FILE = "index.log"
CHECKPOINT_FILE = "checkpoint"
CHECKPOINT_VERSION = 1
READ_THREADS = 4
"""Threads serving ``os.pread`` for reads (and start-up recovery)."""
REPLAY_CHUNK_BYTES = 8 * 1024 * 1024
DISK_USAGE_REFRESH_S = 1.0

INDEX_RECORD = struct.Struct("<qqIQI")  # ledger id, entry id, log id, record offset, record length
_CHECKSUM = struct.Struct("<Q")

Location = tuple[int, int, int]
"""Where an entry's record is: (entry log id, record offset, record length)."""

RECORD_SPAN_MAX = HEADER_BYTES - 1 + RECORD_BYTES_MAX
"""The most bytes one record takes in an entry log (header and checksummed part)."""

INDEX_GAP_MAX = 4096
"""An entry this far past a ledger's dense range goes to its sparse map instead."""


class LedgerIndex:
    """Where each stored entry of one ledger is.

    Entries are mostly added in id order, so locations live in two arrays indexed
    by entry id: ``(log id << 32) | offset`` and the record length (0: not stored).
    That is 12 bytes an entry, and nothing the garbage collector has to walk,
    where a dict of tuples cost about 200 bytes and made every full collection
    slower as the bookie filled.  An entry far beyond the dense range (an
    unusual pattern) goes to a small dict.
    """

    __slots__ = ("_lengths", "_positions", "_sparse", "count", "last")

    def __init__(self) -> None:
        self._positions = array("Q")
        self._lengths = array("I")
        self._sparse: dict[int, Location] = {}
        self.count = 0
        self.last = -1

    def get(self, entry_id: int) -> Location | None:
        if 0 <= entry_id < len(self._lengths):
            n = self._lengths[entry_id]
            if n:
                pos = self._positions[entry_id]
                return pos >> 32, pos & 0xFFFFFFFF, n
            return None
        return self._sparse.get(entry_id)

    def __contains__(self, entry_id: int) -> bool:
        return self.get(entry_id) is not None

    def __len__(self) -> int:
        return self.count

    def locations(self) -> Iterator[Location]:
        """Every stored entry's location (any order)."""
        positions, lengths = self._positions, self._lengths
        for i, n in enumerate(lengths):
            if n:
                pos = positions[i]
                yield pos >> 32, pos & 0xFFFFFFFF, n
        yield from self._sparse.values()

    def put(self, entry_id: int, loc: Location) -> Location | None:
        """Store ``loc`` for ``entry_id``; returns the location it replaces, if any."""
        old = self.get(entry_id)
        self._put(entry_id, loc)
        return old

    def _put(self, entry_id: int, loc: Location) -> None:
        if entry_id > len(self._lengths) + INDEX_GAP_MAX:
            if entry_id not in self._sparse:
                self.count += 1
            self._sparse[entry_id] = loc
        else:
            grew = entry_id >= len(self._lengths)
            self._put_dense(entry_id, loc)
            if grew and self._sparse:
                self._absorb_sparse()
        if entry_id > self.last:
            self.last = entry_id

    def _put_dense(self, entry_id: int, loc: Location) -> None:
        log_id, offset, length = loc
        dense = len(self._lengths)
        if entry_id >= dense:
            gap = entry_id - dense
            if gap:
                self._positions.extend(array("Q", bytes(8 * gap)))
                self._lengths.extend(array("I", bytes(4 * gap)))
            self._positions.append((log_id << 32) | offset)
            self._lengths.append(length)
            self.count += 1
        else:
            if not self._lengths[entry_id]:
                self.count += 1
            self._positions[entry_id] = (log_id << 32) | offset
            self._lengths[entry_id] = length

    def _absorb_sparse(self) -> None:
        """Move the sparse entries the dense range now reaches into the arrays (in
        rounds, without recursion: each round may extend the range further)."""
        sparse = self._sparse
        while sparse:
            limit = len(self._lengths) + INDEX_GAP_MAX
            reached = sorted(e for e in sparse if e <= limit)
            if not reached:
                return
            for entry_id in reached:
                loc = sparse.pop(entry_id)
                self.count -= 1
                self._put_dense(entry_id, loc)


@dataclass(slots=True)
class LedgerInfo:
    """A ledger's state on this bookie (live view: do not mutate)."""

    master_key: bytes
    fenced: bool = False
    lac: int = -1
    """Highest LAC seen (piggybacked on adds or explicit)."""
    last_entry_id: int = -1
    """Highest entry id stored (and readable)."""
    explicit_lac: int = -1
    """Highest LAC written with :meth:`LedgerStorage.write_explicit_lac`."""


@dataclass(slots=True)
class _DurableLedger:
    """A ledger's journaled state, as of the last batch written (writer thread only)."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    lac: int = -1  # merged in from the loop at checkpoints


@dataclass
class _CheckpointWork:
    key: tuple[Any, ...]
    payload: dict[str, Any]
    fds: list[int]


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    journal_seq: int = 0
    journal_offset: int = 0
    entry_log_id: int = 0
    entry_log_length: int = 0
    index_length: int = 0


def entry_log_name(log_id: int) -> str:
    return f"{log_id:08x}.log"


def _parse_entry_log_name(name: str) -> int | None:
    """The id of an entry log file name (``entry_log_name``'s inverse), else None."""
    if len(name) != 12 or not name.endswith(".log"):
        return None
    digits = name[:8]
    if any(c not in "0123456789abcdef" for c in digits):
        return None
    return int(digits, 16)


class _DurableState(dict[int, _DurableLedger]):
    """The journaled state of every ledger (writer thread only), and the tombstones
    of deleted ones: ``{ledger id: deletion time (epoch ms)}``.  A tombstone makes
    the bookie refuse a deleted ledger's adds (a zombie writer's), as its fence did;
    it is kept for ``gc_tombstone_s``."""

    def __init__(self) -> None:
        super().__init__()
        self.tombstones: dict[int, int] = {}


def _apply_op(durable: _DurableState, kind: int, ledger_id: int, value: Any) -> None:
    """Apply a non-ADD journal operation to the durable ledger state.  ``value``: the
    master key (LEDGER_KEY), the LAC (EXPLICIT_LAC), the deletion time in epoch ms
    from the storage's clock (DELETE_LEDGER), else None."""
    if kind == TYPE_LEDGER_KEY:
        if ledger_id not in durable:
            durable[ledger_id] = _DurableLedger(bytes(value))
        durable.tombstones.pop(ledger_id, None)
        return
    if kind == TYPE_DELETE_LEDGER:
        durable.pop(ledger_id, None)
        durable.tombstones[ledger_id] = int(value)
        return
    d = durable.get(ledger_id)
    if d is None:  # cannot happen (LEDGER_KEY is journaled first); keep the op anyway
        d = durable[ledger_id] = _DurableLedger(b"")
    if kind == TYPE_FENCE:
        d.fenced = True
    elif kind == TYPE_EXPLICIT_LAC and value > d.explicit_lac:
        d.explicit_lac = value


# --- checkpoint file ----------------------------------------------------------


def read_checkpoint(ledger_dir: Path) -> dict[str, Any] | None:
    """The checkpoint payload, None if there is none; BookieIOError if corrupt."""
    path = Path(ledger_dir) / CHECKPOINT_FILE
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(blob) < _CHECKSUM.size:
        raise BookieIOError(f"{path}: truncated checkpoint")
    (checksum,) = _CHECKSUM.unpack_from(blob)
    data = blob[_CHECKSUM.size:]
    if xxhash.xxh3_64_intdigest(data) != checksum:
        raise BookieIOError(f"{path}: checkpoint checksum mismatch")
    try:
        payload = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several types
        raise BookieIOError(f"{path}: checkpoint is not msgpack ({type(exc).__name__})") from None
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION:
        raise BookieIOError(f"{path}: unsupported checkpoint")
    if not _checkpoint_well_formed(payload):
        raise BookieIOError(f"{path}: malformed checkpoint")
    return payload


def _checkpoint_well_formed(payload: dict[str, Any]) -> bool:
    """The fields :func:`_recover` uses, with their types and ranges."""
    def uint(v: Any, top: int = 2**63 - 1) -> bool:
        return type(v) is int and 0 <= v <= top

    ledgers, tombstones = payload.get("ledgers"), payload.get("tombstones", [])
    return (all(uint(payload.get(k)) for k in ("journal_seq", "journal_offset",
                                               "entry_log_length", "index_length"))
            and uint(payload.get("entry_log_id"), 0xFFFFFFFF)
            and type(ledgers) is list and all(
                type(x) is list and len(x) == 5 and uint(x[0]) and type(x[1]) is bytes
                and type(x[2]) is bool and type(x[3]) is int and type(x[4]) is int
                for x in ledgers)
            and type(tombstones) is list and all(
                type(x) is list and len(x) == 2 and uint(x[0]) and type(x[1]) is int
                for x in tombstones))


def _write_checkpoint(ledger_dir: Path, payload: dict[str, Any]) -> None:
    data = msgpack.packb(payload, use_bin_type=True)
    blob = _CHECKSUM.pack(xxhash.xxh3_64_intdigest(data)) + data
    tmp = ledger_dir / (CHECKPOINT_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, blob)
        _journal.fdatasync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, ledger_dir / CHECKPOINT_FILE)
    fsync_dir(ledger_dir)


# --- entry logs -----------------------------------------------------------------


class _EntryLogWriter:
    """Appends ADD records to entry logs and index.log.  Used by one thread at a
    time: the recovery thread during open, then the journal's writer thread."""

    def __init__(self, directory: Path, bytes_max: int, log_id: int, fd: int, length: int,
                 index_fd: int, index_length: int) -> None:
        self.directory = directory
        self.bytes_max = bytes_max
        self.log_id = log_id
        self.length = length
        self.index_length = index_length
        self._fd = fd
        self._index_fd = index_fd
        self._unsynced: list[int] = []

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

    def _write(self, pieces: list[bytes | memoryview], index: list[bytes], end: int) -> None:
        if not pieces:
            return
        write_all(self._fd, pieces[0] if len(pieces) == 1 else b"".join(pieces))
        self.length = end
        write_all(self._index_fd, b"".join(index))
        self.index_length += INDEX_RECORD.size * len(index)

    def _rotate(self) -> None:
        # The finished log is made durable by the next checkpoint (the only thing that
        # relies on entry logs being durable), not here: an fsync on this thread would
        # stall every group commit behind it.
        self._unsynced.append(self._fd)
        self._fd = -1
        new_id = self.log_id + 1
        path = self.directory / entry_log_name(new_id)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        self.log_id, self.length = new_id, 0

    def take_for_sync(self) -> list[int]:
        """File descriptors a checkpoint must fdatasync before its mark is written:
        the logs finished since the last checkpoint (handed over) and duplicates of
        the current log and index (the caller closes them all)."""
        fds, self._unsynced = self._unsynced, []
        fds.append(os.dup(self._fd))
        fds.append(os.dup(self._index_fd))
        return fds

    def close(self) -> None:
        fds, self._unsynced = self._unsynced, []
        for fd in fds:
            os.close(fd)
        for name in ("_fd", "_index_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                setattr(self, name, -1)
                os.close(fd)


class _EntryLogReader:
    """``os.pread`` of entry records on the read pool; one read-only fd per log, kept open."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}
        self._retired: list[int] = []
        self._lock = threading.Lock()
        self._closed = False

    def _fd(self, log_id: int) -> int:
        with self._lock:
            if self._closed:
                raise BookieIOError("storage is closed")
            fd = self._fds.get(log_id)
            if fd is None:
                fd = os.open(self.directory / entry_log_name(log_id), os.O_RDONLY)
                self._fds[log_id] = fd
            return fd

    def read(self, loc: Location, ledger_id: int, entry_id: int) -> bytes:
        log_id, offset, length = loc
        if not HEADER_BYTES < length <= RECORD_SPAN_MAX or not 0 <= offset <= 0xFFFFFFFF:
            raise BookieIOError(f"entry {ledger_id}/{entry_id}: bad location {loc}")
        try:
            data = os.pread(self._fd(log_id), length, offset)
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
        unlinked file stays readable through an open descriptor)."""
        with self._lock:
            fd = self._fds.pop(log_id, None)
            old, self._retired = self._retired, [fd] if fd is not None else []
        for each in old:
            os.close(each)

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
                data = os.pread(self._fd(log_id), end - offset, offset)
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
            os.close(fd)


# --- recovery -------------------------------------------------------------------


@dataclass
class _Recovered:
    writer: _EntryLogWriter
    durable: _DurableState
    ledgers: dict[int, LedgerInfo]
    index: dict[int, LedgerIndex]
    next_seq: int
    stats: dict[str, Any] = field(default_factory=dict)


def _open_at_length(path: Path, length: int, what: str) -> int:
    """Open ``path`` for appending at ``length``, cutting anything after it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size < length:
            raise BookieIOError(f"{what} {path} has {size} bytes but the checkpoint covers {length}")
        if size > length:
            os.ftruncate(fd, length)
            _journal.fdatasync(fd)
        os.lseek(fd, length, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _replay_file(path: Path, start: int, writer: _EntryLogWriter,
                 durable: _DurableState, index: dict[int, LedgerIndex],
                 stats: dict[str, Any], now_ms: int) -> tuple[int, int]:
    """Replay one journal file from ``start``; returns (good end offset, file size)."""
    with path.open("rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size < start:
            raise BookieIOError(f"journal {path} has {size} bytes but the checkpoint covers {start}")
        fh.seek(start)
        base = start  # file offset of buf[0]
        buf = b""
        eof = False
        while True:
            if not eof:
                want = record_size_at(buf, 0) or 0
                data = fh.read(max(REPLAY_CHUNK_BYTES, want - len(buf)))
                if data:
                    buf = buf + data if buf else data
                else:
                    eof = True
            pairs, good = scan_records(buf)
            if pairs:
                view = memoryview(buf)
                raws: list[memoryview] = []
                items: list[tuple[int, int, Any]] = []
                for i, (off, record) in enumerate(pairs):
                    if isinstance(record, AddRecord):
                        end = pairs[i + 1][0] if i + 1 < len(pairs) else good
                        raws.append(view[off:end])
                        items.append((TYPE_ADD, record.ledger_id, record.entry_id))
                    else:
                        _apply_replayed(durable, record, now_ms)
                for ledger_id, entry_id, loc in writer.append(raws, items):
                    entries = index.get(ledger_id)
                    if entries is None:
                        entries = index[ledger_id] = LedgerIndex()
                    entries.put(entry_id, loc)
                stats["records_replayed"] += len(pairs)
                stats["adds_replayed"] += len(items)
                del raws, view
                buf = buf[good:]
                base += good
            if eof:
                return base, size
            if buf:
                need = record_size_at(buf, 0)
                if need is None or need <= len(buf):
                    return base, size  # a whole record is there and it is bad: garbage
            # else: an incomplete record (or nothing) so far; read on


def _apply_replayed(durable: _DurableState, record: Record, now_ms: int) -> None:
    """``now_ms``: the deletion time given to a replayed DELETE_LEDGER (the record
    carries none, so its tombstone counts from the restart: kept longer, never less)."""
    if isinstance(record, LedgerKeyRecord):
        _apply_op(durable, TYPE_LEDGER_KEY, record.ledger_id, record.master_key)
    elif isinstance(record, FenceRecord):
        _apply_op(durable, TYPE_FENCE, record.ledger_id, None)
    elif isinstance(record, ExplicitLacRecord):
        _apply_op(durable, TYPE_EXPLICIT_LAC, record.ledger_id, record.lac)
    elif isinstance(record, DeleteLedgerRecord):
        _apply_op(durable, TYPE_DELETE_LEDGER, record.ledger_id, now_ms)


def _recover(journal_dir: Path, ledger_dir: Path, config: BookieConfig, log: Any,
             now_ms: int) -> _Recovered:
    """Everything :meth:`LedgerStorage.open` does before the journal starts (a thread).
    ``now_ms``: the clock's wall time, for the tombstones of replayed deletions."""
    t0 = time.perf_counter()  # performance timer: only reported (recovery_s)
    entrylog_dir = ledger_dir / ENTRYLOG_DIR
    for directory in (journal_dir, ledger_dir, entrylog_dir):
        directory.mkdir(parents=True, exist_ok=True)
    (ledger_dir / (CHECKPOINT_FILE + ".tmp")).unlink(missing_ok=True)

    payload = read_checkpoint(ledger_dir)
    durable = _DurableState()
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
            durable[ledger_id] = _DurableLedger(master_key, fenced, explicit_lac, lac)

    # Entry logs and index: keep exactly what the checkpoint covers.
    for entry in os.scandir(entrylog_dir):
        log_id = _parse_entry_log_name(entry.name)
        if log_id is not None and log_id > mark.entry_log_id:
            os.unlink(entry.path)
    log_fd = _open_at_length(entrylog_dir / entry_log_name(mark.entry_log_id),
                             mark.entry_log_length, "entry log")
    try:
        index_fd = _open_at_length(ledger_dir / INDEX_FILE, mark.index_length, "index")
    except BaseException:
        os.close(log_fd)
        raise
    writer = _EntryLogWriter(entrylog_dir, config.entry_log_bytes_max, mark.entry_log_id,
                             log_fd, mark.entry_log_length, index_fd, mark.index_length)
    try:
        fsync_dir(entrylog_dir)
        fsync_dir(ledger_dir)
        if mark.index_length % INDEX_RECORD.size:
            raise BookieIOError(f"index length {mark.index_length} is not a whole number of records")
        index: dict[int, LedgerIndex] = {}
        data = os.pread(index_fd, mark.index_length, 0) if mark.index_length else b""
        if len(data) != mark.index_length:
            raise BookieIOError("short read of the index")
        for i, (ledger_id, entry_id, log_id, offset, length) in enumerate(
                INDEX_RECORD.iter_unpack(data)):
            if (ledger_id < 0 or entry_id < 0 or log_id > mark.entry_log_id
                    or offset > 0xFFFFFFFF or not HEADER_BYTES < length <= RECORD_SPAN_MAX):
                raise BookieIOError(f"index.log record {i} is corrupt: ledger {ledger_id} entry "
                                    f"{entry_id} log {log_id} offset {offset} length {length}")
            entries = index.get(ledger_id)
            if entries is None:
                entries = index[ledger_id] = LedgerIndex()
            entries.put(entry_id, (log_id, offset, length))
        del data
        indexed = sum(len(e) for e in index.values())

        # Journal: replay from the mark, cut at the first bad record.
        stats: dict[str, Any] = {"records_replayed": 0, "adds_replayed": 0, "bytes_cut": 0,
                                 "journal_files_removed": 0, "journal_files_replayed": 0,
                                 "entries_indexed": indexed}
        files = list_journal_files(journal_dir)
        removed_any = False
        for seq, path in files:
            if seq < mark.journal_seq:
                path.unlink()
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
                stats["bytes_cut"] += path.stat().st_size
                path.unlink()
                stats["journal_files_removed"] += 1
                removed_any = True
                continue
            start = mark.journal_offset if seq == mark.journal_seq else 0
            good, size = _replay_file(path, start, writer, durable, index, stats, now_ms)
            stats["journal_files_replayed"] += 1
            prev_seq = seq
            if good < size:
                cut = True
                stats["bytes_cut"] += size - good
                with path.open("r+b", buffering=0) as fh:
                    os.ftruncate(fh.fileno(), good)
                    _journal.fdatasync(fh.fileno())
                log.warning("journal torn tail cut", file=path.name, offset=good,
                            bytes_cut=size - good)
        if stats["journal_files_removed"]:
            log.error("journal files after a torn record removed",
                      files=stats["journal_files_removed"])
        if removed_any:
            fsync_dir(journal_dir)

        ledgers: dict[int, LedgerInfo] = {}
        deleted = [ledger_id for ledger_id in index if ledger_id not in durable]
        for ledger_id in deleted:  # garbage collected: its index records are stale
            del index[ledger_id]
        stats["deleted_ledgers_dropped"] = len(deleted)
        for ledger_id, d in durable.items():
            entries = index.setdefault(ledger_id, LedgerIndex())
            ledgers[ledger_id] = LedgerInfo(
                master_key=d.master_key, fenced=d.fenced, lac=max(d.lac, d.explicit_lac),
                last_entry_id=entries.last, explicit_lac=d.explicit_lac,
            )
    except BaseException:
        writer.close()
        raise
    stats["recovery_s"] = time.perf_counter() - t0
    return _Recovered(writer, durable, ledgers, index, next_seq, stats)


COMPACTION_CHUNK_BYTES = 4 * 1024 * 1024
COMPACTION_READ_GRACE_S = 0.5
"""After moving a log's entries, how long reads that already looked up the old place get."""


def _entry_log_sizes(directory: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in os.scandir(directory):
        log_id = _parse_entry_log_name(entry.name)
        if log_id is not None:
            out[log_id] = entry.stat().st_size
    return out


def _pread_path(path: Path, length: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.pread(fd, length, offset)
    finally:
        os.close(fd)
    # a record longer than the chunk: read exactly as much as it needs
    need = record_size_at(data, 0)
    if need is not None and need > len(data):
        return _pread_path(path, need, offset)
    return data


def _unlink_quietly(path: Path) -> None:
    path.unlink(missing_ok=True)
    fsync_dir(path.parent)


def _sync_and_close(fds: list[int]) -> None:
    try:
        for fd in fds:
            _journal.fdatasync(fd)
    finally:
        for fd in fds:
            os.close(fd)


def _wall_ms(clock: Clock) -> int:
    """The clock's wall time in epoch milliseconds (tombstones are dated with it)."""
    return int(clock.wall_s() * 1000)


def _statvfs(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


# --- the storage ------------------------------------------------------------------


class LedgerStorage:
    """Durable entry storage of one bookie.  Create with :meth:`open`.

    Loop-side state (``_ledgers``, ``_index``) is touched only on the event
    loop; the entry log writer and the durable ledger state only on the
    journal's writer thread; reads use a small pool of threads doing
    ``os.pread``.
    """

    def __init__(self, journal_dir: Path, ledger_dir: Path, config: BookieConfig,
                 recovered: _Recovered, read_pool: ThreadPoolExecutor, log: Any,
                 clock: Clock) -> None:
        self._journal_dir = journal_dir
        self._ledger_dir = ledger_dir
        self._config = config
        self._log = log
        self._clock = clock
        self._read_pool = read_pool
        self._writer = recovered.writer
        self._durable = recovered.durable
        self._tombstones = dict(recovered.durable.tombstones)
        """Loop-side copy of the deleted ledgers' tombstones (see _DurableState)."""
        self._ledgers = recovered.ledgers
        self._index = recovered.index
        self._reader = _EntryLogReader(ledger_dir / ENTRYLOG_DIR)
        self._recovery_stats = recovered.stats
        self._journal = Journal(journal_dir, config, first_seq=recovered.next_seq, sink=self,
                                log=log.bind(component="journal"))
        self._closed = False
        self._close_task: asyncio.Task[None] | None = None
        self._housekeeping_task: asyncio.Task[None] | None = None
        self._checkpoint_lock = asyncio.Lock()
        self._flush_task: asyncio.Task[None] | None = None
        self._unflushed_bytes = 0
        self._entry_log_flushes = 0
        self._disk_usage = (0, 0)
        # writer-thread only: what the last checkpoint written covered
        self._last_checkpoint_key: tuple[Any, ...] | None = None
        # statistics
        self._adds = 0
        self._reads = 0
        self._fences = 0
        self._checkpoints = 0
        self._ledgers_deleted = 0
        self._compactions = 0
        self._compacted_bytes = 0
        self._compaction_moved_bytes = 0
        self._log_live: dict[int, int] = {}
        """Live (indexed) bytes of each entry log, kept as entries come and go."""
        for entries in self._index.values():
            for log_id, _, length in entries.locations():
                self._log_live[log_id] = self._log_live.get(log_id, 0) + length
        self._checkpoints_skipped = 0
        self._checkpoint_s_last = 0.0
        self._checkpoint_s_max = 0.0
        self._journal_files_deleted = 0

    @classmethod
    async def open(cls, journal_dir: Path, ledger_dir: Path, config: BookieConfig, *,
                   log: Any = None, clock: Clock | None = None) -> LedgerStorage:
        """Create sub-dirs if needed, load the last checkpoint, replay the journal
        after it (cutting a torn/garbage tail), then start the journal writer.
        Blocking file work runs off the loop."""
        journal_dir, ledger_dir = Path(journal_dir), Path(ledger_dir)
        log = log if log is not None else get_logger(component="storage")
        clock = clock if clock is not None else SYSTEM_CLOCK
        loop = asyncio.get_running_loop()
        read_pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="asyncbk-read")
        try:
            recovered = await loop.run_in_executor(
                read_pool, _recover, journal_dir, ledger_dir, config, log, _wall_ms(clock))
        except BaseException:
            # On cancellation the recovery thread may still be running: do not wait for it.
            read_pool.shutdown(wait=False)
            raise
        self = cls(journal_dir, ledger_dir, config, recovered, read_pool, log, clock)
        try:
            await self._journal.start()
            await self.checkpoint()
            self._disk_usage = await loop.run_in_executor(read_pool, _statvfs, ledger_dir)
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
        if _wall_ms(self._clock) - deleted_ms >= self._config.gc_tombstone_s * 1000:
            del self._tombstones[ledger_id]
            return False
        return True

    def ledger_ids(self) -> list[int]:
        return list(self._ledgers)

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
        self._index[ledger_id] = LedgerIndex()
        self._journal.append_unacked(encode_ledger_key(ledger_id, key),
                                     (TYPE_LEDGER_KEY, ledger_id, key))
        return info

    def add_entry(self, ledger_id: int, entry_id: int, master_key: bytes,
                  body: bytes) -> asyncio.Future[None]:
        """Not a coroutine.  Registers the ledger (with ``master_key``) if new and
        queues a journal record; the future resolves once the record is fsynced
        AND the entry is readable via :meth:`read_entry`.

        The master key of a known ledger is not checked here (the processor
        does that).  Re-adding an existing entry overwrites it.  Raises
        TooManyRequestsError if the journal queue is full, BookieIOError if
        the journal failed or the storage is closed.
        """
        self._check_open()
        if ledger_id < 0 or entry_id < 0:
            raise BadRequestError(f"bad entry id {ledger_id}/{entry_id}")
        record = encode_add(ledger_id, entry_id, body)
        journal = self._journal
        if ledger_id not in self._ledgers:
            journal.ensure_room(2)
            self._register(ledger_id, master_key)
        fut = journal.append(record, (TYPE_ADD, ledger_id, entry_id))
        self._adds += 1
        return fut

    def fence(self, ledger_id: int, master_key: bytes) -> asyncio.Future[None]:
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

    def write_explicit_lac(self, ledger_id: int, lac: int) -> asyncio.Future[None]:
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
        entries = self._index.get(ledger_id)
        loc = entries.get(entry_id) if entries is not None else None
        if loc is None:
            raise NoSuchEntryError(f"entry {ledger_id}/{entry_id} is not stored here")
        self._reads += 1
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, self._reader.read, loc,
                                          ledger_id, entry_id)

    async def read_entries(self, ledger_id: int, first: int, count_max: int,
                           bytes_max: int) -> list[bytes]:
        """The bodies of the run of stored entries from ``first``: at most
        ``count_max``, and no more once their sizes pass ``bytes_max`` (the first
        is always returned).  Errors as :meth:`read_entry`."""
        self._check_open()
        if ledger_id not in self._ledgers:
            raise NoSuchLedgerError(f"ledger {ledger_id} is not stored here")
        entries = self._index.get(ledger_id) or LedgerIndex()
        locs: list[Location] = []
        size = 0
        for entry_id in range(first, first + count_max):
            loc = entries.get(entry_id)
            if loc is None:
                break
            size += loc[2] - ADD_RECORD_OVERHEAD_BYTES
            if locs and size > bytes_max:
                break
            locs.append(loc)
        if not locs:
            raise NoSuchEntryError(f"entry {ledger_id}/{first} is not stored here")
        self._reads += len(locs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._read_pool, self._reader.read_run, locs,
                                          ledger_id, first)

    # --- journal sink (see journal.BatchSink) ---------------------------------

    def apply_in_writer(self, records: list[bytes], items: list[Any]
                        ) -> list[tuple[int, int, Location]]:
        """Writer thread, after the batch's fsync: copy ADD records to the entry
        log + index, apply the other records to the durable ledger state."""
        add_records: list[bytes] = []
        add_items: list[tuple[int, int, Any]] = []
        durable = self._durable
        for record, item in zip(records, items, strict=True):
            if item[0] == TYPE_ADD:
                add_records.append(record)
                add_items.append(item)
            else:
                _apply_op(durable, item[0], item[1], item[2])
        if not add_records:
            return []
        return self._writer.append(add_records, add_items)

    def apply_on_loop(self, items: list[Any], result: list[tuple[int, int, Location]]) -> None:
        """Loop, before the batch's futures resolve: make the new entries readable."""
        index = self._index
        ledgers = self._ledgers
        live = self._log_live
        written = 0
        for ledger_id, entry_id, loc in result:
            written += loc[2]
            info = ledgers.get(ledger_id)
            if info is None:
                continue  # deleted while its add was being written: the copy is garbage
            entries = index.get(ledger_id)
            if entries is None:
                entries = index[ledger_id] = LedgerIndex()
            old = entries.put(entry_id, loc)
            live[loc[0]] = live.get(loc[0], 0) + loc[2]
            if old is not None:
                live[old[0]] -= old[2]
            if entry_id > info.last_entry_id:
                info.last_entry_id = entry_id
        flush_bytes = self._config.entry_log_flush_bytes
        if flush_bytes and written:
            self._unflushed_bytes += written
            if self._unflushed_bytes >= flush_bytes and self._flush_task is None \
                    and not self._closed:
                self._unflushed_bytes = 0
                self._flush_task = asyncio.get_running_loop().create_task(
                    self._flush_entry_logs(), name="asyncbk-entrylog-flush")

    # --- deletion and compaction ----------------------------------------------

    def delete_ledger(self, ledger_id: int) -> asyncio.Future[None]:
        """Forget a ledger (garbage collection): unreadable at once, its deletion
        journaled; its space is reclaimed when its entry logs are compacted."""
        self._check_open()
        info = self._ledgers.pop(ledger_id, None)
        entries = self._index.pop(ledger_id, None)
        if info is None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut
        live = self._log_live
        for log_id, _, length in entries.locations() if entries is not None else ():
            live[log_id] -= length
        self._ledgers_deleted += 1
        deleted_ms = _wall_ms(self._clock)
        self._tombstones[ledger_id] = deleted_ms
        return self._journal.append(encode_delete_ledger(ledger_id),
                                    (TYPE_DELETE_LEDGER, ledger_id, deleted_ms))

    async def entry_log_usage(self) -> dict[int, tuple[int, int]]:
        """``{log id: (live bytes, file bytes)}`` of every finished entry log (not the
        one being written).  The directory is listed off the event loop."""
        current = self._writer.log_id
        sizes = await asyncio.get_running_loop().run_in_executor(
            self._read_pool, _entry_log_sizes, self._ledger_dir / ENTRYLOG_DIR)
        live = self._log_live
        return {log_id: (max(0, live.get(log_id, 0)), size)
                for log_id, size in sizes.items() if log_id < current}

    async def compact_entry_log(self, log_id: int, rate_bytes_per_s: float = 0.0) -> int:
        """:meth:`compact_entry_logs` of one log."""
        return await self.compact_entry_logs([log_id], rate_bytes_per_s)

    async def compact_entry_logs(self, log_ids: Sequence[int],
                                 rate_bytes_per_s: float = 0.0) -> int:
        """Move the live entries of finished entry logs to the current one, make the
        move durable (one checkpoint), then delete those logs; returns the bytes freed.
        Adds and reads go on meanwhile; ``rate_bytes_per_s`` paces the reading."""
        current = self._writer.log_id
        for log_id in log_ids:
            if log_id >= current:
                raise BadRequestError(f"entry log {log_id} is still being written")
        loop = asyncio.get_running_loop()
        sizes: dict[int, int] = {}
        moved = 0
        pacer = RateLimiter(rate_bytes_per_s, burst=COMPACTION_CHUNK_BYTES, clock=self._clock)
        for log_id in log_ids:
            path = self._ledger_dir / ENTRYLOG_DIR / entry_log_name(log_id)
            sizes[log_id] = (await loop.run_in_executor(self._read_pool, os.stat, path)).st_size
            moved += await self._move_live_entries(log_id, path, sizes[log_id], pacer)
        if not log_ids:
            return 0
        await self.checkpoint()  # the moved copies are durable before the old logs go
        await self._clock.sleep(COMPACTION_READ_GRACE_S)  # reads that looked the old place up
        for log_id in log_ids:
            path = self._ledger_dir / ENTRYLOG_DIR / entry_log_name(log_id)
            await loop.run_in_executor(self._read_pool, self._reader.forget, log_id)
            await loop.run_in_executor(self._read_pool, _unlink_quietly, path)
            self._log_live.pop(log_id, None)
        total = sum(sizes.values())
        self._compactions += len(log_ids)
        self._compacted_bytes += total
        self._compaction_moved_bytes += moved
        self._log.info("entry logs compacted", entry_logs=list(log_ids),
                       bytes_freed=total - moved, bytes_moved=moved)
        return total - moved

    async def _move_live_entries(self, log_id: int, path: Path, size: int,
                                 pacer: RateLimiter) -> int:
        loop = asyncio.get_running_loop()
        offset = 0
        moved = 0
        while offset < size:
            data = await loop.run_in_executor(self._read_pool, _pread_path, path,
                                              COMPACTION_CHUNK_BYTES, offset)
            if not data:
                break
            pairs, good = scan_records(data)
            if not pairs:
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
                entries = self._index.get(record.ledger_id)
                if entries is None or entries.get(record.entry_id) != loc:
                    continue  # deleted, or overwritten since: garbage
                raws.append(bytes(view[off:end]))
                items.append((TYPE_ADD, record.ledger_id, record.entry_id))
                olds.append(loc)
            del view
            if raws:
                result = await self._journal.run_in_writer(self._writer.append, raws, items)
                self._relocate(olds, result)
                moved += sum(len(r) for r in raws)
            offset += good
            await pacer.acquire(good)
        return moved

    def _relocate(self, olds: list[Location], result: list[tuple[int, int, Location]]) -> None:
        """Point moved entries at their new place, unless they changed meanwhile."""
        live = self._log_live
        for old, (ledger_id, entry_id, new) in zip(olds, result, strict=True):
            entries = self._index.get(ledger_id)
            if entries is None or entries.get(entry_id) != old:
                continue  # deleted or overwritten while being moved: the copy is garbage
            entries.put(entry_id, new)
            live[new[0]] = live.get(new[0], 0) + new[2]
            live[old[0]] -= old[2]

    async def _flush_entry_logs(self) -> None:
        """Write back what was added to the entry logs so far (off the writer thread),
        so the next checkpoint has little left to flush and does not stall the disk."""
        try:
            async with self._checkpoint_lock:  # a checkpoint must not miss a handed-over log
                fds = await self._journal.run_in_writer(self._writer.take_for_sync)
                await asyncio.to_thread(_sync_and_close, fds)
                self._entry_log_flushes += 1
        except (BookieIOError, OSError) as exc:
            self._log.warning("entry log flush failed (the next checkpoint retries)",
                              error=repr(exc))
        finally:
            self._flush_task = None

    # --- checkpoints ----------------------------------------------------------

    async def checkpoint(self) -> None:
        """Make everything journaled so far durable outside the journal and delete
        the journal files that are no longer needed.  BookieIOError if the
        journal failed (a checkpoint then could skip records that never reached
        the entry log)."""
        if self._journal.failed:
            raise BookieIOError("journal failed: not checkpointing")
        async with self._checkpoint_lock:
            lacs = {ledger_id: info.lac for ledger_id, info in self._ledgers.items()
                    if info.lac >= 0}
            t0 = time.perf_counter()  # performance timer: only reported (checkpoint_s_*)
            work = await self._journal.run_in_writer(self._checkpoint_capture, lacs,
                                                     _wall_ms(self._clock))
            if work is None:
                self._checkpoints_skipped += 1
                return
            # The slow part (fdatasync of the entry logs and index, the checkpoint file,
            # journal file removal) runs off the writer thread: adds keep committing.
            await asyncio.to_thread(self._checkpoint_write, work)
            self._last_checkpoint_key = work.key
            elapsed = time.perf_counter() - t0
            self._checkpoints += 1
            self._checkpoint_s_last = elapsed
            self._checkpoint_s_max = max(self._checkpoint_s_max, elapsed)

    def _checkpoint_capture(self, lacs: dict[int, int], now_ms: int) -> _CheckpointWork | None:
        """Writer thread, between batches: where the checkpoint stands (cheap).
        ``now_ms``: the clock's wall time when the checkpoint began (tombstone expiry)."""
        journal = self._journal
        if journal.writer_failed:
            raise BookieIOError("journal failed: not checkpointing")
        seq, offset = journal.position
        writer = self._writer
        key = (seq, offset, writer.log_id, writer.length, writer.index_length, lacs)
        if key == self._last_checkpoint_key:
            return None
        ledgers = []
        for ledger_id, d in self._durable.items():
            lac = lacs.get(ledger_id, -1)
            if lac > d.lac:
                d.lac = lac
            ledgers.append([ledger_id, d.master_key, d.fenced, d.lac, d.explicit_lac])
        tombstones = self._durable.tombstones
        expired_before = int(now_ms - self._config.gc_tombstone_s * 1000)
        for ledger_id in [lid for lid, ms in tombstones.items() if ms <= expired_before]:
            del tombstones[ledger_id]
        payload = {
            "version": CHECKPOINT_VERSION,
            "journal_seq": seq,
            "journal_offset": offset,
            "entry_log_id": writer.log_id,
            "entry_log_length": writer.length,
            "index_length": writer.index_length,
            "ledgers": ledgers,
            "tombstones": [[lid, ms] for lid, ms in tombstones.items()],
        }
        return _CheckpointWork(key, payload, writer.take_for_sync())

    def _checkpoint_write(self, work: _CheckpointWork) -> None:
        """A worker thread: make the captured state durable, then write the mark."""
        _sync_and_close(work.fds)
        fsync_dir(self._ledger_dir / ENTRYLOG_DIR)  # entry logs created since the last one
        _write_checkpoint(self._ledger_dir, work.payload)
        self._journal_files_deleted += self._journal.delete_files_before(
            work.payload["journal_seq"])

    async def _housekeeping(self) -> None:
        """Refresh disk usage every second; checkpoint every checkpoint_interval_s."""
        loop = asyncio.get_running_loop()
        interval = self._config.checkpoint_interval_s
        next_checkpoint = self._clock.monotonic_s() + interval
        while True:
            await self._clock.sleep(min(DISK_USAGE_REFRESH_S, interval))
            try:
                self._disk_usage = await loop.run_in_executor(self._read_pool, _statvfs,
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
        if self._flush_task is not None:  # not cancelled: it owns fds it must close
            await asyncio.wait([self._flush_task])
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
                await asyncio.get_running_loop().run_in_executor(self._read_pool,
                                                                 self._writer.close)
        finally:
            await journal.close()
            # Waits for in-flight reads, so no fd is closed under a pread.
            await asyncio.to_thread(self._read_pool.shutdown, True)
            await asyncio.to_thread(self._reader.close)
            self._log.info("storage closed", graceful=graceful)

    # --- statistics -----------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        free, total = self._disk_usage
        return {
            "ledgers": len(self._ledgers),
            "entries": sum(len(e) for e in self._index.values()),
            "adds": self._adds,
            "reads": self._reads,
            "fences": self._fences,
            "checkpoints": self._checkpoints,
            "checkpoints_skipped": self._checkpoints_skipped,
            "checkpoint_s_last": self._checkpoint_s_last,
            "checkpoint_s_max": self._checkpoint_s_max,
            "journal_files_deleted": self._journal_files_deleted,
            "entry_log_flushes": self._entry_log_flushes,
            "ledgers_deleted": self._ledgers_deleted,
            "compactions": self._compactions,
            "compacted_bytes": self._compacted_bytes,
            "compaction_moved_bytes": self._compaction_moved_bytes,
            "entry_log_id": self._writer.log_id,
            "entry_log_bytes": self._writer.length,
            "index_bytes": self._writer.index_length,
            "disk_free_bytes": free,
            "disk_total_bytes": total,
            "recovery": dict(self._recovery_stats),
            "journal": self._journal.statistics(),
        }
