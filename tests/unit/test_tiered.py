"""Tiered storage's pure parts and its reader on an in-memory store: the object
format (round trip and damage found), the offloader's decisions, object-store URIs
and credentials files, and reading an offloaded segment (ranges, tail, retries,
the bookies as fallback)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncbk.errors import (
    ConfigError,
    CorruptObjectError,
    ObjectStoreUnavailableError,
)
from asyncbk.offload.policy import (
    ObjectKey,
    Sweep,
    deletion_due,
    offload_candidates,
    sweep_decision,
)
from asyncbk.stream.meta import COMPLETED, Offload, Segment, StreamConfig
from asyncbk.tiered.format import (
    HEADER,
    TRAILER,
    ObjectBuilder,
    decode_block,
    decode_header,
    decode_index,
    decode_trailer,
)
from asyncbk.tiered.location import Credentials, ObjectStoreUri
from asyncbk.tiered.reader import ObjectSegmentReader
from asyncbk.tiered.store import MemoryObjectStore
from asyncbk.types import LedgerEntry

# --------------------------------------------------------------------------- format


def build(payloads: list[bytes], block_bytes: int, ledger_id: int = 7) -> tuple[bytes, Any]:
    b = ObjectBuilder(ledger_id, 0, block_bytes)
    parts: list[bytes] = []
    for i, p in enumerate(payloads):
        parts += b.add(i, p)
    tail, layout = b.finish()
    return b"".join(parts + tail), layout


def read_all(obj: bytes, layout: Any) -> list[bytes]:
    idx = decode_index(obj[layout.index_offset:layout.index_offset + layout.index_length], "t")
    out: list[bytes] = []
    for blk in range(len(idx.block_firsts)):
        s, e = idx.block_range(blk)
        first, last = idx.block_entries(blk)
        out += decode_block(obj[s:e], "t", first, last)
    return out


@given(st.lists(st.binary(max_size=300), max_size=60), st.integers(1, 2000))
@settings(max_examples=200, deadline=None)
def test_an_object_holds_exactly_the_entries_given(payloads: list[bytes], block_bytes: int) -> None:
    obj, layout = build(payloads, block_bytes)
    assert len(obj) == layout.size and layout.entries == len(payloads)
    assert decode_header(obj[:HEADER.size], "t") == 7
    assert decode_trailer(obj[-TRAILER.size:], "t") == (layout.index_offset,
                                                        layout.index_length, layout.digest)
    assert read_all(obj, layout) == payloads
    idx = decode_index(obj[layout.index_offset:layout.index_offset + layout.index_length], "t")
    for e in range(len(payloads)):  # every entry is found in the block that holds it
        blk = idx.block_of(e)
        first, last = idx.block_entries(blk)
        assert first <= e <= last


@given(st.lists(st.binary(min_size=1, max_size=100), min_size=1, max_size=30),
       st.integers(16, 500), st.data())
@settings(max_examples=200, deadline=None)
def test_any_damaged_byte_of_a_block_or_the_index_is_found(payloads: list[bytes],
                                                          block_bytes: int, data: Any) -> None:
    obj, layout = build(payloads, block_bytes)
    at = data.draw(st.integers(HEADER.size, layout.index_offset + layout.index_length - 1))
    bad = bytearray(obj)
    bad[at] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptObjectError):
        read_all(bytes(bad), layout)


def test_entries_must_come_in_order_and_a_finished_object_takes_no_more() -> None:
    b = ObjectBuilder(1)
    b.add(0, b"a")
    with pytest.raises(ValueError, match="out of order"):
        b.add(2, b"c")
    b.finish()
    with pytest.raises(ValueError):
        b.add(1, b"b")


def test_a_foreign_or_future_object_is_refused_with_a_reason() -> None:
    obj, _ = build([b"x"], 100)
    with pytest.raises(CorruptObjectError, match="not an asyncbk segment object"):
        decode_header(b"PK\x03\x04" + obj[4:HEADER.size], "t")
    future = bytearray(obj[:HEADER.size])
    future[6] = 9
    with pytest.raises(CorruptObjectError, match="upgrade"):
        decode_header(bytes(future), "t")
    with pytest.raises(CorruptObjectError, match="no trailer"):
        decode_trailer(b"\0" * TRAILER.size, "t")


# --------------------------------------------------------------------------- policy


def seg(seq: int, *, completed: bool = True, records: int = 10, size: int = 1000,
        completion_ms: int = 0, offload: Offload | None = None) -> Segment:
    return Segment(seq, 100 + seq, COMPLETED if completed else "open", records=records,
                   size_bytes=size, completion_ms=completion_ms, last_entry=records - 1,
                   offload=offload, version=1)


def off(key: str = "k", offloaded_ms: int = 0, deleted_ms: int = 0) -> Offload:
    return Offload(store="s3://b", key=key, size=1, index_offset=0, index_length=0,
                   digest=0, format=1, last_entry=0, offloaded_ms=offloaded_ms,
                   ledger_deleted_ms=deleted_ms)


def test_segments_are_offloaded_by_age_and_by_bookie_bytes_oldest_first() -> None:
    segs = [seg(1, completion_ms=1000), seg(2, completion_ms=5000),
            seg(3, records=0, completion_ms=0), seg(4, offload=off()), seg(5, completed=False)]
    by_age = StreamConfig(offload_after_s=10)
    assert [s.seq for s in offload_candidates(segs, by_age, 12_000)] == [1]
    assert [s.seq for s in offload_candidates(segs, by_age, 20_000)] == [1, 2]
    assert offload_candidates(segs, StreamConfig(), 10**12) == []  # never, by default
    # 4000 bytes on the bookies alone (1, 2, 3 and the open 5): keep at most 2500
    by_bytes = StreamConfig(offload_after_bytes=2500)
    assert [s.seq for s in offload_candidates(segs, by_bytes, 0)] == [1, 2]


def test_ledgers_leave_the_bookies_only_after_the_lag() -> None:
    segs = [seg(1, offload=off(offloaded_ms=1000)), seg(2, offload=off(offloaded_ms=9000)),
            seg(3, offload=off(offloaded_ms=0, deleted_ms=5)), seg(4)]
    config = StreamConfig(offload_deletion_lag_s=5)
    assert [s.seq for s in deletion_due(segs, config, 6000)] == [1]
    assert [s.seq for s in deletion_due(segs, config, 14_000)] == [1, 2]


def test_object_keys_round_trip_and_say_which_segment() -> None:
    key = ObjectKey("ns", "orders/eu west", 42, 1234, "abcd")
    assert ObjectKey.parse(str(key)) == key
    assert ObjectKey.parse("ns/x/notours.txt") is None
    assert ObjectKey.parse("a/b/c/d.seg") is None


def test_the_sweep_deletes_only_objects_no_segment_names() -> None:
    key = ObjectKey("ns", "s", 5, 105, "n1")
    full = str(key)
    named = [seg(5, offload=off(full))]
    named = [dataclasses.replace(named[0], offload=dataclasses.replace(off(full), store="S"))]
    assert sweep_decision(key, full, "S", named, 10**6, 60) is Sweep.KEEP
    other = [seg(5, offload=dataclasses.replace(off("other"), store="S"))]
    assert sweep_decision(key, full, "S", other, 10, 60) is Sweep.KEEP  # maybe in progress
    assert sweep_decision(key, full, "S", other, 61, 60) is Sweep.DELETE
    assert sweep_decision(key, full, "S", [seg(5)], 10, 60) is Sweep.KEEP
    assert sweep_decision(key, full, "S", [seg(6), seg(7)], 0, 60) is Sweep.DELETE  # dropped
    assert sweep_decision(key, full, "S", None, 0, 60) is Sweep.DELETE  # stream deleted
    assert sweep_decision(key, full, "S", [seg(1)], 10, 60) is Sweep.KEEP


# --------------------------------------------------------------------------- location


def test_object_store_uris_parse_and_print_back() -> None:
    u = ObjectStoreUri.parse("s3://my-bucket/tier/one?endpoint=http://127.0.0.1:8333/")
    assert (u.bucket, u.prefix, u.endpoint, u.region) == ("my-bucket", "tier/one",
                                                          "http://127.0.0.1:8333", "us-east-1")
    assert ObjectStoreUri.parse(str(u)) == u
    assert u.key("a/b") == "tier/one/a/b"
    assert str(ObjectStoreUri.parse("s3://bkt")) == "s3://bkt"


@pytest.mark.parametrize("bad, says", [
    ("http://b/p", "scheme must be s3"), ("s3://AB/p", "bad bucket"),
    ("s3://key:secret@bucket/p", "do not put credentials"),
    ("s3://bucket/p?endpoint=ftp://x", "http:// or https://"),
    ("s3://bucket/p?colour=blue", "unknown parameter"), ("s3://bucket/a//b", "bad prefix"),
])
def test_bad_object_store_uris_say_what_is_wrong(bad: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        ObjectStoreUri.parse(bad)


def test_credentials_come_from_the_environment_or_a_private_file(tmp_path: Path) -> None:
    assert Credentials.from_env({}) is None
    c = Credentials.from_env({"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s3cr3t"})
    assert c is not None and "s3cr3t" not in repr(c)
    ini = tmp_path / "aws"
    ini.write_text("[default]\naws_access_key_id = k1\naws_secret_access_key = v1\n")
    ini.chmod(0o600)
    assert Credentials.from_file(ini) == Credentials("k1", "v1")
    env = tmp_path / "env"
    env.write_text("# made by asyncbk\nexport AWS_ACCESS_KEY_ID=k2\nAWS_SECRET_ACCESS_KEY='v2'\n")
    env.chmod(0o600)
    assert Credentials.from_file(env) == Credentials("k2", "v2")
    env.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        Credentials.from_file(env)
    empty = tmp_path / "empty"
    empty.write_text("nothing=here\n")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match="has no aws_access_key_id"):
        Credentials.from_file(empty)
    with pytest.raises(ConfigError, match="credentials file"):
        Credentials.from_file(tmp_path / "absent")
    assert os.environ.get("AWS_SECRET_ACCESS_KEY") != "v2"


# --------------------------------------------------------------------------- reader


class FakeBookies:
    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads
        self.reads = 0

    async def read(self, first: int, last: int) -> list[LedgerEntry]:
        self.reads += 1
        return [LedgerEntry(9, e, self.payloads[e]) for e in range(first, last + 1)]


async def offloaded(payloads: list[bytes], block_bytes: int = 64
                    ) -> tuple[MemoryObjectStore, Offload]:
    store = MemoryObjectStore()
    obj, layout = build(payloads, block_bytes, ledger_id=9)
    await store.put("k", obj)
    return store, Offload(store=str(store.uri), key="k", size=layout.size,
                          index_offset=layout.index_offset, index_length=layout.index_length,
                          digest=layout.digest, format=1, last_entry=len(payloads) - 1,
                          offloaded_ms=1, ledger_deleted_ms=1)


async def no_sleep(s: float) -> None:
    await asyncio.sleep(0)


async def test_an_offloaded_segment_reads_as_its_ledger() -> None:
    rng = random.Random(5)
    payloads = [rng.randbytes(rng.randrange(1, 40)) for _ in range(200)]
    store, o = await offloaded(payloads)
    r = ObjectSegmentReader(store, o, 9, 199, 0)
    assert r.metadata.is_closed and r.last_add_confirmed == 199
    for lo, hi in ((0, 0), (3, 77), (150, 199), (0, 199)):
        assert [e.data for e in await r.read(lo, hi)] == payloads[lo:hi + 1]
    assert [(e.entry_id, e.data) for e in [x async for x in r.tail(37)]] == \
        list(enumerate(payloads))[37:]
    with pytest.raises(ValueError):
        await r.read(0, 200)
    # One entry: the index (cached by the process) and one block, two GETs at most.
    fresh = ObjectSegmentReader(store, dataclasses.replace(o, key="k"), 9, 199, 0)
    before = store.requests
    await fresh.read(120, 120)
    assert store.requests - before <= 2


async def test_a_store_that_fails_for_a_while_is_retried_then_named_in_the_error() -> None:
    payloads = [b"%d" % i for i in range(50)]
    store, o = await offloaded(payloads)
    store.fail_next = 3
    r = ObjectSegmentReader(store, o, 9, 49, 0, sleep=no_sleep)
    assert [e.data for e in await r.read(10, 20)] == payloads[10:21]
    store.fail_next = 10**9
    r = ObjectSegmentReader(store, dataclasses.replace(o, key="k"), 9, 49, 0, timeout_s=0.2)
    with pytest.raises(ObjectStoreUnavailableError, match="s3://memory/k"):
        await r.read(40, 45)


async def test_while_the_ledger_exists_a_failing_or_damaged_object_falls_back_to_it() -> None:
    payloads = [b"entry-%d" % i for i in range(80)]
    store, o = await offloaded(payloads)
    bookies = FakeBookies(payloads)

    async def open_ledger() -> Any:
        return bookies

    body, mtime = store.objects["k"]
    store.objects["k"] = (body[:40] + bytes([body[40] ^ 0xFF]) + body[41:], mtime)
    o = dataclasses.replace(o, ledger_deleted_ms=0)
    r = ObjectSegmentReader(store, o, 9, 79, 0, fallback=open_ledger, timeout_s=0.2)
    assert [e.data async for e in _entries(r.tail(0))] == payloads
    assert bookies.reads >= 1
    gone = ObjectSegmentReader(store, dataclasses.replace(o, ledger_deleted_ms=5), 9, 79, 0)
    with pytest.raises(CorruptObjectError, match="checksum"):
        await gone.read(0, 79)


async def _entries(it: Any) -> Any:
    async for e in it:
        yield e


async def test_a_sequential_read_is_one_streamed_get_and_survives_a_broken_stream() -> None:
    rng = random.Random(9)
    payloads = [rng.randbytes(rng.randrange(1, 60)) for _ in range(300)]
    store, o = await offloaded(payloads)
    r = ObjectSegmentReader(store, o, 9, 299, 0, sleep=no_sleep)
    await r.index()
    before = store.requests
    assert [e.data async for e in _entries(r.tail(5))] == payloads[5:]
    assert store.requests - before == 1  # one GET for the whole segment
    # The stream breaks after its first pieces: the rest is read block by block.
    store.stream_chunk_bytes = 100
    r = ObjectSegmentReader(store, dataclasses.replace(o, key="k"), 9, 299, 0, sleep=no_sleep)
    got = []
    it = r.tail(0).__aiter__()
    got.append((await it.__anext__()).data)
    store.fail_next = 1
    got += [e.data async for e in _entries(it)]
    assert got == payloads
    assert r.gets > 2  # the streamed GET, then blocks one by one
