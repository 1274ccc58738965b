"""Streams, the pure parts and the metadata transactions: positions, the record-batch
entry format, name and settings checks, and StreamMetadata on the in-memory store.

The property tests run their own event loop (``asyncio.run``) where they need one,
so that hypothesis drives plain functions.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import struct
from collections.abc import AsyncIterator
from typing import Any

import msgpack
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from asyncbk.config import ClientConfig
from asyncbk.errors import (
    ConfigError,
    CorruptRecordError,
    InvalidNameError,
    MetadataVersionError,
    NamespaceExistsError,
    NamespaceNotEmptyError,
    NoSuchNamespaceError,
    NoSuchStreamError,
    StreamExistsError,
)
from asyncbk.meta import keys
from asyncbk.meta.memory import MemoryMetadataStore
from asyncbk.stream import codec
from asyncbk.stream.meta import (
    COMPLETED,
    NAMESPACE_NAME_BYTES_MAX,
    STREAM_NAME_BYTES_MAX,
    Segment,
    StreamConfig,
    StreamMeta,
    StreamMetadata,
    check_namespace_name,
    check_stream_name,
    config_from,
)
from asyncbk.stream.position import Position

MAX64 = (1 << 64) - 1
MAX63 = (1 << 63) - 1
MAX32 = (1 << 32) - 1

positions = st.builds(Position.checked, st.integers(1, MAX63), st.integers(0, MAX63),
                      st.integers(0, MAX32 - 1))
"""Every real position (what ``Position.checked`` accepts)."""


# --------------------------------------------------------------------------- Position


@given(positions)
def test_position_str_parse_round_trip(p: Position) -> None:
    text = str(p)
    assert Position.parse(text) == p
    assert Position.parse(f"  {text.upper()}\n") == p  # surrounding blanks, any case


@given(positions)
def test_position_bytes_round_trip(p: Position) -> None:
    data = bytes(p)
    assert len(data) == 20
    assert Position.from_bytes(data) == p
    assert data == struct.pack(">QQI", p.segment, p.entry, p.slot)


@given(st.binary(min_size=20, max_size=20))
def test_any_twenty_bytes_are_a_position_and_back(data: bytes) -> None:
    assert bytes(Position.from_bytes(data)) == data


@given(positions, positions)
def test_position_total_order_is_segment_entry_slot(a: Position, b: Position) -> None:
    ta, tb = (a.segment, a.entry, a.slot), (b.segment, b.entry, b.slot)
    assert (a < b) == (ta < tb)
    assert (a <= b) == (ta <= tb)
    assert (a == b) == (ta == tb)
    assert (a > b) == (ta > tb)
    assert sum([a < b, a == b, a > b]) == 1  # trichotomy


@given(st.lists(positions, max_size=30))
def test_positions_sort_and_hash_like_their_triples(ps: list[Position]) -> None:
    assert [(p.segment, p.entry, p.slot) for p in sorted(ps)] == \
        sorted((p.segment, p.entry, p.slot) for p in ps)
    assert len(set(ps)) == len({(p.segment, p.entry, p.slot) for p in ps})
    for p in ps:
        q = Position(p.segment, p.entry, p.slot)
        assert q == p and hash(q) == hash(p) and {p: 1}[q] == 1


@given(positions)
@example(Position(MAX63, MAX63, MAX32 - 1))
@example(Position(1, 0, 0))
def test_markers_bracket_every_real_position(p: Position) -> None:
    assert Position.EARLIEST < p < Position.LATEST
    assert not p.is_marker()
    assert Position.EARLIEST.is_marker() and Position.LATEST.is_marker()


@pytest.mark.parametrize("triple", [(0, 0, 0), (MAX64, MAX64, MAX32)])
def test_no_real_position_is_a_marker(triple: tuple[int, int, int]) -> None:
    """The markers' triples are not real positions: parsing them as numbers is refused
    (a parsed position would otherwise print as 'earliest' or 'latest' and count as
    a marker)."""
    with pytest.raises(ValueError, match="bad stream position"):
        Position.checked(*triple)
    with pytest.raises(ValueError, match="bad stream position"):
        Position.parse(":".join(map(str, triple)))


def test_markers_print_and_parse() -> None:
    assert str(Position.EARLIEST) == "earliest" and str(Position.LATEST) == "latest"
    assert Position.parse("earliest") is Position.EARLIEST
    assert Position.parse(" LATEST ") is Position.LATEST
    assert Position.from_bytes(bytes(Position.LATEST)) == Position.LATEST
    assert Position.from_bytes(bytes(Position.EARLIEST)) == Position.EARLIEST
    assert Position.parse(str(Position.checked(3, 120, 0))) == Position(3, 120, 0)
    assert str(Position(3, 120, 0)) == "3:120:0"


@pytest.mark.parametrize("text", [
    "", " ", "1", "1:2", "1:2:3:4", "a:b:c", "1::0", "::", "1:2:x", "1.0:0:0", "1:2:3:",
    "earliest:0", "first", "1;2;3", "0:0:0", "0:5:1", "1:-1:0", "-1:0:0", "1:0:-1",
    f"{MAX64 + 1}:0:0", f"1:{MAX64 + 1}:0", f"1:0:{MAX32 + 1}", f"{MAX63 + 1}:0:0",
    f"1:{MAX63 + 1}:0", f"1:0:{MAX32}", f"{MAX64}:{MAX64}:{MAX32}",
])
def test_bad_position_strings_are_refused_helpfully(text: str) -> None:
    with pytest.raises(ValueError) as info:
        Position.parse(text)
    msg = str(info.value)
    assert "bad stream position" in msg, msg
    assert text.strip() in msg, f"the message should show the input: {msg}"
    assert "SEGMENT:ENTRY:SLOT" in msg or "segment >= 1" in msg, \
        f"the message should say what is expected: {msg}"


def test_parse_wants_text_and_from_bytes_wants_twenty_bytes() -> None:
    with pytest.raises(TypeError):
        Position.parse(b"1:2:3")  # type: ignore[arg-type]
    for n in (0, 19, 21, 40):
        with pytest.raises(ValueError, match="20 bytes"):
            Position.from_bytes(bytes(n))


def test_positions_are_immutable() -> None:
    p = Position(1, 2, 3)
    with pytest.raises(AttributeError):
        p.segment = 2  # type: ignore[misc]


# --------------------------------------------------------------------------- codec

txids = st.integers(0, codec.TXID_MAX)
records_ = st.lists(st.tuples(txids, st.binary(max_size=40)), max_size=12)
header_maps = st.dictionaries(st.text(max_size=8), st.binary(max_size=8), max_size=3)


@st.composite
def full_records(draw: st.DrawFn) -> list[tuple[int, bytes, int, bytes | None, dict[str, bytes]]]:
    """Records with non-decreasing txids and times (runs, gaps of every width), and
    keys and headers on some."""
    n = draw(st.integers(0, 12))
    txid = draw(txids.filter(lambda t: t < codec.TXID_MAX - 2**40))
    ts = draw(st.integers(0, codec.TIMESTAMP_MS_MAX - 2**34))
    out = []
    for _ in range(n):
        txid += draw(st.sampled_from([0, 1, 1, 1, 7, 2**32 + 3]))
        ts += draw(st.sampled_from([0, 0, 1, 300, 70_000, 2**33]))
        key = draw(st.one_of(st.none(), st.binary(max_size=10)))
        headers = draw(st.one_of(st.just({}), header_maps))
        out.append((txid, draw(st.binary(max_size=40)), ts, key, headers))
    return out


def _encode_full(before: int, records: list[tuple[int, bytes, int, bytes | None,
                                                  dict[str, bytes]]], flags: int = 0) -> bytes:
    return codec.encode(before, [r[0] for r in records], [r[1] for r in records],
                        [r[2] for r in records],
                        [codec.pack_extras(r[3], r[4]) for r in records], flags=flags)


@given(st.integers(0, codec.RECORDS_BEFORE_MAX), full_records(), st.integers(0, 1))
def test_codec_round_trip(before: int, records: list[Any], flags: int) -> None:
    enc = _encode_full(before, records, flags)
    batch = codec.decode(enc)
    assert batch.records_before == before
    assert batch.records == [(r[0], r[1]) for r in records]
    assert list(batch.timestamps) == [r[2] for r in records]
    assert [batch.extras_of(i) for i in range(batch.count)] == [(r[3], r[4]) for r in records]
    assert batch.end_of_stream == bool(flags)
    count, first, last = codec.timestamp_bounds(enc, "e", 0)
    assert count == len(records)
    if records:
        assert (first, last) == (records[0][2], records[-1][2])


@given(st.integers(0, 2**40 - 1), st.lists(st.binary(max_size=40), max_size=20),
       st.integers(0, 2**40), st.integers(0, codec.TIMESTAMP_MS_MAX))
def test_a_plain_record_costs_no_more_than_in_record_format_1(
        before: int, datas: list[bytes], first_txid: int, ts: int) -> None:
    """Sequential txids (the default) and one time (records of one loop turn): at
    most what version 1 took, whatever the count."""
    assume(datas)
    ids = list(range(first_txid, first_txid + len(datas)))
    v2 = codec.encode(before, ids, datas, [ts] * len(datas))
    v1 = codec.encode_v1(before, ids, datas)
    assert len(v2) <= len(v1)
    assert len(v2) == codec.encoded_size(sum(map(len, datas)), len(datas))
    # explicit txids within 2**32 of each other, times within 65 s: 10 bytes a record
    assume(len(datas) >= 5)
    spread = codec.encode(before, [first_txid + 3 * i for i in range(len(datas))], datas,
                          [ts - ts % 2**17 + i for i in range(len(datas))])
    assert len(spread) <= len(v1)


@given(st.integers(0, 1000), full_records(), st.integers(0, 1))
def test_every_truncation_is_a_corrupt_record(before: int, records: list[Any],
                                               flags: int) -> None:
    enc = _encode_full(before, records, flags)
    # (A one-record entry's data is what follows its columns: cut there, it is the
    # ledger's digest that tells.)
    columns_end = len(enc) - (len(records[0][1]) if len(records) == 1 else 0)
    for cut in range(columns_end if len(records) == 1 else len(enc)):
        with pytest.raises(CorruptRecordError):
            codec.decode(enc[:cut], "s:1:0")


@given(st.integers(0, 1000), full_records(), st.binary(min_size=1, max_size=30))
def test_trailing_bytes_are_a_corrupt_record(before: int, records: list[Any],
                                             garbage: bytes) -> None:
    assume(len(records) != 1)  # one record's length is what is left: it takes them
    enc = _encode_full(before, records)
    with pytest.raises(CorruptRecordError):
        codec.decode(enc + garbage)


@given(records_, st.integers(0, 255))
def test_a_wrong_version_is_a_corrupt_record(records: list[tuple[int, bytes]],
                                             version: int) -> None:
    assume(version not in (codec.VERSION, codec.VERSION_1))
    enc = codec.encode(0, [t for t, _ in records], [d for _, d in records])
    with pytest.raises(CorruptRecordError, match="version"):
        codec.decode(bytes([version]) + enc[1:])


@given(records_, st.integers(0, 2**24 - 1))
def test_a_wrong_record_count_is_a_corrupt_record(records: list[tuple[int, bytes]],
                                                  count: int) -> None:
    assume(count != len(records) and len(records) > 1 and count != 1)  # (one: see above)
    enc = codec.encode(0, [t for t, _ in records], [d for _, d in records])
    bad = enc[:8] + struct.pack(">Q", count << 40) + enc[16:]
    with pytest.raises(CorruptRecordError):
        codec.decode(bad)


@given(st.integers(0, MAX64), records_, st.integers(0, 1))
def test_record_format_1_still_decodes(before: int, records: list[tuple[int, bytes]],
                                       flags: int) -> None:
    enc = codec.encode_v1(before, [t for t, _ in records], [d for _, d in records], flags)
    batch = codec.decode(enc, "old", 1_234)
    assert (batch.records_before, batch.records, batch.flags) == (before, records, flags)
    assert list(batch.timestamps) == [1_234] * len(records) and batch.extras is None
    for cut in range(len(enc)):
        with pytest.raises(CorruptRecordError):
            codec.decode(enc[:cut], "s:1:0")


@given(st.binary(max_size=200))
@example(b"\x01\x00\xff\xff\xff\xff" + bytes(8))
@example(b"\x01\x00\x00\x00\x00\x01" + bytes(8) + bytes(8) + b"\xff\xff\xff\xff")
@example(b"\x02" + bytes(23))
@example(b"\x02\x02" + bytes(6) + b"\x00\x00\x02" + bytes(13) + bytes(16))
def test_arbitrary_bytes_decode_or_raise_corrupt_record_only(data: bytes) -> None:
    try:
        batch = codec.decode(data, "fuzz")
        for i in range(batch.count):
            batch.extras_of(i, "fuzz")
    except CorruptRecordError as exc:
        assert "fuzz" in str(exc)
        return
    if batch.version == codec.VERSION_1:  # whatever decodes re-encodes to the same bytes
        assert codec.encode_v1(batch.records_before, list(batch.txids), batch.datas,
                               batch.flags) == data


def test_corrupt_record_names_where() -> None:
    with pytest.raises(CorruptRecordError, match="orders/eu segment 3 entry 7"):
        codec.decode(b"\x01", "orders/eu segment 3 entry 7")
    with pytest.raises(CorruptRecordError, match="orders/eu segment 3 entry 7"):
        codec.decode(b"\x02" + bytes(5), "orders/eu segment 3 entry 7")


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", [
    "orders/eu", "x.y-z_1", "a", "orders", "a/b/c", "a b", "é/ü", "..a", "a/.b", "a..",
    "a" * STREAM_NAME_BYTES_MAX, "%2F", "a%b", "é" * (STREAM_NAME_BYTES_MAX // 2),
])
def test_stream_names_accepted(name: str) -> None:
    assert check_stream_name(name) == name


@pytest.mark.parametrize("name", [
    "", "/", "//", "///", "a//b", "./a", "../a", "a/./b", "a/../b", "a/.", "a/..", ".", "..",
    "/a", "a/", "a" * (STREAM_NAME_BYTES_MAX + 1), "é" * (STREAM_NAME_BYTES_MAX // 2 + 1),
    "a\x00b", "a\nb", "\t", "a\x1fb", "a\x7f", "x/\ry",
])
def test_stream_names_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        check_stream_name(name)


@pytest.mark.parametrize("name", [None, 3, b"orders", ["a"]])
def test_stream_and_namespace_names_are_str(name: object) -> None:
    with pytest.raises(InvalidNameError):
        check_stream_name(name)
    with pytest.raises(InvalidNameError):
        check_namespace_name(name)


@pytest.mark.parametrize("name", ["x.y-z_1", "orders", "A1", "1", "a" * NAMESPACE_NAME_BYTES_MAX])
def test_namespace_names_accepted(name: str) -> None:
    assert check_namespace_name(name) == name


@pytest.mark.parametrize("name", [
    "", "/", "orders/eu", "a//b", "./a", ".a", "-a", "_a", "a b", "a\x00", "a\n", "é",
    "a" * (NAMESPACE_NAME_BYTES_MAX + 1), "a%2F",
])
def test_namespace_names_refused(name: str) -> None:
    with pytest.raises(InvalidNameError):
        check_namespace_name(name)


def test_invalid_name_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        check_stream_name("a//b")


# --------------------------------------------------------------------------- settings


def test_config_from_applies_values_over_the_base() -> None:
    base = StreamConfig(ensemble_size=5, write_quorum=3, ack_quorum=2, rolling_entries=7)
    cfg = config_from({"rolling_entries": 9, "rolling_s": 5}, base)
    assert cfg == StreamConfig(ensemble_size=5, write_quorum=3, ack_quorum=2,
                               rolling_entries=9, rolling_s=5.0)
    assert isinstance(cfg.rolling_s, float)
    assert config_from({}) == StreamConfig()
    assert base.with_overrides({"write_quorum": 2}).write_quorum == 2


@pytest.mark.parametrize("values, words", [
    ({"ensemble": 3}, ["unknown setting", "'ensemble'", "ensemble_size"]),
    ({"rolling_bytes_max": 1}, ["unknown setting", "rolling_bytes_max"]),
    ({"ensemble_size": "3"}, ["'ensemble_size'", "int", "str"]),
    ({"ensemble_size": 3.0}, ["'ensemble_size'", "int", "float"]),
    ({"ensemble_size": True}, ["'ensemble_size'", "int", "bool"]),
    ({"rolling_s": "1"}, ["'rolling_s'", "float"]),
    ({"rolling_s": False}, ["'rolling_s'", "float"]),
    ({"digest": 1}, ["'digest'", "str"]),
    ({"retention_s": None}, ["'retention_s'"]),
    ({"ensemble_size": 2, "write_quorum": 3}, ["ensemble_size >= write_quorum", "2/3/2"]),
    ({"write_quorum": 1, "ack_quorum": 2}, ["write_quorum >= ack_quorum"]),
    ({"ack_quorum": 0}, ["ack_quorum >= 1"]),
    ({"digest": "md5"}, ["unknown digest", "md5"]),
    ({"rolling_bytes": -1}, ["rolling_bytes", ">= 0"]),
    ({"rolling_entries": -1}, ["rolling_entries", ">= 0"]),
    ({"rolling_s": -0.5}, ["rolling_s", ">= 0"]),
    ({"retention_s": -1}, ["retention_s", ">= 0"]),
])
def test_config_from_refuses_bad_settings(values: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        config_from(values, source="stream 'eu'")
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"


def test_config_errors_name_their_source() -> None:
    with pytest.raises(ConfigError, match="namespace 'orders'"):
        config_from({"nope": 1}, source="namespace 'orders'")


# --------------------------------------------------------------------------- StreamMetadata


@pytest.fixture
async def md() -> AsyncIterator[StreamMetadata]:
    store = MemoryMetadataStore("/t")
    yield StreamMetadata(store)
    await store.close()


async def _setup(md: StreamMetadata, ns: str = "ns", *streams: str) -> None:
    await md.create_namespace(ns, StreamConfig(), 1)
    for s in streams:
        await md.create_stream(ns, s, {}, 2)


async def _snapshot(md: StreamMetadata) -> dict[str, tuple[bytes, int]]:
    """Every key under the streams root, with value and version."""
    return {kv.key: (kv.value, kv.version)
            for kv in await md.meta.kv_range(f"{md.root}/streams/")}


async def test_namespaces_create_list_delete(md: StreamMetadata) -> None:
    cfg = StreamConfig(ensemble_size=4, rolling_entries=10)
    await md.create_namespace("orders", cfg, 5)
    await md.create_namespace("orders2", StreamConfig(), 5)
    await md.create_namespace("o", StreamConfig(), 5)
    with pytest.raises(NamespaceExistsError):
        await md.create_namespace("orders", StreamConfig(), 6)
    assert await md.namespace_config("orders") == cfg
    assert sorted(await md.list_namespaces()) == ["o", "orders", "orders2"]
    await md.create_stream("orders2", "x", {}, 1)
    await md.delete_namespace("orders")  # the streams of 'orders2' are not its own
    with pytest.raises(NamespaceNotEmptyError):
        await md.delete_namespace("orders2")
    with pytest.raises(NoSuchNamespaceError):
        await md.delete_namespace("orders")
    with pytest.raises(NoSuchNamespaceError):
        await md.namespace_config("orders")
    assert sorted(await md.list_namespaces()) == ["o", "orders2"]
    with pytest.raises(InvalidNameError):
        await md.create_namespace("a/b", StreamConfig(), 1)


async def test_streams_create_read_delete(md: StreamMetadata) -> None:
    with pytest.raises(NoSuchNamespaceError):
        await md.create_stream("ns", "s", {}, 1)
    await _setup(md, "ns")
    sm = await md.create_stream("ns", "orders/eu", {"rolling_entries": 3}, 7)
    assert sm.version > 0 and sm.max_seq == 0 and not sm.ended
    assert await md.stream("ns", "orders/eu") == sm
    with pytest.raises(StreamExistsError):
        await md.create_stream("ns", "orders/eu", {}, 8)
    with pytest.raises(NoSuchStreamError):
        await md.stream("ns", "orders")
    with pytest.raises(NoSuchNamespaceError):
        await md.stream("nope", "orders/eu")
    with pytest.raises(InvalidNameError):
        await md.create_stream("ns", "a//b", {}, 1)
    await md.delete_stream(sm)
    with pytest.raises(NoSuchStreamError):
        await md.stream("ns", "orders/eu")
    assert await md.list_streams("ns") == []


LISTING_NAMES = ["a", "a/b", "a/b/c", "a/bc", "ab", "a-x", "a.y", "aa/b", "b", "A", "b/a",
                 "a b", "é", "a%", "a%2F", "%"]


@pytest.mark.parametrize("prefix", ["", "a", "a/", "a/b", "ab", "a%", "a%2", "A", "b", "c",
                                    "é", "%", "a/b/c/d"])
async def test_list_streams_by_prefix_is_exactly_the_names_starting_with_it(
        md: StreamMetadata, prefix: str) -> None:
    await _setup(md, "n", *LISTING_NAMES)
    await _setup(md, "n2", "a", "ab", "zz")  # another namespace, sharing a name prefix
    got = await md.list_streams("n", prefix)
    assert len(got) == len(set(got))
    assert sorted(got) == sorted(n for n in LISTING_NAMES if n.startswith(prefix))


@given(st.sets(st.text("ab/.%é-", min_size=1, max_size=5), max_size=12),
       st.text("ab/.%é-", max_size=4))
def test_list_streams_prefix_property(names: set[str], prefix: str) -> None:
    valid = set()
    for n in names:
        try:
            valid.add(check_stream_name(n))
        except InvalidNameError:
            pass

    async def run() -> list[str]:
        store = MemoryMetadataStore("/p")
        md = StreamMetadata(store)
        await _setup(md, "n", *sorted(valid))
        got = await md.list_streams("n", prefix)
        await store.close()
        return got

    got = asyncio.run(run())
    assert len(got) == len(set(got))
    assert set(got) == {n for n in valid if n.startswith(prefix)}


async def test_list_streams_pages_and_limit(md: StreamMetadata) -> None:
    names = [f"s/{i:04d}" for i in range(2100)] + ["t"]
    await _setup(md, "n", *names)
    got = await md.list_streams("n", "s/")
    assert sorted(got) == names[:-1]
    assert len(await md.list_streams("n")) == len(names)
    assert len(await md.list_streams("n", "s/", limit=5)) == 5


@pytest.mark.parametrize("exists, others, expected", [
    ("a", ["a/b", "ab"], True),
    (None, ["a/b", "ab", "a-"], False),
    ("a/b", ["a/bc", "a"], True),
])
async def test_stream_exists_is_exact(exists: str | None, others: list[str],
                                      expected: bool) -> None:
    """Through the Namespace API: ``stream_exists`` lists one name by prefix."""
    from asyncbk.stream.namespace import Namespace
    from asyncbk.stream.stats import StreamStats

    store = MemoryMetadataStore("/e")
    md = StreamMetadata(store)
    await _setup(md, "n", *others, *([exists] if exists else []))

    class _BK:
        meta = store
        config = ClientConfig()

    ns = Namespace(_BK(), "n", StreamConfig(), StreamStats())  # type: ignore[arg-type]
    assert await ns.stream_exists("a" if exists is None else exists) is expected
    await store.close()


def _seg(seq: int, ledger_id: int | None = None, **kw: Any) -> Segment:
    return Segment(seq=seq, ledger_id=ledger_id if ledger_id is not None else 100 + seq, **kw)


async def test_commit_puts_segments_and_returns_fresh_versions(md: StreamMetadata) -> None:
    await _setup(md, "n", "s")
    sm = await md.stream("n", "s")
    sm1, (s1,) = await md.commit(sm, put=[_seg(1)])
    assert sm1.max_seq == 1 and sm1.version > sm.version
    assert await md.stream("n", "s") == sm1
    assert await md.segments("n", "s") == [s1]
    done = dataclasses.replace(s1, state=COMPLETED, records=5, last_txid=9, first_txid=0,
                               last_entry=2, last_slot=1)
    sm2, (d1, s2) = await md.commit(sm1, put=[done, _seg(2, start_sequence=5)])
    segs = await md.segments("n", "s")
    assert segs == [d1, s2] and sm2.max_seq == 2
    assert d1.completed and d1.records == 5 and d1.last_position == Position(1, 2, 1)
    assert s2.start_sequence == 5 and not s2.completed and s2.last_position is None
    assert (await md.stream("n", "s")).version == sm2.version


async def test_commit_is_all_or_nothing_on_a_stale_version(md: StreamMetadata) -> None:
    await _setup(md, "n", "s", "s2")
    sm = await md.stream("n", "s")
    sm1, (s1,) = await md.commit(sm, put=[_seg(1)])
    before = await _snapshot(md)
    done = dataclasses.replace(s1, state=COMPLETED)
    attempts: list[tuple[StreamMeta, list[Segment], list[Segment]]] = [
        (sm, [done, _seg(2)], []),                          # stale stream record
        (sm, [_seg(2)], []),
        (sm1, [dataclasses.replace(s1, version=s1.version - 1), _seg(2)], []),  # stale seg
        (sm1, [_seg(2), _seg(1)], []),                      # "new" segment 1 exists already
        (sm1, [_seg(3)], [dataclasses.replace(s1, version=1)]),  # stale drop
        (sm1, [], [_seg(7, version=5)]),                    # dropping one that is not there
    ]
    for stale_sm, put, drop in attempts:
        with pytest.raises(MetadataVersionError):
            await md.commit(stale_sm, put=put, drop=drop)
        assert await _snapshot(md) == before, f"a failed commit changed something: {put} {drop}"
    with pytest.raises(MetadataVersionError):
        await md.commit(sm, ended=True)
    with pytest.raises(MetadataVersionError):
        await md.delete_stream(sm)
    assert await _snapshot(md) == before
    # The fresh versions still work.
    sm2, _ = await md.commit(sm1, put=[done, _seg(2)])
    assert sm2.max_seq == 2


async def test_commit_drop_and_ended(md: StreamMetadata) -> None:
    await _setup(md, "n", "s")
    sm = await md.stream("n", "s")
    sm, segs = await md.commit(sm, put=[_seg(1, state=COMPLETED), _seg(2, state=COMPLETED),
                                        _seg(3)])
    sm, _ = await md.commit(sm, drop=segs[:2])
    assert [s.seq for s in await md.segments("n", "s")] == [3]
    assert sm.max_seq == 3 and not sm.ended
    sm, _ = await md.commit(sm, ended=True)
    assert sm.ended and (await md.stream("n", "s")).ended
    sm, _ = await md.commit(sm)  # ended=None keeps it
    assert (await md.stream("n", "s")).ended


async def test_max_seq_and_last_txid_never_decrease() -> None:
    """Random commits (new segments, completions with random last txids, drops), some
    on a stale stream record: the stream's max_seq and last_txid are always the
    highest ever committed, whatever was dropped."""
    store = MemoryMetadataStore("/m")
    md = StreamMetadata(store)
    await _setup(md, "n", "s")
    rng = random.Random(7)
    sm = await md.stream("n", "s")
    live: dict[int, Segment] = {}
    highest = 0
    highest_txid = -1
    for _ in range(300):
        put: list[Segment] = []
        drop: list[Segment] = []
        action = rng.random()
        if action < 0.4:
            put.append(_seg(sm.max_seq + 1))
        elif action < 0.6 and live:
            s = live[rng.choice(sorted(live))]
            put.append(dataclasses.replace(s, state=COMPLETED, last_txid=rng.randrange(1000)))
        elif action < 0.8 and live:
            drop.append(live[rng.choice(sorted(live))])
        stale = rng.random() < 0.2
        use = dataclasses.replace(sm, version=sm.version - 1) if stale else sm
        try:
            new_sm, fresh = await md.commit(use, put=put, drop=drop)
        except MetadataVersionError:
            assert stale
            continue
        assert not stale
        assert new_sm.max_seq >= sm.max_seq and new_sm.last_txid >= sm.last_txid
        sm = new_sm
        highest_txid = max([highest_txid, *(s.last_txid for s in put)])
        assert sm.last_txid == highest_txid == (await md.stream("n", "s")).last_txid
        for s in drop:
            live.pop(s.seq)
        for s in fresh:
            live[s.seq] = s
        highest = max([highest, *(s.seq for s in put)])
        assert sm.max_seq == highest == (await md.stream("n", "s")).max_seq
        assert [s.seq for s in await md.segments("n", "s")] == sorted(live)
    assert highest > 50
    await store.close()


async def test_commit_epoch(md: StreamMetadata) -> None:
    """An opener's claim bumps the epoch; a commit on the record read before it fails
    and changes nothing; commits that do not name an epoch keep it."""
    await _setup(md, "n", "s")
    sm = await md.stream("n", "s")
    assert sm.epoch == 0
    claimed, _ = await md.commit(sm, epoch=sm.epoch + 1)
    assert claimed.epoch == 1 == (await md.stream("n", "s")).epoch
    before = await _snapshot(md)
    with pytest.raises(MetadataVersionError):
        await md.commit(sm, put=[_seg(1)])
    with pytest.raises(MetadataVersionError):
        await md.commit(sm, epoch=sm.epoch + 1)
    assert await _snapshot(md) == before
    sm2, _ = await md.commit(claimed, put=[_seg(1)])
    assert sm2.epoch == 1 and sm2.max_seq == 1


async def test_segments_list_in_order_past_a_page(md: StreamMetadata) -> None:
    await _setup(md, "n", "s")
    sm = await md.stream("n", "s")
    sm, _ = await md.commit(sm, put=[_seg(i) for i in range(1, 1202)])
    assert [s.seq for s in await md.segments("n", "s")] == list(range(1, 1202))
    assert sm.max_seq == 1201


async def test_delete_stream_leaves_streams_sharing_its_prefix(md: StreamMetadata) -> None:
    names = ["a", "ab", "a/b", "a b", "b"]
    await _setup(md, "n", *names)
    await _setup(md, "n2", "a")
    for ns, name in [*(("n", n) for n in names), ("n2", "a")]:
        sm = await md.stream(ns, name)
        await md.commit(sm, put=[_seg(1), _seg(2)])
    await md.delete_stream(await md.stream("n", "a"))
    assert await md.segments("n", "a") == []
    for name in names[1:]:
        assert [s.seq for s in await md.segments("n", name)] == [1, 2], name
    assert [s.seq for s in await md.segments("n2", "a")] == [1, 2]
    assert sorted(await md.list_streams("n")) == sorted(names[1:])


async def test_segment_records_round_trip(md: StreamMetadata) -> None:
    await _setup(md, "n", "s")
    sm = await md.stream("n", "s")
    seg = Segment(seq=4, ledger_id=99, state=COMPLETED, records=12, start_sequence=30,
                  first_txid=3, last_txid=40, last_entry=5, last_slot=2, size_bytes=777,
                  ctime_ms=11, completion_ms=12)
    _, (stored,) = await md.commit(sm, put=[seg])
    (got,) = await md.segments("n", "s")
    assert got == stored == dataclasses.replace(seg, version=stored.version)
    kv = await md.meta.kv_get(keys.segment(md.root, "n", "s", 4))
    assert kv is not None and "version" not in msgpack.unpackb(kv.value)


@given(st.integers(1, 50), st.integers(0, 1000), full_records(), st.integers(0, 13))
def test_a_batch_reads_as_the_records_written(seq: int, entry_id: int, records: list[Any],
                                              first_slot: int) -> None:
    """``batch_records`` (which builds records without the dataclasses' ``__init__``)
    gives the records a plain construction gives: equal, hashable, ordered, frozen."""
    from asyncbk.stream.reader import StreamRecord, batch_records

    batch = codec.decode(_encode_full(0, records))
    got = batch_records("s", seq, entry_id, batch, first_slot, "e")
    want = [StreamRecord("s", Position(seq, entry_id, i), t, d, k, h, ts)
            for i, (t, d, ts, k, h) in enumerate(records) if i >= first_slot]
    assert got == want
    assert [hash(r) for r in got] == [hash(r) for r in want]
    assert [r.position for r in got] == sorted(r.position for r in want)
    for r in got[:1]:
        with pytest.raises(AttributeError):
            r.txid = 1  # type: ignore[misc]
        with pytest.raises(AttributeError):
            r.position.slot = 1  # type: ignore[misc]
