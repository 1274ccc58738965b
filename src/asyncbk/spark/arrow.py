"""Stream entries as Arrow columns, for the tasks of a read.

A version-2 entry (:mod:`asyncbk.stream.codec`) is columnar: its txids are a
range or a column, its records' lengths a column and their bytes one run, so
NumPy turns it into Arrow arrays without a Python object per record (the data
column points into the entry's bytes).  A version-1 entry whose records all
have the same length is cut the same way; any other goes through
:func:`asyncbk.stream.codec.decode`.  All give the same columns (the unit tests
compare them).
"""

from __future__ import annotations

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
)

SCHEMA = pa.schema([("stream", pa.string()), ("position", pa.string()),
                    ("txid", pa.int64()), ("data", pa.binary())])
_slots = pa.array([str(i) for i in range(4096)], pa.string())
_TS_BYTES = (0, 2, 4, 8)
_TXID_BYTES = (0, 4, 8)


def _slot_names(lo: int, hi: int) -> pa.Array:
    global _slots
    while hi > len(_slots):
        _slots = pa.array([str(i) for i in range(2 * len(_slots))], pa.string())
    return _slots.slice(lo, hi - lo)


def _clip(count: int, lo: int, hi: int | None) -> tuple[int, int]:
    top = count if hi is None else min(hi, count)
    return min(lo, top), top


def _v2_columns(payload: bytes, where: str, lo: int, hi: int | None
                ) -> tuple[pa.Array, pa.Array, int, int] | None:
    h = Header(payload, where)
    count, flags = h.count, h.flags
    txid_mode = (flags >> 2) & 3
    if txid_mode > 2 or count < 1:
        return None
    off = HEADER_BYTES
    txid_col = None
    if txid_mode:
        width = _TXID_BYTES[txid_mode]
        txid_col = np.frombuffer(payload, ">u4" if width == 4 else ">u8", count, off)
        off += width * count
    off += _TS_BYTES[(flags >> 4) & 3] * count
    if count > 1:
        lengths = np.frombuffer(payload, ">u4", count, off).astype(np.int64)
        off += 4 * count
    else:
        lengths = None
    if flags & EXTRAS:
        ext = np.frombuffer(payload, ">u4", count, off).astype(np.int64)
        off += 4 * count + int(ext.sum())
    if lengths is None:
        lengths = np.array([len(payload) - off], np.int64)
    ends = np.cumsum(lengths)
    if off + (int(ends[-1]) if count else 0) != len(payload):
        return None  # let decode() name what is wrong
    lo, top = _clip(count, lo, hi)
    n = top - lo
    if txid_col is None:
        txids = np.arange(h.base_txid + lo, h.base_txid + top, dtype=np.int64)
    elif txid_mode == 1:
        txids = txid_col[lo:top].astype(np.int64) + h.base_txid
    else:
        txids = txid_col[lo:top].astype(np.int64)
    starts = np.concatenate(([0], ends))[lo:top + 1]
    base = int(starts[0]) if n else 0
    offsets = (starts - base).astype(np.int32) if n else np.zeros(1, np.int32)
    data = pa.py_buffer(payload)[off + base:off + base + (int(offsets[-1]) if n else 0)]
    datas = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), data])
    return pa.array(txids, pa.int64()), datas, lo, top


def entry_columns(payload: bytes, where: str, lo: int, hi: int | None) -> tuple[pa.Array, pa.Array,
                                                                            int, int]:
    """``(txids, datas, lo, hi)`` of the records in slots ``lo..hi-1`` of an entry
    (``hi`` None: to the last; both clipped to the records there are)."""
    if payload[:1] == bytes([VERSION]) and len(payload) >= HEADER_BYTES:
        got = _v2_columns(payload, where, lo, hi)
        if got is not None:
            return got
    elif len(payload) >= V1_HEADER.size + V1_RECORD.size:
        version, _flags, count, _before = V1_HEADER.unpack_from(payload, 0)
        _txid, length = V1_RECORD.unpack_from(payload, V1_HEADER.size)
        stride = V1_RECORD.size + length
        if version == VERSION_1 and count and \
                len(payload) == V1_HEADER.size + count * stride:
            rows = np.frombuffer(payload, np.uint8, count * stride,
                                 V1_HEADER.size).reshape(count, stride)
            if (rows[:, 8:12].copy().view(">u4").ravel() == length).all():
                lo, top = _clip(count, lo, hi)
                part = rows[lo:top]
                n = top - lo
                txids = part[:, :8].copy().view(">u8").ravel().astype(np.int64)
                data = np.ascontiguousarray(part[:, V1_RECORD.size:])
                offsets = np.arange(0, (n + 1) * length, length, dtype=np.int32) \
                    if length else np.zeros(n + 1, np.int32)
                datas = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                               pa.py_buffer(data)])
                return pa.array(txids, pa.int64()), datas, lo, top
    b = decode(payload, where)
    lo, top = _clip(b.count, lo, hi)
    return (pa.array(list(b.txids[lo:top]), pa.int64()),
            pa.array(b.datas[lo:top], pa.binary()), lo, top)


def stream_batch(stream: str, segment: int, pieces: list[tuple[int, pa.Array, pa.Array, int, int]]
                 ) -> pa.RecordBatch:
    """One record batch from ``(entry, txids, datas, lo, hi)`` pieces of one segment."""
    positions, txids, datas = [], [], []
    for entry, t, d, lo, hi in pieces:
        if hi <= lo:
            continue
        positions.append(pc.binary_join_element_wise(f"{segment}:{entry}:",
                                                      _slot_names(lo, hi), ""))
        txids.append(t)
        datas.append(d)
    if not datas:
        return pa.RecordBatch.from_arrays(
            [pa.array([], pa.string()), pa.array([], pa.string()), pa.array([], pa.int64()),
             pa.array([], pa.binary())], schema=SCHEMA)
    data = pa.concat_arrays(datas)
    return pa.RecordBatch.from_arrays(
        [pa.repeat(pa.scalar(stream, pa.string()), len(data)), pa.concat_arrays(positions),
         pa.concat_arrays(txids), data], schema=SCHEMA)
