"""Entries cut into Arrow columns by the tasks of a read: the NumPy path (records of
one length) and the general path give exactly what the stream codec decodes."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.errors import CorruptRecordError
from asyncbk.spark import arrow
from asyncbk.spark.plan import Slice
from asyncbk.spark.source import _stream_batch
from asyncbk.stream import codec
from asyncbk.types import LedgerEntry

_extras = st.one_of(st.none(), st.tuples(
    st.one_of(st.none(), st.binary(max_size=8)),
    st.dictionaries(st.text(max_size=4), st.binary(max_size=6), max_size=3)))


@given(st.lists(st.tuples(st.binary(max_size=40), _extras, st.integers(0, 1 << 34)),
                min_size=1, max_size=60),
       st.booleans(), st.sampled_from(["same", "steps", "wide"]), st.booleans(),
       st.integers(0, 70), st.one_of(st.none(), st.integers(0, 70)))
def test_columns_equal_the_codec(records: list[tuple[bytes, Any, int]], same_length: bool,
                                 times: str, v1: bool, lo: int, hi: int | None) -> None:
    """Both formats, every txid and time column kind, with and without keys and headers:
    the Arrow columns are what the codec decodes, clipped to ``[lo, hi)``."""
    datas = [d for d, _, _ in records]
    if same_length:
        datas = [d.ljust(12, b"-")[:12] for d in datas]
    txids = sorted(random.Random(len(datas)).randrange(1 << 40) for _ in datas)
    base = 1_700_000_000_000
    stamps = {"same": [base] * len(datas),
              "steps": [base + i * 7 for i in range(len(datas))],
              "wide": [base + sum(r[2] for r in records[:i + 1]) for i in range(len(datas))]
              }[times]
    extras = [codec.pack_extras(*e) if e else b"" for _, e, _ in records]
    if v1:
        payload = codec.encode_v1(9, txids, datas)
    else:
        payload = codec.encode(9, txids, datas, stamps, extras)
    got = arrow.entry_columns(payload, "e", lo, hi, v1_ts_ms=42)
    want = codec.decode(payload, "e", 42)
    top = len(datas) if hi is None else min(hi, len(datas))
    a, b = min(lo, top), top
    assert (got.lo, got.hi) == (a, b)
    assert got.txids.to_pylist() == txids[a:b] and got.datas.to_pylist() == datas[a:b]
    assert got.times_ms.tolist() == list(want.timestamps[a:b])
    if v1 or not any(extras):
        assert got.extras is None
    else:
        assert got.extras == extras[a:b]
    batch = arrow.stream_batch("s", 3, [arrow.Piece(0, got, "e")], include_headers=True)
    rows = batch.to_pylist()
    assert [r["key"] for r in rows] == [want.extras_of(i)[0] for i in range(a, b)]
    assert [dict(r["headers"]) for r in rows] == [want.extras_of(i)[1] for i in range(a, b)]
    assert [int(r["timestamp"].timestamp() * 1000) for r in rows] == list(want.timestamps[a:b])
    assert batch.schema == arrow.schema(True)


def test_corrupt_entries_are_refused_on_both_paths() -> None:
    uniform = codec.encode(0, [1, 2], [b"ab", b"cd"])
    with pytest.raises(CorruptRecordError):
        arrow.entry_columns(uniform[:-1], "e", 0, None)
    with pytest.raises(CorruptRecordError):
        arrow.entry_columns(uniform + b"x", "e", 0, None)


def test_a_slice_keeps_its_slots_and_names_positions() -> None:
    entries = [LedgerEntry(7, e, codec.encode(e * 3, [e] * 3, [b"%d-%d" % (e, s) for s in range(3)]))
               for e in range(2, 6)]
    batch = _stream_batch("s", "ns", Slice(4, 7, 2, 1, 5, 2), entries)
    rows = batch.to_pylist()
    assert [r["position"] for r in rows] == ["4:2:1", "4:2:2", "4:3:0", "4:3:1", "4:3:2",
                                             "4:4:0", "4:4:1", "4:4:2", "4:5:0", "4:5:1"]
    assert [r["data"] for r in rows][:2] == [b"2-1", b"2-2"] and rows[-1]["data"] == b"5-1"
    assert {r["stream"] for r in rows} == {"s"} and rows[0]["txid"] == 2
