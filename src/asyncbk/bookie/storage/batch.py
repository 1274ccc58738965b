"""A journal batch applied on the writer thread (:meth:`LedgerStorage.apply_in_writer
<.ledger_storage.LedgerStorage.apply_in_writer>`): ADD records copied to the entry log
and indexed, the other records applied to the durable ledger state, in journal order.

A batch of adds arrives as one run (:class:`AddRun`: its ADD records back to back, as
the journal wrote them) and is copied to the entry log in one write; what was written
goes back to the loop as runs too (:class:`~.entrylog.RunPiece`), one per ledger and
entry log, not a tuple per entry."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from ..journal_format import TYPE_ADD, TYPE_DELETE_LEDGER
from .checkpoint import DurableState, apply_op
from .entrylog import EntryLogWriter, RunPiece
from .kvindex import IndexOp, KVEntryIndex

KIND_ADD_RUN: Final = -1
"""The kind of an :class:`AddRun` item (not a journal record type: the records of a
run are ADD records)."""


class AddRun(NamedTuple):
    """The journal item of a run of one ledger's ADD records (``Journal.append_run``)."""

    kind: int
    """:data:`KIND_ADD_RUN`."""
    ledger_id: int
    entry_ids: list[int]
    sizes: list[int]
    """Each record's size, in the order of ``entry_ids``."""
    owner: Any
    """The LedgerInfo they were added to (a ledger deleted and re-created meanwhile is
    another)."""


class Written(NamedTuple):
    """Adds of one ledger written to one entry log, for the loop to index."""

    piece: RunPiece
    ledger_id: int
    owner: Any


class BatchApplied(NamedTuple):
    """What :meth:`LedgerStorage.apply_in_writer` hands the loop for one batch."""

    added: list[Written]
    """The adds written, in journal order."""
    deleted: list[int]
    """The ledgers whose deletion was applied, in journal order."""
    live: dict[int, int] | None
    """On-disk index: the change of each entry log's live bytes (None: in-memory index,
    whose live bytes the loop keeps as it indexes the adds)."""


def write_batch(writer: EntryLogWriter, kv_index: KVEntryIndex | None, durable: DurableState,
                records: list[bytes], items: list[Any]) -> BatchApplied:
    """Writer thread, while the batch's journal write is synced (before its
    ``fdatasync`` returns: a restart rebuilds whatever follows the last checkpoint from
    the synced journal, so nothing here needs the sync first): copy ADD records
    (single, or runs) to the entry log + index (the on-disk one: one transaction),
    apply the other records to the durable ledger state, all in journal order (a
    deletion between adds of its ledger stays between them).  With index.log, the
    first record of a ledger re-created after its deletion appends the deletion marker
    first (:meth:`EntryLogWriter.mark_if_due`): the index records written before it
    come before the marker, those of the new ledger after it."""
    ops: list[IndexOp] = []
    added: list[Written] = []
    deleted: list[int] = []
    add_records: list[bytes] = []
    add_items: list[Any] = []

    def written(piece: RunPiece, ledger_id: int, owner: Any) -> None:
        added.append(Written(piece, ledger_id, owner))
        if kv_index is not None:
            log_id = piece.log_id
            ops.extend(("put", ledger_id, entry_id, (log_id, offset, size)) for
                       entry_id, offset, size in zip(piece.entry_ids, piece.offsets,
                                                     piece.sizes, strict=True))

    def flush() -> None:
        if add_records:
            for (ledger_id, entry_id, loc), item in zip(
                    writer.append(add_records, add_items), add_items, strict=True):
                written(RunPiece(loc[0], [entry_id], [loc[1]], [loc[2]]), ledger_id, item[3])
            add_records.clear()
            add_items.clear()

    due = writer.marks_due
    for record, item in zip(records, items, strict=True):
        kind = item[0]
        if due and item[1] in due and kind != TYPE_DELETE_LEDGER:
            writer.mark_if_due(item[1])  # no add of that ledger is pending: it was due
        if kind == TYPE_ADD:
            add_records.append(record)
            add_items.append(item)
            continue
        if kind == KIND_ADD_RUN:
            flush()
            for piece in writer.append_run(record, item.ledger_id, item.entry_ids, item.sizes):
                written(piece, item.ledger_id, item.owner)
            continue
        if kind == TYPE_DELETE_LEDGER:
            flush()
            ops.append(("del", item[1]))
            deleted.append(item[1])
            writer.ledger_deleted(item[1])
        apply_op(durable, kind, item[1], item[2])
    flush()
    live = kv_index.apply(ops) if kv_index is not None and ops else None
    return BatchApplied(added, deleted, live)
