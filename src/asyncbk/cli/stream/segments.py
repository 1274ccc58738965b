"""A stream's segments as rows (``info``, ``delete``, ``tail --no-follow``): what the
metadata says of each, and for an open segment what its ledger holds durably so far."""

from __future__ import annotations

from typing import Any

from ...errors import NoSuchLedgerError
from ...stream import codec
from ...stream.position import Position


async def segment_rows(ns: Any, info: Any) -> list[dict[str, Any]]:
    """One dict per segment; the open one filled in with what is durable so far (its
    ledger's last add confirmed)."""
    rows = []
    for s in info.segments:
        row: dict[str, Any] = {
            "seq": s.seq, "ledger_id": s.ledger_id, "state": s.state,
            "first_position": str(s.first_position),
            "last_position": str(s.last_position) if s.last_position else None,
            "first_txid": s.first_txid if s.records else None,
            "last_txid": s.last_txid if s.records else None,
            "records": s.records, "start_sequence": s.start_sequence,
            "size_bytes": s.size_bytes, "ctime_ms": s.ctime_ms,
            "completion_ms": s.completion_ms or None,
            "first_timestamp_ms": s.first_timestamp_ms,
            "last_timestamp_ms": s.last_timestamp_ms,
            "storage": s.storage,
        }
        if s.object is not None:
            row["object"] = s.object
        if s.state != "completed":
            row.update(await _durable_so_far(ns, s.seq, s.ledger_id))
        rows.append(row)
    return rows


async def _durable_so_far(ns: Any, seq: int, ledger_id: int) -> dict[str, Any]:
    """Records, txids and last position of an open segment, up to its last add
    confirmed (nothing is fenced)."""
    try:
        rh = await ns.bk.open_ledger(ledger_id, recovery=False)
    except NoSuchLedgerError:
        return {"records": None, "note": "its ledger is gone"}
    md = rh.metadata
    last = md.last_entry_id if md.is_closed else rh.last_add_confirmed
    where = f"stream {ns.name} segment {seq}"
    out: dict[str, Any] = {"records": 0, "size_bytes": None, "so_far": True}
    entry = last
    while entry >= 0:
        batch = codec.decode((await rh.read_unconfirmed(entry, entry))[0].data,
                             f"{where} entry {entry}")
        if batch.records:
            first = codec.decode((await rh.read_unconfirmed(0, 0))[0].data, f"{where} entry 0")
            out.update(records=batch.records_before + len(batch.records),
                       first_txid=(first.records or batch.records)[0][0],
                       last_txid=batch.records[-1][0],
                       last_position=str(Position(seq, entry, len(batch.records) - 1)))
            break
        entry -= 1
    return out


def last_position(rows: list[dict[str, Any]]) -> Position | None:
    """The last durable record's position, or None when there is none."""
    for row in reversed(rows):
        if row.get("last_position"):
            return Position.parse(row["last_position"])
    return None
