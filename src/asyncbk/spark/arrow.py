"""Stream entries as Arrow columns, for the tasks of a read.

A version-2 entry (:mod:`asyncbk.stream.codec`) is columnar: its txids are a
range or a column, its times a constant or a column, its records' lengths a
column and their bytes one run, so NumPy turns it into Arrow arrays without a
Python object per record (the data column points into the entry's bytes).  Only
records with a key or headers cost Python work (one msgpack decode each).  A
version-1 entry whose records all have the same length is cut the same way; any
other goes through :func:`asyncbk.stream.codec.decode`.  All give the same
columns (the unit tests compare them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..stream.codec import (
    EXTRAS,
    HEADER_BYTES,
    V1_HEADER,
    V1_RECORD,
    VERSION,
    VERSION_1,
    Header,
    decode,
    unpack_extras,
)

TIMESTAMP = pa.timestamp("us", tz="UTC")
HEADERS = pa.map_(pa.string(), pa.binary())
SCHEMA = pa.schema([("stream", pa.string()), ("position", pa.string()),
                    ("txid", pa.int64()), ("data", pa.binary()), ("key", pa.binary()),
                    ("timestamp", TIMESTAMP)])
SCHEMA_WITH_HEADERS = SCHEMA.append(pa.field("headers", HEADERS))
_slots = pa.array([str(i) for i in range(4096)], pa.string())
_TS_DTYPES = (None, ">u2", ">u4", ">u8")
_TXID_BYTES = (0, 4, 8)


def schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema of a read of streams (``includeHeaders``: with ``headers``)."""
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


@dataclass(frozen=True, slots=True)
class EntryColumns:
    """The records in slots ``lo..hi-1`` of one entry, as columns."""

    txids: pa.Array
    datas: pa.Array
    times_ms: np.ndarray
    """int64 milliseconds since the epoch, one per record."""
    extras: list[bytes] | None
    """Each record's packed key and headers (None: no record has any)."""
    lo: int
    hi: int


def _slot_names(lo: int, hi: int) -> pa.Array:
    global _slots
    while hi > len(_slots):
        _slots = pa.array([str(i) for i in range(2 * len(_slots))], pa.string())
    return _slots.slice(lo, hi - lo)


def _clip(count: int, lo: int, hi: int | None) -> tuple[int, int]:
    top = count if hi is None else min(hi, count)
    return min(lo, top), top


def _v2_columns(payload: bytes, where: str, lo: int, hi: int | None) -> EntryColumns | None:
    h = Header(payload, where)
    count, flags = h.count, h.flags
    txid_mode = (flags >> 2) & 3
    ts_mode = (flags >> 4) & 3
    if txid_mode > 2 or count < 1:
        return None
    off = HEADER_BYTES
    txid_col = None
    if txid_mode:
        width = _TXID_BYTES[txid_mode]
        txid_col = np.frombuffer(payload, ">u4" if width == 4 else ">u8", count, off)
        off += width * count
    ts_col = None
    if ts_mode:
        dtype = np.dtype(_TS_DTYPES[ts_mode])
        ts_col = np.frombuffer(payload, dtype, count, off)
        off += dtype.itemsize * count
    if count > 1:
        lengths = np.frombuffer(payload, ">u4", count, off).astype(np.int64)
        off += 4 * count
    else:
        lengths = None
    ext_ends = None
    ext_at = 0
    if flags & EXTRAS:
        ext_ends = np.cumsum(np.frombuffer(payload, ">u4", count, off).astype(np.int64))
        off += 4 * count
        ext_at = off
        off += int(ext_ends[-1])
    if lengths is None:
        lengths = np.array([len(payload) - off], np.int64)
    ends = np.cumsum(lengths)
    if off + (int(ends[-1]) if count else 0) != len(payload) or ends[-1] < 0:
        return None  # let decode() name what is wrong
    lo, top = _clip(count, lo, hi)
    n = top - lo
    if txid_col is None:
        txids = np.arange(h.base_txid + lo, h.base_txid + top, dtype=np.int64)
    elif txid_mode == 1:
        txids = txid_col[lo:top].astype(np.int64) + h.base_txid
    else:
        txids = txid_col[lo:top].astype(np.int64)
    if ts_col is None:
        times = np.full(n, h.base_timestamp_ms, np.int64)
    elif ts_mode == 3:
        times = ts_col[lo:top].astype(np.int64)
    else:
        times = ts_col[lo:top].astype(np.int64) + h.base_timestamp_ms
    extras = None
    if ext_ends is not None:
        bounds = [0, *ext_ends.tolist()]
        extras = [payload[ext_at + bounds[i]:ext_at + bounds[i + 1]] for i in range(lo, top)]
    starts = np.concatenate(([0], ends))[lo:top + 1]
    base = int(starts[0]) if n else 0
    offsets = (starts - base).astype(np.int32) if n else np.zeros(1, np.int32)
    data = pa.py_buffer(payload)[off + base:off + base + (int(offsets[-1]) if n else 0)]
    datas = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])
    return EntryColumns(pa.array(txids, pa.int64()), datas, times, extras, lo, top)


def _v1_uniform(payload: bytes, lo: int, hi: int | None, v1_ts_ms: int) -> EntryColumns | None:
    """A version-1 entry whose records all have one length, cut by NumPy."""
    version, _flags, count, _before = V1_HEADER.unpack_from(payload, 0)
    _txid, length = V1_RECORD.unpack_from(payload, V1_HEADER.size)
    stride = V1_RECORD.size + length
    if version != VERSION_1 or not count or len(payload) != V1_HEADER.size + count * stride:
        return None
    rows = np.frombuffer(payload, np.uint8, count * stride, V1_HEADER.size).reshape(count, stride)
    if not (rows[:, 8:12].copy().view(">u4").ravel() == length).all():
        return None
    lo, top = _clip(count, lo, hi)
    part = rows[lo:top]
    n = top - lo
    txids = part[:, :8].copy().view(">u8").ravel().astype(np.int64)
    data = np.ascontiguousarray(part[:, V1_RECORD.size:])
    offsets = np.arange(0, (n + 1) * length, length, dtype=np.int32) \
        if length else np.zeros(n + 1, np.int32)
    datas = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                   pa.py_buffer(data)])
    return EntryColumns(pa.array(txids, pa.int64()), datas, np.full(n, v1_ts_ms, np.int64),
                        None, lo, top)


def entry_columns(payload: bytes, where: str, lo: int, hi: int | None,
                  v1_ts_ms: int = 0) -> EntryColumns:
    """The records in slots ``lo..hi-1`` of an entry (``hi`` None: to the last; both
    clipped to the records there are); a version-1 entry's records get ``v1_ts_ms``
    as their time."""
    got: EntryColumns | None = None
    if payload[:1] == bytes([VERSION]) and len(payload) >= HEADER_BYTES:
        got = _v2_columns(payload, where, lo, hi)
    elif len(payload) >= V1_HEADER.size + V1_RECORD.size:
        got = _v1_uniform(payload, lo, hi, v1_ts_ms)
    if got is not None:
        return got
    b = decode(payload, where, v1_ts_ms)
    lo, top = _clip(b.count, lo, hi)
    return EntryColumns(pa.array(list(b.txids[lo:top]), pa.int64()),
                        pa.array(b.datas[lo:top], pa.binary()),
                        np.array(b.timestamps[lo:top], np.int64),
                        None if b.extras is None else b.extras[lo:top], lo, top)


def _keys_and_headers(extras: list[bytes], where: str,
                      include_headers: bool) -> tuple[pa.Array, pa.Array | None]:
    """The ``key`` column and (``include_headers``) the ``headers`` column of records
    whose packed keys and headers are ``extras``."""
    keys: list[bytes | None] = []
    headers: list[list[tuple[str, bytes]]] = []
    for blob in extras:
        key, hdrs = unpack_extras(blob, where)
        keys.append(key)
        if include_headers:
            headers.append(list(hdrs.items()))
    key_col = pa.array(keys, pa.binary())
    if not include_headers:
        return key_col, None
    return key_col, pa.array(headers, HEADERS)


def _no_headers(n: int) -> pa.Array:
    return pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)),
                                   pa.array([], pa.string()), pa.array([], pa.binary()))


@dataclass(frozen=True, slots=True)
class Piece:
    """The records an entry contributes to a batch."""

    entry: int
    columns: EntryColumns
    where: str


def stream_batch(stream: str, segment: int, pieces: list[Piece], include_headers: bool = False,
                 ts_floor_ms: int = 0) -> pa.RecordBatch:
    """One record batch from the pieces of entries of one segment (whose records' times
    are raised to ``ts_floor_ms``)."""
    positions, txids, datas, times = [], [], [], []
    keyed = False
    for p in pieces:
        c = p.columns
        if c.hi <= c.lo:
            continue
        positions.append(pc.binary_join_element_wise(f"{segment}:{p.entry}:",
                                                      _slot_names(c.lo, c.hi), ""))
        txids.append(c.txids)
        datas.append(c.datas)
        times.append(c.times_ms)
        keyed = keyed or c.extras is not None
    out_schema = schema(include_headers)
    if not datas:
        return pa.RecordBatch.from_pylist([], schema=out_schema)
    data = pa.concat_arrays(datas)
    n = len(data)
    ts = np.concatenate(times)
    if ts_floor_ms:
        np.maximum(ts, ts_floor_ms, out=ts)
    columns = [pa.repeat(pa.scalar(stream, pa.string()), n), pa.concat_arrays(positions),
               pa.concat_arrays(txids), data]
    header_parts: list[pa.Array] = []
    if keyed:
        keys_parts: list[pa.Array] = []
        for p in pieces:
            c = p.columns
            if c.hi <= c.lo:
                continue
            m = c.hi - c.lo
            if c.extras is None:
                keys_parts.append(pa.nulls(m, pa.binary()))
                if include_headers:
                    header_parts.append(_no_headers(m))
            else:
                k, h = _keys_and_headers(c.extras, p.where, include_headers)
                keys_parts.append(k)
                if h is not None:
                    header_parts.append(h)
        columns.append(pa.concat_arrays(keys_parts))
    else:
        columns.append(pa.nulls(n, pa.binary()))
    columns.append(pa.Array.from_buffers(TIMESTAMP, n, [None, pa.py_buffer(ts * 1000)]))
    if include_headers:
        columns.append(pa.concat_arrays(header_parts) if keyed else _no_headers(n))
    return pa.RecordBatch.from_arrays(columns, schema=out_schema)
