"""Stream entries as Arrow columns, for the tasks of a read.

An entry whose records all have the same length (fixed-size records, common in
event pipelines) is cut into columns by NumPy without a Python object per record;
any other entry goes through :func:`asyncbk.stream.codec.decode`.  Both give the
same columns (the unit tests compare them).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..stream.codec import VERSION, decode

_HEADER = struct.Struct(">BBIQ")
_RECORD = struct.Struct(">QI")
SCHEMA = pa.schema([("stream", pa.string()), ("position", pa.string()),
                    ("txid", pa.int64()), ("data", pa.binary())])
_slots = pa.array([str(i) for i in range(4096)], pa.string())


def _slot_names(lo: int, hi: int) -> pa.Array:
    global _slots
    while hi > len(_slots):
        _slots = pa.array([str(i) for i in range(2 * len(_slots))], pa.string())
    return _slots.slice(lo, hi - lo)


def entry_columns(payload: bytes, where: str, lo: int, hi: int | None) -> tuple[pa.Array, pa.Array,
                                                                            int, int]:
    """``(txids, datas, lo, hi)`` of the records in slots ``lo..hi-1`` of an entry
    (``hi`` None: to the last; both clipped to the records there are)."""
    if len(payload) >= _HEADER.size + _RECORD.size:
        version, _flags, count, _before = _HEADER.unpack_from(payload, 0)
        _txid, length = _RECORD.unpack_from(payload, _HEADER.size)
        stride = _RECORD.size + length
        if version == VERSION and count and \
                len(payload) == _HEADER.size + count * stride:
            rows = np.frombuffer(payload, np.uint8, count * stride,
                                 _HEADER.size).reshape(count, stride)
            if (rows[:, 8:12].copy().view(">u4").ravel() == length).all():
                top = count if hi is None else min(hi, count)
                lo = min(lo, top)
                part = rows[lo:top]
                n = top - lo
                txids = part[:, :8].copy().view(">u8").ravel().astype(np.int64)
                data = np.ascontiguousarray(part[:, _RECORD.size:])
                offsets = np.arange(0, (n + 1) * length, length, dtype=np.int32) \
                    if length else np.zeros(n + 1, np.int32)
                datas = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                               pa.py_buffer(data)])
                return pa.array(txids, pa.int64()), datas, lo, top
    records = decode(payload, where).records
    top = len(records) if hi is None else min(hi, len(records))
    lo = min(lo, top)
    picked = records[lo:top]
    return (pa.array([r[0] for r in picked], pa.int64()),
            pa.array([r[1] for r in picked], pa.binary()), lo, top)


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
