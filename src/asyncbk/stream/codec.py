"""The entry format of stream segments: a batch of records in one ledger entry.

**Version 2** (written since records carry keys, headers and times) is columnar:
a 24-byte header of three big-endian 64-bit words, then columns, then the
records' bytes back to back::

    word 0: version:8 (2) | flags:8 | base_timestamp_ms:48
    word 1: count:24 | records_before:40
    word 2: base_txid:64
    txids       omitted when they run base_txid, base_txid + 1, ... (the default);
                else count x u32 (deltas from base_txid) or count x u64 (txids)
    timestamps  omitted when all equal base_timestamp_ms (one event-loop turn's
                records usually are); else count x u16 or u32 deltas from it, or
                count x u64 times
    lengths     count x u32, the records' byte lengths (omitted for one record)
    extras      only with flag EXTRAS: count x u32 lengths, then each record's
                key and headers (msgpack ``[key, headers]``; empty: neither)
    data        the records' bytes, concatenated

A record with no key and headers therefore costs 4 bytes beside its data (12
in version 1), and a one-record entry 24 bytes in all (26 in version 1).  With
explicit txids (at most 2**32 apart in one entry) and times spread over up to
65 s in one entry a record costs 10 bytes, so entries of 5 records or more
still cost no more than in version 1 (smaller ones up to 10 bytes more per
entry); wider gaps cost up to 8 + 8 + 4 bytes per record.  A one-record
entry's length is what follows the columns: the ledger's digest, not the
codec, catches a truncated one.

**Version 1** (``version:u8 | flags:u8 | count:u32 | records_before:u64`` then
``txid:u64 | length:u32 | data`` per record) is still read: its records have no
key, no headers and the time the caller gives (the segment's creation time).

``records_before`` counts the segment's records in earlier entries, so the
last entry of a segment tells its record count.  Flag ``END_OF_STREAM`` marks
the entry (with no records) that ends a stream.  Pure functions, no I/O.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

import msgpack

from ..errors import CorruptRecordError

VERSION = 2
VERSION_1 = 1
END_OF_STREAM = 0x01
EXTRAS = 0x02
_TXIDS_SHIFT = 2  # 2 bits: 0 sequential, 1 u32 deltas, 2 u64 values
_TS_SHIFT = 4  # 2 bits: 0 all equal, 1 u16 deltas, 2 u32 deltas, 3 u64 values
_TXID_WIDTH = {0: "", 1: "I", 2: "Q"}
_TS_WIDTH = {0: "", 1: "H", 2: "I", 3: "Q"}
_WIDTH_BYTES = {"": 0, "H": 2, "I": 4, "Q": 8}

_HEADER = struct.Struct(">QQQ")
HEADER_BYTES = _HEADER.size
RECORD_OVERHEAD_BYTES = 4
"""Bytes a plain record (no key, headers, explicit txid gap or time spread) adds
to an entry beside its data: its length."""
RECORD_OVERHEAD_BYTES_MAX = 4 + 8 + 8 + 4
"""The most a record can add beside its data and extras: length, txid,
timestamp, extras length."""
COUNT_MAX = (1 << 24) - 1
RECORDS_BEFORE_MAX = (1 << 40) - 1
TXID_MAX = (1 << 63) - 1
TIMESTAMP_MS_MAX = (1 << 48) - 1
_MASK48 = TIMESTAMP_MS_MAX
_MASK40 = RECORDS_BEFORE_MAX

V1_HEADER = struct.Struct(">BBIQ")
"""Record format 1's entry header: version, flags, count, records_before."""
V1_RECORD = struct.Struct(">QI")
"""Record format 1's record header: txid, length."""

_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def pack_extras(key: bytes | None, headers: dict[str, bytes] | None) -> bytes:
    """A record's key and headers as stored (``b""``: neither)."""
    if key is None and not headers:
        return b""
    return _packb([key, headers or None])


def unpack_extras(blob: bytes, where: str) -> tuple[bytes | None, dict[str, bytes]]:
    """``(key, headers)`` of a record from :func:`pack_extras`' bytes."""
    if not blob:
        return None, {}
    try:
        key, headers = msgpack.unpackb(blob, raw=False)
        if headers is None:
            headers = {}
        if not (key is None or isinstance(key, bytes)) or not isinstance(headers, dict):
            raise ValueError("not [key, headers]")
    except Exception as exc:
        raise CorruptRecordError(f"{where}: undecodable record key/headers ({exc})") from None
    return key, headers


def _column(fmt: str, values: Sequence[int]) -> bytes:
    return struct.pack(f">{len(values)}{fmt}", *values) if fmt else b""


def encode(records_before: int, txids: Sequence[int], datas: Sequence[bytes],
           timestamps: Sequence[int] | None = None, extras: Sequence[bytes] | None = None,
           flags: int = 0) -> bytes:
    """One entry holding ``datas`` (with ``txids``, ``timestamps`` (ms, non-decreasing;
    None: all 0) and ``extras`` (from :func:`pack_extras`; None: none)), after
    ``records_before`` records of its segment."""
    n = len(datas)
    if n > COUNT_MAX:
        raise ValueError(f"{n} records in one entry; at most {COUNT_MAX}")
    if not 0 <= records_before <= RECORDS_BEFORE_MAX:
        raise ValueError(f"records_before {records_before} out of range")
    if n != len(txids) or (timestamps is not None and len(timestamps) != n) \
            or (extras is not None and len(extras) != n):
        raise ValueError("txids, datas, timestamps and extras must have the same length")
    base_txid = txids[0] if n else 0
    ts = timestamps if timestamps is not None else [0] * n
    base_ts = ts[0] if n else 0
    if n and txids[-1] - base_txid == n - 1 and \
            (n < 3 or list(txids) == list(range(base_txid, base_txid + n))) \
            and (n < 2 or txids[1] == base_txid + 1):
        txid_mode, txid_col = 0, b""
    elif n and min(txids) >= base_txid and max(txids) - base_txid <= 0xFFFFFFFF:
        txid_mode, txid_col = 1, _column("I", [t - base_txid for t in txids])
    else:
        txid_mode, txid_col = 2, _column("Q", txids)
    low, high = (min(ts), max(ts)) if n else (0, 0)
    if low == high:
        ts_mode, ts_col = 0, b""
    elif low < base_ts:  # (not from a writer: its times never decrease)
        ts_mode, ts_col = 3, _column("Q", ts)
    else:
        spread = high - base_ts
        ts_mode = 1 if spread <= 0xFFFF else 2 if spread <= 0xFFFFFFFF else 3
        ts_col = _column(_TS_WIDTH[ts_mode],
                         ts if ts_mode == 3 else [t - base_ts for t in ts])
    if extras is not None and any(extras):
        flags |= EXTRAS
        extra_cols = [_column("I", [len(e) for e in extras]), *extras]
    else:
        flags &= ~EXTRAS
        extra_cols = []
    flags |= txid_mode << _TXIDS_SHIFT | ts_mode << _TS_SHIFT
    header = _HEADER.pack(VERSION << 56 | flags << 48 | base_ts,
                          n << 40 | records_before, base_txid)
    lengths = _column("I", [len(d) for d in datas]) if n > 1 else b""
    return b"".join([header, txid_col, ts_col, lengths, *extra_cols, *datas])


def encoded_size(data_bytes: int, count: int) -> int:
    """The size of an entry of ``count`` plain records holding ``data_bytes`` bytes."""
    return HEADER_BYTES + (count * RECORD_OVERHEAD_BYTES if count > 1 else 0) + data_bytes


class Batch:
    """A decoded entry: ``flags``, ``records_before`` and its records as columns
    (``txids``, ``datas``, ``timestamps``; ``extras``: each record's packed key and
    headers, or None when no record has any)."""

    __slots__ = ("datas", "extras", "flags", "records_before", "timestamps", "txids", "version")

    def __init__(self, version: int, flags: int, records_before: int, txids: Sequence[int],
                 datas: list[bytes], timestamps: Sequence[int],
                 extras: list[bytes] | None) -> None:
        self.version = version
        self.flags = flags
        self.records_before = records_before
        self.txids = txids
        self.datas = datas
        self.timestamps = timestamps
        self.extras = extras

    @property
    def end_of_stream(self) -> bool:
        return bool(self.flags & END_OF_STREAM)

    @property
    def count(self) -> int:
        return len(self.datas)

    @property
    def records(self) -> list[tuple[int, bytes]]:
        """``(txid, data)`` of each record."""
        return list(zip(self.txids, self.datas, strict=True))

    def extras_of(self, slot: int, where: str = "entry") -> tuple[bytes | None, dict[str, bytes]]:
        """``(key, headers)`` of the record in ``slot``."""
        if self.extras is None:
            return None, {}
        return unpack_extras(self.extras[slot], where)

    def floored(self, ts_floor_ms: int) -> Batch:
        """This batch with timestamps below ``ts_floor_ms`` raised to it."""
        if not self.timestamps or self.timestamps[0] >= ts_floor_ms:
            return self
        self.timestamps = [max(t, ts_floor_ms) for t in self.timestamps]
        return self


def decode(payload: bytes, where: str = "entry", v1_timestamp_ms: int = 0) -> Batch:
    """The records of one entry; CorruptRecordError (naming ``where``) if it is not
    one.  Records of a version-1 entry get ``v1_timestamp_ms`` as their time."""
    n = len(payload)
    if n < 1:
        raise CorruptRecordError(f"{where}: an empty entry is not a record batch")
    version = payload[0]
    if version == VERSION:
        return _decode_v2(payload, where)
    if version == VERSION_1:
        return _decode_v1(payload, where, v1_timestamp_ms)
    raise CorruptRecordError(f"{where}: record batch version {version}, this asyncbk "
                             f"reads versions {VERSION_1} and {VERSION} (written by a newer "
                             "asyncbk?)")


class Header:
    """What the first bytes of a version-2 entry say, without its records."""

    __slots__ = ("base_timestamp_ms", "base_txid", "count", "flags", "records_before")

    def __init__(self, payload: bytes, where: str) -> None:
        if len(payload) < HEADER_BYTES:
            raise CorruptRecordError(f"{where}: {len(payload)} bytes, shorter than a record "
                                     "batch header")
        w0, w1, self.base_txid = _HEADER.unpack_from(payload, 0)
        self.flags = (w0 >> 48) & 0xFF
        self.base_timestamp_ms = w0 & _MASK48
        self.count = w1 >> 40
        self.records_before = w1 & _MASK40


def _decode_v2(payload: bytes, where: str) -> Batch:
    h = Header(payload, where)
    n, count, flags = len(payload), h.count, h.flags
    txid_mode = (flags >> _TXIDS_SHIFT) & 3
    ts_mode = (flags >> _TS_SHIFT) & 3
    if txid_mode == 3:
        raise CorruptRecordError(f"{where}: unknown txid column kind 3")
    off = HEADER_BYTES
    try:
        txids: Sequence[int]
        if txid_mode == 0:
            txids = range(h.base_txid, h.base_txid + count)
        elif txid_mode == 1:
            base = h.base_txid
            txids = [base + d for d in struct.unpack_from(f">{count}I", payload, off)]
            off += 4 * count
        else:
            txids = struct.unpack_from(f">{count}Q", payload, off)
            off += 8 * count
        timestamps: Sequence[int]
        if ts_mode == 0:
            timestamps = [h.base_timestamp_ms] * count
        elif ts_mode == 3:
            timestamps = struct.unpack_from(f">{count}Q", payload, off)
            off += 8 * count
        else:
            fmt = _TS_WIDTH[ts_mode]
            base = h.base_timestamp_ms
            timestamps = [base + d for d in struct.unpack_from(f">{count}{fmt}", payload, off)]
            off += _WIDTH_BYTES[fmt] * count
        lengths: Sequence[int] | None = None
        if count > 1:
            lengths = struct.unpack_from(f">{count}I", payload, off)
            off += 4 * count
        extras: list[bytes] | None = None
        if flags & EXTRAS:
            ext_lengths = struct.unpack_from(f">{count}I", payload, off)
            off += 4 * count
            extras = []
            for size in ext_lengths:
                extras.append(payload[off:off + size])
                off += size
            if off > n:
                raise struct.error("extras run past the entry")
    except struct.error:
        raise CorruptRecordError(f"{where}: truncated record batch ({count} records "
                                 "announced)") from None
    if lengths is None:
        lengths = [n - off] if count == 1 else []
    end = off + sum(lengths)
    if end != n or off > n:
        raise CorruptRecordError(f"{where}: record batch of {n} bytes, its columns say "
                                 f"{end}")
    bounds = itertools.accumulate(lengths, initial=off)
    datas = [payload[a:b] for a, b in itertools.pairwise(bounds)] if count > 1 \
        else [payload[off:]] * count
    return Batch(VERSION, flags & (END_OF_STREAM | EXTRAS), h.records_before, txids, datas,
                 timestamps, extras)


def _decode_v1(payload: bytes, where: str, timestamp_ms: int) -> Batch:
    n = len(payload)
    if n < V1_HEADER.size:
        raise CorruptRecordError(f"{where}: {n} bytes, shorter than a record batch header")
    _version, flags, count, before = V1_HEADER.unpack_from(payload, 0)
    txids: list[int] = []
    datas: list[bytes] = []
    off = V1_HEADER.size
    unpack = V1_RECORD.unpack_from
    try:
        for _ in range(count):
            txid, length = unpack(payload, off)
            off += V1_RECORD.size
            end = off + length
            if end > n:
                raise struct.error("record runs past the entry")
            txids.append(txid)
            datas.append(payload[off:end])
            off = end
    except struct.error:
        raise CorruptRecordError(f"{where}: truncated record batch ({count} records "
                                 f"announced, {len(datas)} found)") from None
    if off != n:
        raise CorruptRecordError(f"{where}: {n - off} bytes after the last record")
    return Batch(VERSION_1, flags & END_OF_STREAM, before, txids, datas,
                 [timestamp_ms] * count, None)


def encode_v1(records_before: int, txids: Sequence[int], datas: Sequence[bytes],
              flags: int = 0) -> bytes:
    """A version-1 entry (what older asyncbk wrote), for tests of reading them."""
    parts = [V1_HEADER.pack(VERSION_1, flags, len(datas), records_before)]
    for txid, data in zip(txids, datas, strict=True):
        parts.append(V1_RECORD.pack(txid, len(data)))
        parts.append(data)
    return b"".join(parts)


def timestamp_bounds(payload: bytes, where: str, v1_timestamp_ms: int) -> tuple[int, int, int]:
    """``(count, first, last)`` timestamps of an entry's records, reading only its
    header and time column (a version-1 entry: ``v1_timestamp_ms`` for both)."""
    if payload[:1] != bytes([VERSION]):
        b = decode(payload, where, v1_timestamp_ms)
        return b.count, v1_timestamp_ms, v1_timestamp_ms
    h = Header(payload, where)
    ts_mode = (h.flags >> _TS_SHIFT) & 3
    if ts_mode == 0 or h.count == 0:
        return h.count, h.base_timestamp_ms, h.base_timestamp_ms
    fmt = _TS_WIDTH[ts_mode]
    txid_bytes = {0: 0, 1: 4, 2: 8}.get((h.flags >> _TXIDS_SHIFT) & 3, 0) * h.count
    at = HEADER_BYTES + txid_bytes + _WIDTH_BYTES[fmt] * (h.count - 1)
    try:
        (value,) = struct.unpack_from(f">{fmt}", payload, at)
    except struct.error:
        raise CorruptRecordError(f"{where}: truncated record batch") from None
    return h.count, h.base_timestamp_ms, value if ts_mode == 3 else h.base_timestamp_ms + value
