"""Ledger storage: journal + entry logs + index + checkpoints.

This is what the request processor calls.  The design follows Apache
BookKeeper's bookie: every mutation is first appended to the group-committed
journal (:mod:`..journal`) and acknowledged after the fsync that covers it;
the same records are then stored where reads can find them without scanning
the journal; periodic checkpoints make the older journal files redundant.

On disk
-------
``journal_dir/<seq:016x>.jnl``
    The journal (format in :mod:`..journal_format`).
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
    log id, record offset, record length; written in the same batch.  A record
    with entry id -1 and log id, offset and length 0 is a *deletion marker*:
    every earlier record of that ledger is void.  The writer appends one when a deleted
    ledger's id is used again, before the new ledger's first record (a deletion
    alone writes nothing, so a file without re-created ledgers is in the format
    of earlier versions, which refuse a marker as a corrupt record).  Loaded into
    memory at start; ledgers that the checkpoint does not know (deleted) are
    dropped then.  No checksum: only the prefix recorded in the checkpoint
    (which was fsynced before the checkpoint was written) is ever trusted;
    anything after it is cut and rebuilt from the journal (a replayed
    re-creation writes its marker again).  Rewritten at a checkpoint once at least
    half of it is dead (``index_log_compaction_bytes_min``; :mod:`.indexlog`): the
    rewrite, ``index.log.compact``, is named by a checkpoint (version 3) before it is
    renamed over index.log.
``ledger_dir/index.lmdb/``
    With ``index_backend = "lmdb"`` instead of index.log: the index on disk
    (:mod:`.kvindex`, over the :mod:`.kv` seam).  Each journal batch's index changes
    are one transaction on the writer thread into a bounded in-memory write cache
    (:mod:`.writecache`, ``index_write_cache_entries_max``; past it a checkpoint
    starts early), made of layers of up to 16,384 keys: each full layer, and the
    current one at each checkpoint's capture, is frozen and written to LMDB (in the
    background, and before the checkpoint, version 2, is written) as one fully
    synced transaction, so the LMDB file changes by whole batches, survives a power
    cut whole and is never written in one long burst.  At start, entries placed after
    the mark are cut and the journal replay re-puts them (a compaction re-indexes its
    copies only once a checkpoint covers them).  A memory-backend dir is migrated
    (index.log loaded with its deletion markers, synced, checkpoint, index.log
    removed; a crash re-runs it); an lmdb dir opened with "memory" is refused.  See
    docs/storage.md.
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

Deletion and compaction (driven by :mod:`..gc`): :meth:`LedgerStorage.delete_ledger`
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

Limits (deliberate, for now): with ``index_backend = "memory"`` the index is in memory (:class:`LedgerIndex`,
about 12 bytes per stored entry) and start-up reads all of index.log.  Between its
rewrites index.log is append-only: records of moved and deleted entries stay in it
and are superseded (a later record for the same entry wins) or dropped (the ledger
is gone, or a deletion marker follows them) when it is loaded; a rewrite keeps one
record per stored entry.  The writer keeps the ids of the deleted ledgers whose
records index.log may still hold without a marker (a set, rebuilt at start), so
that their re-creation can write one.

Modules
-------
:mod:`.api`
    :class:`LedgerInfo` and the protocols the rest of the bookie uses:
    :class:`Storage` (processor, GC, server) and :class:`RequestStorage`.
:mod:`.directories`
    several ledger directories: one :class:`LedgerStorage` each, whole ledgers per
    directory (:class:`MultiDirStorage`), and :func:`open_storage`.
:mod:`.ledger_storage`
    :class:`LedgerStorage`: adds, fences, LACs, reads, deletion, checkpoints,
    housekeeping, shutdown.
:mod:`.index`
    :class:`Location`, the :class:`EntryIndex` protocol and its in-memory
    implementation (:class:`LedgerIndex` per ledger), ``index.log`` parsing.
:mod:`.batch`
    a journal batch applied on the writer thread (entry log, index, ledger state).
:mod:`.kv`, :mod:`.kvindex`
    the ordered key-value seam (:class:`~.kv.IndexKV`, LMDB) and the on-disk
    :class:`~.kvindex.KVEntryIndex` over it.
:mod:`.entrylog`
    entry log naming, writer (entry logs + index.log) and reader.
:mod:`.checkpoint`
    the checkpoint file and the journaled ledger state it records.
:mod:`.checkpointer`
    when checkpoints run and what they do (and the background flushes and rewrites).
:mod:`.indexlog`
    the crash-safe rewrite of ``index.log`` once most of it is dead.
:mod:`.writecache`
    the on-disk index's write cache, written to LMDB a layer at a time.
:mod:`.recovery`
    start-up: checkpoint, index and journal replay.
:mod:`.compaction`
    moving live entries out of finished entry logs.
"""

from .api import LedgerInfo, RequestStorage, Storage
from .checkpoint import CHECKPOINT_FILE, CHECKPOINT_VERSION, CheckpointMark, read_checkpoint
from .compaction import COMPACTION_READ_GRACE_S
from .directories import MultiDirStorage, open_storage
from .entrylog import ENTRYLOG_DIR, entry_log_name
from .index import (
    INDEX_FILE,
    INDEX_GAP_MAX,
    INDEX_RECORD,
    EntryIndex,
    LedgerIndex,
    Location,
    MemoryEntryIndex,
)
from .ledger_storage import LedgerStorage

__all__ = [
    "CHECKPOINT_FILE",
    "CHECKPOINT_VERSION",
    "COMPACTION_READ_GRACE_S",
    "ENTRYLOG_DIR",
    "INDEX_FILE",
    "INDEX_GAP_MAX",
    "INDEX_RECORD",
    "CheckpointMark",
    "EntryIndex",
    "LedgerIndex",
    "LedgerInfo",
    "LedgerStorage",
    "Location",
    "MemoryEntryIndex",
    "MultiDirStorage",
    "RequestStorage",
    "Storage",
    "entry_log_name",
    "open_storage",
    "read_checkpoint",
]
