"""The entry format of stream segments: a batch of records in one ledger entry.

An entry is a 14-byte header, then each record as its txid, its length and its
bytes (all integers big-endian)::

    version:u8 (1) | flags:u8 | count:u32 | records_before:u64
    count x ( txid:u64 | length:u32 | data )

``records_before`` counts the segment's records in earlier entries, so the
last entry of a segment tells its record count, and a record's sequence number
in the stream is the segment's start plus ``records_before`` plus its slot.
Flag ``END_OF_STREAM`` marks the entry (with no records) that ends a stream.
Pure functions, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ..errors import CorruptRecordError

VERSION = 1
END_OF_STREAM = 0x01
_HEADER = struct.Struct(">BBIQ")
_RECORD = struct.Struct(">QI")
HEADER_BYTES = _HEADER.size
RECORD_OVERHEAD_BYTES = _RECORD.size
TXID_MAX = (1 << 63) - 1


def encode(records_before: int, txids: Sequence[int], datas: Sequence[bytes],
           flags: int = 0) -> bytes:
    """One entry holding ``datas`` (with ``txids``), after ``records_before`` records."""
    parts = [_HEADER.pack(VERSION, flags, len(datas), records_before)]
    pack = _RECORD.pack
    for txid, data in zip(txids, datas, strict=True):
        parts.append(pack(txid, len(data)))
        parts.append(data)
    return b"".join(parts)


def encoded_size(data_bytes: int, count: int) -> int:
    return HEADER_BYTES + count * RECORD_OVERHEAD_BYTES + data_bytes


class Batch:
    """A decoded entry: ``flags``, ``records_before`` and its ``(txid, data)`` records."""

    __slots__ = ("flags", "records", "records_before")

    def __init__(self, flags: int, records_before: int, records: list[tuple[int, bytes]]) -> None:
        self.flags = flags
        self.records_before = records_before
        self.records = records

    @property
    def end_of_stream(self) -> bool:
        return bool(self.flags & END_OF_STREAM)


def decode(payload: bytes, where: str = "entry") -> Batch:
    """The records of one entry; CorruptRecordError (naming ``where``) if it is not one."""
    n = len(payload)
    if n < HEADER_BYTES:
        raise CorruptRecordError(f"{where}: {n} bytes, shorter than a record batch header")
    version, flags, count, before = _HEADER.unpack_from(payload, 0)
    if version != VERSION:
        raise CorruptRecordError(f"{where}: record batch version {version}, this asyncbk "
                                 f"reads version {VERSION} (written by a newer asyncbk?)")
    records: list[tuple[int, bytes]] = []
    off = HEADER_BYTES
    unpack = _RECORD.unpack_from
    try:
        for _ in range(count):
            txid, length = unpack(payload, off)
            off += RECORD_OVERHEAD_BYTES
            end = off + length
            if end > n:
                raise struct.error("record runs past the entry")
            records.append((txid, payload[off:end]))
            off = end
    except struct.error:
        raise CorruptRecordError(f"{where}: truncated record batch ({count} records "
                                 f"announced, {len(records)} found)") from None
    if off != n:
        raise CorruptRecordError(f"{where}: {n - off} bytes after the last record")
    return Batch(flags, before, records)
