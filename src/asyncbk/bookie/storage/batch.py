"""A journal batch applied on the writer thread (:meth:`LedgerStorage.apply_in_writer
<.ledger_storage.LedgerStorage.apply_in_writer>`): ADD records copied to the entry log
and indexed, the other records applied to the durable ledger state, in journal order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..fileio import FileIO
from ..journal_format import TYPE_ADD, TYPE_DELETE_LEDGER
from .checkpoint import _apply_op, _DurableState
from .entrylog import _EntryLogWriter
from .index import INDEX_FILE, Location
from .kvindex import IndexOp, KVEntryIndex

_BatchApplied = tuple[list[tuple[int, int, Location, Any]], list[int], dict[int, int] | None]
"""What :meth:`LedgerStorage.apply_in_writer` hands the loop: the adds written
``(ledger, entry, location, the LedgerInfo they were added to)``, the ledgers
deleted, and (on-disk index) the change of each entry log's live bytes."""


def _remove_index_log(io: FileIO, ledger_dir: Path) -> None:
    io.unlink(ledger_dir / INDEX_FILE, missing_ok=True)
    io.fsync_dir(ledger_dir)


def write_batch(writer: _EntryLogWriter, kv_index: KVEntryIndex | None, durable: _DurableState,
                records: list[bytes], items: list[Any]) -> _BatchApplied:
    """Writer thread, after the batch's fsync: copy ADD records to the entry
    log + index (the on-disk one: one transaction), apply the other records to
    the durable ledger state, all in journal order (a deletion between adds of
    its ledger stays between them).  With index.log, the first record of a ledger
    re-created after its deletion appends the deletion marker first
    (:meth:`_EntryLogWriter.mark_if_due`): the index records written before it
    come before the marker, those of the new ledger after it."""
    ops: list[IndexOp] = []
    added: list[tuple[int, int, Location, Any]] = []
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
        _apply_op(durable, kind, item[1], item[2])
    flush()
    live = kv_index.apply(ops) if kv_index is not None and ops else None
    return added, deleted, live
