"""Checkpoints: the file ``ledger_dir/checkpoint`` (read, validated, written
atomically) and the journaled ledger state it records.

:class:`DurableState` is every ledger's state as of the last journal batch
written, kept by the journal's writer thread (:func:`apply_op`, per batch) so
that :func:`capture_checkpoint` can snapshot exactly the state of the journal prefix a
checkpoint covers (and freeze the on-disk index's write cache at that point);
:func:`make_durable` then (another thread) fsyncs the entry logs, flushes the
frozen index changes into LMDB (those a background flush has not written yet) and
writes the checkpoint.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import xxhash

from ...errors import BookieIOError
from ..fileio import OS_FILE_IO, FileIO
from ..journal_format import TYPE_DELETE_LEDGER, TYPE_EXPLICIT_LAC, TYPE_FENCE, TYPE_LEDGER_KEY
from .entrylog import ENTRYLOG_DIR, EntryLogWriter, sync_and_close
from .index import INDEX_FILE
from .indexlog import INDEX_COMPACT_FILE
from .writecache import WriteCacheKV

CHECKPOINT_FILE = "checkpoint"
CHECKPOINT_VERSION = 1
"""The version a checkpoint of a bookie with the in-memory index has."""
CHECKPOINT_VERSION_KV = 2
"""The version with the on-disk index (``"index": "lmdb"``): older code refuses it
instead of starting with no index."""
CHECKPOINT_VERSION_INDEX_FILE = 3
"""The version of a checkpoint that names the file its index length covers
(``"index_file"``: the rewrite of index.log, :mod:`.indexlog`, before it is renamed
over index.log): older code refuses it instead of reading index.log."""
_CHECKSUM = struct.Struct("<Q")


@dataclass(slots=True)
class DurableLedger:
    """A ledger's journaled state, as of the last batch written (writer thread only)."""

    master_key: bytes
    fenced: bool = False
    explicit_lac: int = -1
    lac: int = -1  # merged in from the loop at checkpoints


@dataclass
class CheckpointWork:
    """A checkpoint captured on the writer thread (:func:`capture_checkpoint`), for
    :func:`make_durable` to finish on another thread."""

    key: tuple[Any, ...]
    """What it covers (mark and LACs): an equal key later means nothing changed."""
    payload: dict[str, Any]
    """The checkpoint file's content."""
    fds: list[int]
    """Descriptors to fdatasync and close before the file is written (entry logs, index)."""
    kv: WriteCacheKV | None = None
    """The on-disk index's write cache, frozen at the capture: flushed before the
    checkpoint is written (None: index.log)."""


@dataclass(frozen=True, slots=True)
class CheckpointMark:
    """Where a checkpoint stands: the journal position just past the last batch it
    covers, and the entry log and index lengths those batches reached."""

    journal_seq: int = 0
    journal_offset: int = 0
    entry_log_id: int = 0
    entry_log_length: int = 0
    index_length: int = 0


class DurableState(dict[int, DurableLedger]):
    """The journaled state of every ledger (writer thread only), and the tombstones
    of deleted ones: ``{ledger id: deletion time (epoch ms)}``.  A tombstone makes
    the bookie refuse a deleted ledger's adds (a zombie writer's), as its fence did;
    it is kept for ``gc_tombstone_s``."""

    def __init__(self) -> None:
        super().__init__()
        self.tombstones: dict[int, int] = {}


def apply_op(durable: DurableState, kind: int, ledger_id: int, value: Any) -> None:
    """Apply a non-ADD journal operation to the durable ledger state.  ``value``: the
    master key (LEDGER_KEY), the LAC (EXPLICIT_LAC), the deletion time in epoch ms
    from the storage's clock (DELETE_LEDGER), else None."""
    if kind == TYPE_LEDGER_KEY:
        if ledger_id not in durable:
            durable[ledger_id] = DurableLedger(bytes(value))
        durable.tombstones.pop(ledger_id, None)
        return
    if kind == TYPE_DELETE_LEDGER:
        durable.pop(ledger_id, None)
        durable.tombstones[ledger_id] = int(value)
        return
    d = durable.get(ledger_id)
    if d is None:  # cannot happen (LEDGER_KEY is journaled first); keep the op anyway
        d = durable[ledger_id] = DurableLedger(b"")
    if kind == TYPE_FENCE:
        d.fenced = True
    elif kind == TYPE_EXPLICIT_LAC and value > d.explicit_lac:
        d.explicit_lac = value


# --- checkpoint file ----------------------------------------------------------


def read_checkpoint(ledger_dir: Path, io: FileIO = OS_FILE_IO) -> dict[str, Any] | None:
    """The checkpoint payload, None if there is none; BookieIOError if corrupt."""
    path = Path(ledger_dir) / CHECKPOINT_FILE
    try:
        blob = io.read_file(path)
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
    if not isinstance(payload, dict) or payload.get("version") not in (
            CHECKPOINT_VERSION, CHECKPOINT_VERSION_KV, CHECKPOINT_VERSION_INDEX_FILE):
        raise BookieIOError(f"{path}: unsupported checkpoint")
    if not _checkpoint_well_formed(payload):
        raise BookieIOError(f"{path}: malformed checkpoint")
    return payload


def _checkpoint_well_formed(payload: dict[str, Any]) -> bool:
    """The fields :func:`.recovery.recover` uses, with their types and ranges."""
    def uint(v: Any, top: int = 2**63 - 1) -> bool:
        return type(v) is int and 0 <= v <= top

    ledgers, tombstones = payload.get("ledgers"), payload.get("tombstones", [])
    index_file = payload.get("index_file", INDEX_FILE)
    return (index_file in (INDEX_FILE, INDEX_COMPACT_FILE)
            and (index_file == INDEX_FILE) == (payload["version"] != CHECKPOINT_VERSION_INDEX_FILE)
            and all(uint(payload.get(k)) for k in ("journal_seq", "journal_offset",
                                               "entry_log_length", "index_length"))
            and uint(payload.get("entry_log_id"), 0xFFFFFFFF)
            and type(ledgers) is list and all(
                type(x) is list and len(x) == 5 and uint(x[0]) and type(x[1]) is bytes
                and type(x[2]) is bool and type(x[3]) is int and type(x[4]) is int
                for x in ledgers)
            and type(tombstones) is list and all(
                type(x) is list and len(x) == 2 and uint(x[0]) and type(x[1]) is int
                for x in tombstones))


def write_checkpoint(ledger_dir: Path, payload: dict[str, Any],
                     io: FileIO = OS_FILE_IO) -> None:
    """Replace the checkpoint file atomically: ``checkpoint.tmp`` written and fsynced,
    renamed over ``checkpoint``, the directory fsynced."""
    data = msgpack.packb(payload, use_bin_type=True)
    blob = _CHECKSUM.pack(xxhash.xxh3_64_intdigest(data)) + data
    tmp = ledger_dir / (CHECKPOINT_FILE + ".tmp")
    fd = io.create(tmp, exclusive=False)
    try:
        io.write(fd, blob)
        io.fdatasync(fd)
    finally:
        io.close(fd)
    io.replace(tmp, ledger_dir / CHECKPOINT_FILE)
    io.fsync_dir(ledger_dir)


def capture_checkpoint(position: tuple[int, int], writer: EntryLogWriter,
                       durable: DurableState, lacs: dict[int, int], now_ms: int,
                       tombstone_s: float, last_key: tuple[Any, ...] | None,
                       kv: WriteCacheKV | None = None) -> CheckpointWork | None:
    """Writer thread, between batches: what a checkpoint at journal ``position``
    records, None if that is what the last one (``last_key``) recorded.  ``lacs``: the
    loop's LACs, merged in; ``now_ms``: the clock's wall time when the checkpoint
    began (tombstones older than ``tombstone_s`` are dropped); ``kv``: the on-disk
    index's write cache, None with index.log: its current layer is frozen here,
    between batches, so the flush before the checkpoint is written makes durable every
    index change of the batches the mark covers (the background flushes may have
    written later layers already: LMDB ahead of the mark is what a restart cuts, and a
    compaction re-indexes a copy only once a checkpoint covers it)."""
    seq, offset = position
    key = (seq, offset, writer.log_id, writer.length, writer.index_file, writer.index_length,
           lacs, kv.commits if kv is not None else 0)  # (a compaction's re-indexing)
    if key == last_key:
        return None
    ledgers = []
    for ledger_id, d in durable.items():
        lac = lacs.get(ledger_id, -1)
        if lac > d.lac:
            d.lac = lac
        ledgers.append([ledger_id, d.master_key, d.fenced, d.lac, d.explicit_lac])
    tombstones = durable.tombstones
    expired_before = int(now_ms - tombstone_s * 1000)
    for ledger_id in [lid for lid, ms in tombstones.items() if ms <= expired_before]:
        del tombstones[ledger_id]
    payload = {
        "version": CHECKPOINT_VERSION if kv is None else CHECKPOINT_VERSION_KV,
        "journal_seq": seq,
        "journal_offset": offset,
        "entry_log_id": writer.log_id,
        "entry_log_length": writer.length,
        "index_length": writer.index_length,
        "ledgers": ledgers,
        "tombstones": [[lid, ms] for lid, ms in tombstones.items()],
    }
    if kv is not None:
        payload["index"] = "lmdb"  # (the memory backend's checkpoint stays v1's bytes)
        kv.freeze()
    elif writer.index_file != INDEX_FILE:  # index.log being rewritten (.indexlog)
        payload["version"] = CHECKPOINT_VERSION_INDEX_FILE
        payload["index_file"] = writer.index_file
    return CheckpointWork(key, payload, writer.take_for_sync(), kv)


def make_durable(io: FileIO, work: CheckpointWork, ledger_dir: Path) -> None:
    """A worker thread: make the captured state durable, then write the mark."""
    sync_and_close(io, work.fds)
    io.fsync_dir(ledger_dir / ENTRYLOG_DIR)  # entry logs created since the last one
    if work.kv is not None:
        work.kv.flush()  # every index commit up to the mark durable (a commit per layer)
    write_checkpoint(ledger_dir, work.payload, io)
