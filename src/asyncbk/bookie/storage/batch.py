"""A journal batch applied on the writer thread (:meth:`LedgerStorage.apply_in_writer
<.ledger_storage.LedgerStorage.apply_in_writer>`): ADD records copied to the entry log
and indexed, the other records applied to the durable ledger state, in journal order."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..journal_format import TYPE_ADD, TYPE_DELETE_LEDGER
from .checkpoint import DurableState, apply_op
from .entrylog import EntryLogWriter
from .index import Location
from .kvindex import IndexOp, KVEntryIndex

AddedEntry = tuple[int, int, Location, Any]
"""An add written: ``(ledger, entry, location, the LedgerInfo it was added to)`` (a plain
tuple: one per entry, on the hot path)."""


class BatchApplied(NamedTuple):
    """What :meth:`LedgerStorage.apply_in_writer` hands the loop for one batch."""

    added: list[AddedEntry]
    """The adds written, in journal order."""
    deleted: list[int]
    """The ledgers whose deletion was applied, in journal order."""
    live: dict[int, int] | None
    """On-disk index: the change of each entry log's live bytes (None: in-memory index,
    whose live bytes the loop keeps as it indexes the adds)."""


def write_batch(writer: EntryLogWriter, kv_index: KVEntryIndex | None, durable: DurableState,
                records: list[bytes], items: list[Any]) -> BatchApplied:
    """Writer thread, after the batch's fsync: copy ADD records to the entry
    log + index (the on-disk one: one transaction), apply the other records to
    the durable ledger state, all in journal order (a deletion between adds of
    its ledger stays between them).  With index.log, the first record of a ledger
    re-created after its deletion appends the deletion marker first
    (:meth:`EntryLogWriter.mark_if_due`): the index records written before it
    come before the marker, those of the new ledger after it."""
    ops: list[IndexOp] = []
    added: list[AddedEntry] = []
    deleted: list[int] = []
    add_records: list[bytes] = []
    add_items: list[Any] = []

    def flush() -> None:
        if add_records:
            for (ledger_id, entry_id, loc), item in zip(
                    writer.append(add_records, add_items), add_items, strict=True):
                added.append((ledger_id, entry_id, loc, item[3]))
                if kv_index is not None:
                    ops.append(("put", ledger_id, entry_id, loc))
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
        if kind == TYPE_DELETE_LEDGER:
            flush()
            ops.append(("del", item[1]))
            deleted.append(item[1])
            writer.ledger_deleted(item[1])
        apply_op(durable, kind, item[1], item[2])
    flush()
    live = kv_index.apply(ops) if kv_index is not None and ops else None
    return BatchApplied(added, deleted, live)
