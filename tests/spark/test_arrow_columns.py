"""Entries cut into Arrow columns by the tasks of a read: the NumPy path (records of
one length) and the general path give exactly what the stream codec decodes."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncbk.errors import CorruptRecordError
from asyncbk.spark import arrow
from asyncbk.spark.plan import Slice
from asyncbk.spark.source import _stream_batch
from asyncbk.stream import codec
from asyncbk.types import LedgerEntry


@given(st.lists(st.binary(max_size=40), min_size=1, max_size=60), st.booleans(),
       st.integers(0, 70), st.one_of(st.none(), st.integers(0, 70)))
def test_columns_equal_the_codec(datas: list[bytes], same_length: bool, lo: int,
                                 hi: int | None) -> None:
    if same_length:
        datas = [d.ljust(12, b"-")[:12] for d in datas]
    txids = sorted(random.Random(len(datas)).randrange(1 << 40) for _ in datas)
    payload = codec.encode(9, txids, datas)
    t, d, a, b = arrow.entry_columns(payload, "e", lo, hi)
    top = len(datas) if hi is None else min(hi, len(datas))
    assert (a, b) == (min(lo, top), top)
    assert t.to_pylist() == txids[a:b] and d.to_pylist() == datas[a:b]


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
